//! A fake Discord gateway on loopback: a WebSocket server speaking v10 JSON as Discord
//! does — HELLO; IDENTIFY answered with READY (a session id and `resume_gateway_url`);
//! heartbeats answered with ACK; dispatches numbered by a sequence kept per session;
//! RESUME answered by replaying what came after the client's sequence, then RESUMED
//! (INVALID_SESSION for an unknown session); and, on demand, a dropped connection,
//! RECONNECT, INVALID_SESSION or a close code.
//!
//! Dispatches sent while no client is connected are kept for the resume, as Discord
//! keeps them. [`FakeGateway::replay_from_before`] makes a resume replay dispatches the
//! client had already seen (what happens when a client crashed after reading a message
//! but before it could save its resume point).

use std::sync::{Arc, Mutex};

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_websockets::{CloseCode, Message, ServerBuilder};

/// The bot's own user id in READY.
pub const BOT_ID: &str = "1100000000000000001";

/// What the test asks of the live connection.
enum Ctl {
    Send(Value),
    Drop,
    Close(u16),
}

#[derive(Default)]
struct State {
    /// The session's dispatches, with their sequence numbers.
    log: Vec<(u64, Value)>,
    session: Option<String>,
    identifies: u32,
    resumes: Vec<u64>,
    connections: u32,
    live: Option<mpsc::UnboundedSender<Ctl>>,
    /// How many already-seen dispatches the next resume replays.
    overlap: u64,
    /// A close code every new connection gets right after HELLO.
    refuse_with: Option<u16>,
}

/// The fake gateway.
#[derive(Clone)]
pub struct FakeGateway {
    url: String,
    state: Arc<Mutex<State>>,
}

impl FakeGateway {
    /// Starts the server on a free loopback port.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let fake = Self {
            url: url.clone(),
            state: state.clone(),
        };
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (state, url) = (state.clone(), url.clone());
                tokio::spawn(async move {
                    if let Ok((_, ws)) = ServerBuilder::new().accept(tcp).await {
                        connection(ws, state, url).await;
                    }
                });
            }
        });
        fake
    }

    /// The URL for `DISCORD_GATEWAY_URL`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Sends a dispatch (`t`, `d`) with the session's next sequence number, or keeps it
    /// for the resume when no client is connected.
    pub fn dispatch(&self, t: &str, d: Value) {
        let mut s = self.state.lock().unwrap();
        let seq = s.log.last().map_or(1, |(n, _)| n + 1);
        let payload = json!({"op": 0, "t": t, "s": seq, "d": d});
        s.log.push((seq, payload.clone()));
        if let Some(live) = &s.live {
            let _ = live.send(Ctl::Send(payload));
        }
    }

    /// Drops the connection without a close frame, as a network failure does.
    pub fn drop_connection(&self) {
        let mut s = self.state.lock().unwrap();
        if let Some(live) = s.live.take() {
            let _ = live.send(Ctl::Drop);
        }
    }

    /// Sends RECONNECT (op 7): the client should resume on a new connection.
    pub fn reconnect(&self) {
        self.op(json!({"op": 7, "d": null}));
    }

    /// Sends INVALID_SESSION (op 9) with `resumable`.
    pub fn invalid_session(&self, resumable: bool) {
        if !resumable {
            self.state.lock().unwrap().session = None;
        }
        self.op(json!({"op": 9, "d": resumable}));
    }

    /// Closes every connection from now on with `code` right after HELLO (4004: the
    /// token is refused).
    pub fn refuse_with(&self, code: u16) {
        let mut s = self.state.lock().unwrap();
        s.refuse_with = Some(code);
        if let Some(live) = s.live.take() {
            let _ = live.send(Ctl::Close(code));
        }
    }

    /// The next resume replays the last `n` dispatches the client had seen as well.
    pub fn replay_from_before(&self, n: u64) {
        self.state.lock().unwrap().overlap = n;
    }

    /// IDENTIFYs received.
    pub fn identifies(&self) -> u32 {
        self.state.lock().unwrap().identifies
    }

    /// The sequence numbers RESUMEs carried, in order.
    pub fn resumes(&self) -> Vec<u64> {
        self.state.lock().unwrap().resumes.clone()
    }

    /// Connections opened.
    pub fn connections(&self) -> u32 {
        self.state.lock().unwrap().connections
    }

    /// Whether a client is connected and identified or resumed.
    pub fn is_live(&self) -> bool {
        self.state.lock().unwrap().live.is_some()
    }

    fn op(&self, payload: Value) {
        let s = self.state.lock().unwrap();
        if let Some(live) = &s.live {
            let _ = live.send(Ctl::Send(payload));
        }
    }
}

type Ws = tokio_websockets::WebSocketStream<tokio::net::TcpStream>;

async fn send(ws: &mut Ws, v: &Value) -> bool {
    ws.send(Message::text(v.to_string())).await.is_ok()
}

