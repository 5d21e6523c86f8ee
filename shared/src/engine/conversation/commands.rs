//! Steering commands said in the conversation, on any channel: `/heartbeat` (or
//! `/wake`), `/pause`, `/resume`, `/snooze 2h`, `/quiet 22:00-07:00` (or `/quiet off`).
//!
//! They are run by the worker, like every message, in the session's order, and answered
//! with a line saying what was done, without a model call. Only the agent's owner may
//! steer it: whoever reaches it through the CLI, the dashboard or an API token of the
//! agent, or a Discord or Telegram user the agent lets in (`--discord-users`,
//! `--telegram-users`). Anyone else's command
//! is answered with why not, and changes nothing.

use jiff::SignedDuration;

use crate::domain::{ActiveHours, Agent, AgentChanges, Signal, SignalKind, parse_duration};
use crate::engine::lifecycle::{Lifecycle, LifecycleError, Toggled};
use crate::engine::steering::Woken;

/// A steering command.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Command {
    Wake,
    Pause,
    Resume,
    Snooze(SignedDuration),
    /// Quiet hours: the active hours become the rest of the day; `None` clears them.
    Quiet(Option<ActiveHours>),
}

/// The command `signal` gives, if it is one: `Err` says what was wrong with it.
/// Whether `signal` is the user speaking: a message that is not a steering command
/// (see [`parse`]; anyone's, well formed or not, refused or not: it is answered
/// without the model). The one rule for what counts as an interaction — at intake (the
/// cancel mark a running heartbeat reads), when a turn wakes an auto-paused agent, and
/// when its end starts the quiet period.
pub(crate) fn is_interaction(signal: &Signal) -> bool {
    signal.kind == SignalKind::Message && parse(signal).is_none()
}

pub(super) fn parse(signal: &Signal) -> Option<Result<Command, String>> {
    if signal.kind != SignalKind::Message {
        return None;
    }
    let text = signal.text();
    let text = text.trim();
    let (word, arg) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    let arg = arg.trim();
    Some(match word {
        "/heartbeat" | "/wake" => Ok(Command::Wake),
        "/pause" => Ok(Command::Pause),
        "/resume" => Ok(Command::Resume),
        "/snooze" => parse_duration("snooze", arg)
            .map(Command::Snooze)
            .map_err(|_| "say how long, e.g. `/snooze 2h` (a minute to 30 days)".to_owned()),
        "/quiet" if arg.eq_ignore_ascii_case("off") => Ok(Command::Quiet(None)),
        "/quiet" => quiet(arg).map(|h| Command::Quiet(Some(h))).ok_or_else(|| {
            "say when to be quiet, e.g. `/quiet 22:00-07:00`, or `/quiet off`".to_owned()
        }),
        _ => return None,
    })
}

/// `22:00-07:00` quiet is `07:00-22:00` active.
fn quiet(arg: &str) -> Option<ActiveHours> {
    let (from, to) = arg.split_once('-')?;
    format!("{}-{}", to.trim(), from.trim()).parse().ok()
}

/// Whether the signal's sender owns the agent: on a chat platform (Discord, Telegram),
/// a user the agent lets in there; anywhere else (the CLI, the dashboard, the API), its
/// owner.
pub(super) fn owner(agent: &Agent, signal: &Signal) -> bool {
    match signal
        .meta
        .source
        .as_deref()
        .and_then(crate::domain::ChannelKind::from_source)
    {
        Some(channel) => signal
            .meta
            .user_id
            .as_ref()
            .is_some_and(|u| agent.lets_in(channel, u)),
        None => true,
    }
}

/// Runs `command` on `agent`: the line that answers it.
pub(super) async fn run(lifecycle: &Lifecycle, agent: &Agent, command: Command) -> String {
    let when = |t: jiff::Timestamp| {
        let zoned = t.to_zoned(agent.timezone.zone());
        zoned.strftime("%Y-%m-%d %H:%M %Z").to_string()
    };
    let done = match command {
        Command::Wake => lifecycle.wake(&agent.id).await.map(|w| match w {
            Woken::Due(_) => "Waking up now: a heartbeat is starting.".to_owned(),
            Woken::AlreadyDue(_) => "A heartbeat is due already; it starts in a moment.".to_owned(),
            Woken::Running => "I'm in the middle of a heartbeat right now.".to_owned(),
        }),
        Command::Pause => lifecycle.pause(&agent.id).await.map(|t| match t {
            Toggled::Already => "I'm paused already; /resume wakes me.".to_owned(),
            Toggled::Done { .. } => {
                "Paused: no heartbeats until you say /resume. I still answer you.".to_owned()
            }
        }),
        Command::Resume => lifecycle.resume(&agent.id).await.map(|t| match t {
            Toggled::Already => "I'm not paused or snoozed.".to_owned(),
            Toggled::Done {
                next_heartbeat_at, ..
            } => format!(
                "Resumed: next heartbeat {}.",
                next_heartbeat_at.map_or("soon".to_owned(), when)
            ),
        }),
        Command::Snooze(d) => lifecycle
            .snooze(&agent.id, d)
            .await
            .map(|until| format!("Snoozed until {}; /resume wakes me sooner.", when(until))),
        Command::Quiet(hours) => {
            let changes = AgentChanges {
                active_hours: Some(hours),
                ..AgentChanges::default()
            };
            lifecycle
                .update(&agent.id, &changes)
                .await
                .map(|_| match hours {
                    Some(h) => format!("Quiet hours set: I'll only beat {h} ({}).", agent.timezone),
                    None => "Quiet hours cleared: I beat around the clock.".to_owned(),
                })
        }
    };
    done.unwrap_or_else(|e| match e {
        LifecycleError::Invalid(v) => format!("Not done: {}.", v.message),
        other => format!("Not done: {other}. Try again in a moment."),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AgentId, SessionId, SignalMeta};

    fn say(text: &str) -> Signal {
        let a = AgentId::generate();
        Signal::user_message(
            &a,
            &SessionId::for_agent(&a),
            text,
            SignalMeta::default(),
            jiff::Timestamp::UNIX_EPOCH,
        )
        .unwrap()
    }

    #[test]
    fn commands_are_read_and_other_slashes_are_messages() {
        assert_eq!(parse(&say("/heartbeat")), Some(Ok(Command::Wake)));
        assert_eq!(parse(&say("  /pause ")), Some(Ok(Command::Pause)));
        assert_eq!(
            parse(&say("/snooze 2h")),
            Some(Ok(Command::Snooze(SignedDuration::from_hours(2))))
        );
        assert!(matches!(parse(&say("/snooze soon")), Some(Err(e)) if e.contains("/snooze 2h")));
        let Some(Ok(Command::Quiet(Some(h)))) = parse(&say("/quiet 22:00-07:00")) else {
            panic!()
        };
        assert_eq!(h.to_string(), "07:00-22:00");
        assert_eq!(parse(&say("/quiet off")), Some(Ok(Command::Quiet(None))));
        assert!(matches!(parse(&say("/quiet later")), Some(Err(_))));
        assert_eq!(parse(&say("/shrug")), None);
        assert_eq!(parse(&say("pause please")), None);
    }
}
