//! The few WebDriver commands the browser test sends, as plain JSON over HTTP to
//! chromedriver on loopback (the W3C WebDriver protocol: a session, then one request per
//! command). A client crate would bring its own copies of half the dependency tree with
//! other features, and the suite would compile most of it twice; this is all the test
//! needs.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

/// The key under which WebDriver names an element in its answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How an element is found.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Locator<'a> {
    Css(&'a str),
    LinkText(&'a str),
    XPath(&'a str),
}

impl Locator<'_> {
    fn body(self) -> Value {
        let (using, value) = match self {
            Self::Css(s) => ("css selector", s),
            Self::LinkText(s) => ("link text", s),
            Self::XPath(s) => ("xpath", s),
        };
        json!({"using": using, "value": value})
    }
}

/// A command the browser refused: WebDriver's error code and message.
#[derive(Debug)]
pub(crate) struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

type Result<T> = std::result::Result<T, Refused>;

/// One browser session.
#[derive(Clone)]
pub(crate) struct Client {
    http: reqwest::Client,
    /// `http://127.0.0.1:PORT/session/ID`.
    session: String,
}

/// An element of the current page.
pub(crate) struct Element {
    client: Client,
    id: String,
}

impl Client {
    /// Opens a session on the driver at `driver` with `capabilities`.
    pub(crate) async fn connect(driver: &str, capabilities: Value) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| Refused(e.to_string()))?;
        let body = json!({"capabilities": {"alwaysMatch": capabilities}});
        let value = send(http.post(format!("{driver}/session")).json(&body)).await?;
        let id = value["sessionId"]
            .as_str()
            .ok_or_else(|| Refused(format!("no session id in {value}")))?;
        Ok(Self {
            session: format!("{driver}/session/{id}"),
            http,
        })
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value> {
        send(
            self.http
                .post(format!("{}{path}", self.session))
                .json(&body),
        )
        .await
    }

    async fn get(&self, path: &str) -> Result<Value> {
        send(self.http.get(format!("{}{path}", self.session))).await
    }

    pub(crate) async fn goto(&self, url: &str) -> Result<()> {
        self.post("/url", json!({"url": url})).await.map(drop)
    }

    pub(crate) async fn current_url(&self) -> Result<url::Url> {
        let v = self.get("/url").await?;
        url::Url::parse(v.as_str().unwrap_or_default()).map_err(|e| Refused(e.to_string()))
    }

    /// The page's HTML as the browser has it now.
    pub(crate) async fn source(&self) -> Result<String> {
        Ok(self
            .get("/source")
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    pub(crate) async fn find(&self, at: Locator<'_>) -> Result<Element> {
        let v = self.post("/element", at.body()).await?;
        self.element(&v)
    }

    pub(crate) async fn find_all(&self, at: Locator<'_>) -> Result<Vec<Element>> {
        let v = self.post("/elements", at.body()).await?;
        v.as_array()
            .map(|all| all.iter().map(|e| self.element(e)).collect())
            .unwrap_or_else(|| Ok(Vec::new()))
    }

    fn element(&self, v: &Value) -> Result<Element> {
        let id = v[ELEMENT]
            .as_str()
            .ok_or_else(|| Refused(format!("not an element: {v}")))?;
        Ok(Element {
            client: self.clone(),
            id: id.to_owned(),
        })
    }

    /// Runs `script` in the page; its return value.
    pub(crate) async fn execute(&self, script: &str, args: Vec<Value>) -> Result<Value> {
        self.post("/execute/sync", json!({"script": script, "args": args}))
            .await
    }

    /// The visible part of the page, as PNG bytes.
    pub(crate) async fn screenshot(&self) -> Result<Vec<u8>> {
        let v = self.get("/screenshot").await?;
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .map_err(|e| Refused(format!("the screenshot: {e}")))
    }

    /// Accepts the open `confirm()` or `alert()` dialog.
    pub(crate) async fn accept_alert(&self) -> Result<()> {
        self.post("/alert/accept", json!({})).await.map(drop)
    }

    /// Resizes the window (CSS pixels).
    pub(crate) async fn set_window_size(&self, width: u32, height: u32) -> Result<()> {
        self.post("/window/rect", json!({"width": width, "height": height}))
            .await
            .map(drop)
    }

    pub(crate) async fn delete_all_cookies(&self) -> Result<()> {
        send(self.http.delete(format!("{}/cookie", self.session)))
            .await
            .map(drop)
    }

    /// Ends the session (the browser closes).
    pub(crate) async fn close(&self) -> Result<()> {
        send(self.http.delete(&self.session)).await.map(drop)
    }
}

impl Element {
    fn path(&self, command: &str) -> String {
        format!("/element/{}/{command}", self.id)
    }

    pub(crate) async fn click(&self) -> Result<()> {
        self.client
            .post(&self.path("click"), json!({}))
            .await
            .map(drop)
    }

    pub(crate) async fn clear(&self) -> Result<()> {
        self.client
            .post(&self.path("clear"), json!({}))
            .await
            .map(drop)
    }

    pub(crate) async fn send_keys(&self, text: &str) -> Result<()> {
        self.client
            .post(&self.path("value"), json!({"text": text}))
            .await
            .map(drop)
    }

    pub(crate) async fn text(&self) -> Result<String> {
        let v = self.client.get(&self.path("text")).await?;
        Ok(v.as_str().unwrap_or_default().to_owned())
    }
}

/// Sends a command; its answer's `value`, or the error WebDriver gave.
async fn send(request: reqwest::RequestBuilder) -> Result<Value> {
    let answer = request.send().await.map_err(|e| Refused(e.to_string()))?;
    let status = answer.status();
    let mut body: Value = answer
        .json()
        .await
        .map_err(|e| Refused(format!("{status}: {e}")))?;
    let value = body["value"].take();
    if status.is_success() {
        Ok(value)
    } else {
        Err(Refused(format!(
            "{status} {}: {}",
            value["error"].as_str().unwrap_or("error"),
            value["message"].as_str().unwrap_or_default()
        )))
    }
}