/// One client connection: HELLO, its IDENTIFY or RESUME, then heartbeats and whatever
/// the test asks for.
async fn connection(mut ws: Ws, state: Arc<Mutex<State>>, url: String) {
    let refuse = {
        let mut s = state.lock().unwrap();
        s.connections += 1;
        s.refuse_with
    };
    if !send(
        &mut ws,
        &json!({"op": 10, "d": {"heartbeat_interval": 41_250}}),
    )
    .await
    {
        return;
    }
    if let Some(code) = refuse {
        let code = CloseCode::try_from(code).unwrap_or(CloseCode::POLICY_VIOLATION);
        let _ = ws.send(Message::close(Some(code), "refused")).await;
        return;
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    loop {
        tokio::select! {
            ctl = rx.recv() => match ctl {
                Some(Ctl::Send(v)) => {
                    if !send(&mut ws, &v).await {
                        return;
                    }
                }
                Some(Ctl::Close(code)) => {
                    let code = CloseCode::try_from(code).unwrap_or(CloseCode::POLICY_VIOLATION);
                    let _ = ws.send(Message::close(Some(code), "closed")).await;
                    return;
                }
                // Gone without a word, as a dropped network is.
                Some(Ctl::Drop) | None => return,
            },
            msg = ws.next() => {
                let Some(Ok(msg)) = msg else {
                    clear_live(&state, &tx);
                    return;
                };
                let Some(text) = msg.as_text() else { continue };
                let Ok(v) = serde_json::from_str::<Value>(text) else { continue };
                for out in answer(&v, &state, &url, &tx) {
                    if !send(&mut ws, &out).await {
                        return;
                    }
                }
            }
        }
    }
}

fn clear_live(state: &Mutex<State>, tx: &mpsc::UnboundedSender<Ctl>) {
    let mut s = state.lock().unwrap();
    if s.live.as_ref().is_some_and(|l| l.same_channel(tx)) {
        s.live = None;
    }
}

/// What the gateway answers to one client payload.
fn answer(
    v: &Value,
    state: &Mutex<State>,
    url: &str,
    tx: &mpsc::UnboundedSender<Ctl>,
) -> Vec<Value> {
    let mut s = state.lock().unwrap();
    match v["op"].as_u64() {
        // Heartbeat → ACK.
        Some(1) => vec![json!({"op": 11, "d": null})],
        // IDENTIFY → READY with a new session.
        Some(2) => {
            s.identifies += 1;
            let session = format!("session-{}", s.identifies);
            s.session = Some(session.clone());
            s.log.clear();
            let seq = 1;
            let ready = json!({"op": 0, "t": "READY", "s": seq, "d": {
                "v": 10,
                "user": {"id": BOT_ID, "username": "pulse", "discriminator": "0", "global_name": null,
                         "avatar": null, "bot": true, "mfa_enabled": false, "verified": true, "flags": 0},
                "guilds": [],
                "session_id": session,
                "resume_gateway_url": url,
                "application": {"id": "1200000000000000000", "flags": 0},
            }});
            s.log.push((seq, ready.clone()));
            s.live = Some(tx.clone());
            vec![ready]
        }
        // RESUME → what came after the client's sequence, then RESUMED.
        Some(6) => {
            let seq = v["d"]["seq"].as_u64().unwrap_or(0);
            s.resumes.push(seq);
            if s.session.as_deref() != v["d"]["session_id"].as_str() {
                return vec![json!({"op": 9, "d": false})];
            }
            let from = seq.saturating_sub(std::mem::take(&mut s.overlap));
            let mut out: Vec<Value> = s
                .log
                .iter()
                .filter(|(n, p)| *n > from && p["t"] != "READY")
                .map(|(_, p)| p.clone())
                .collect();
            let next = s.log.last().map_or(1, |(n, _)| n + 1);
            let resumed = json!({"op": 0, "t": "RESUMED", "s": next, "d": {}});
            s.log.push((next, resumed.clone()));
            out.push(resumed);
            s.live = Some(tx.clone());
            out
        }
        _ => Vec::new(),
    }
}

/// A `MESSAGE_CREATE` payload as Discord sends it: `id` and `channel` are snowflakes,
/// `guild` is `None` for a direct message.
pub fn message(id: &str, channel: &str, guild: Option<&str>, author: &str, content: &str) -> Value {
    let mut m = json!({
        "id": id,
        "channel_id": channel,
        "type": 0,
        "flags": 0,
        "timestamp": "2026-11-26T10:00:00.000000+00:00",
        "edited_timestamp": null,
        "pinned": false,
        "tts": false,
        "mention_everyone": false,
        "mentions": [],
        "mention_roles": [],
        "attachments": [],
        "embeds": [],
        "content": content,
        "author": {"id": author, "username": format!("user{author}"), "discriminator": "0",
                   "global_name": format!("User {author}"), "avatar": null, "public_flags": 0},
    });
    if let Some(g) = guild {
        m["guild_id"] = json!(g);
    }
    m
}

/// A snowflake minted now (Discord's epoch), distinct per `n`.
pub fn snowflake(n: u64) -> String {
    let ms = jiff::Timestamp::now().as_millisecond() as u64 - 1_420_070_400_000;
    ((ms << 22) | (n & 0x3f_ffff)).to_string()
}
