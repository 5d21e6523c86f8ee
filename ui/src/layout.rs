//! The page shell and the small pieces every page uses: times, statuses, forms.

use jiff::{SignedDuration, Timestamp};
use maud::{DOCTYPE, Markup, html};
use pulse_shared::domain::Agent;

use crate::Dashboard;
use crate::assets::{HTMX, SCRIPT, STYLE};

/// The tabs of an agent's page.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tab {
    Heartbeats,
    Events,
    Actions,
    Conversation,
    Memories,
    Tools,
    Hooks,
    Webhooks,
    Settings,
}

impl Tab {
    /// Each tab's path segment and title, in the order the page shows them.
    pub(crate) fn all() -> impl Iterator<Item = (&'static str, &'static str)> {
        Self::ALL.iter().map(|(_, path, title)| (*path, *title))
    }

    const ALL: [(Tab, &'static str, &'static str); 9] = [
        (Tab::Heartbeats, "heartbeats", "Heartbeats"),
        (Tab::Events, "events", "Events"),
        (Tab::Actions, "actions", "Actions"),
        (Tab::Conversation, "chat", "Chat"),
        (Tab::Memories, "memories", "Memories"),
        (Tab::Tools, "tools", "Tools"),
        (Tab::Hooks, "hooks", "Hooks"),
        (Tab::Webhooks, "webhooks", "Webhooks"),
        (Tab::Settings, "settings", "Settings"),
    ];
}

/// A whole page. `live` is the server-sent events URL the page listens to.
pub(crate) fn page(title: &str, live: Option<&str>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="htmx-config" content=r#"{"includeIndicatorStyles": false, "allowEval": false}"#;
                title { (title) " · Pulse" }
                link rel="stylesheet" href=(STYLE.path);
                script src=(HTMX.path) defer {}
                script src=(SCRIPT.path) defer {}
            }
            body data-live=[live] {
                header {
                    a href="/ui/" { "Pulse" } span.muted { "agents" }
                    @let caller = crate::security::caller();
                    // How many calls wait for a decision: for a caller let in only (a
                    // login page has no CSRF token yet).
                    @if !caller.csrf.is_empty() {
                        span #approvals-count hx-get="/ui/approvals/count" hx-trigger="load, every 30s" {}
                    }
                    @if caller.session {
                        form.inline.logout method="post" action="/ui/logout" {
                            input type="hidden" name="csrf" value=(caller.csrf);
                            button.quiet type="submit" { "Sign out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// An agent's page: its name, status and tabs around `body`.
pub(crate) fn agent_page(agent: &Agent, tab: Tab, body: Markup) -> Markup {
    // The Hooks tab shows deliveries: its stream watches them too.
    let watch = if tab == Tab::Hooks {
        "?deliveries=1"
    } else {
        ""
    };
    let live = format!("/ui/agents/{}/live{watch}", agent.id);
    page(
        &agent.name,
        Some(&live),
        html! {
            h1 {
                a href="/ui/" { "Agents" } " / " (agent.name) " "
                span class={"status " (agent.state().as_str())} { (agent.state().as_str()) }
            }
            nav.tabs {
                @for (t, path, label) in Tab::ALL {
                    a class=[(t == tab).then_some("on")] href={"/ui/agents/" (agent.id) "/" (path)} { (label) }
                }
            }
            (body)
        },
    )
}

/// A time as "3m ago" / "in 5m", with the absolute time on hover.
pub(crate) fn ago(now: Timestamp, t: Option<Timestamp>) -> Markup {
    let Some(t) = t else {
        return html! { span.muted { "–" } };
    };
    let d = now.duration_since(t);
    let text = if d.is_negative() {
        format!("in {}", span(-d))
    } else if d < SignedDuration::from_secs(2) {
        "just now".to_owned()
    } else {
        format!("{} ago", span(d))
    };
    html! { time datetime=(t.to_string()) title=(t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string()) { (text) } }
}

fn span(d: SignedDuration) -> String {
    let s = d.as_secs();
    match s {
        ..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// A trace's id, as a link to the tracing UI when one is set (`PULSE_TRACE_URL`).
pub(crate) fn trace_link(url: Option<&str>, id: &str) -> Markup {
    html! {
        @match url {
            Some(template) => a.trace href=(pulse_shared::traces::link(template, id)) target="_blank" rel="noopener" { "trace " code { (id) } },
            None => { "trace " code { (id) } },
        }
    }
}

/// A status word, coloured by its class.
pub(crate) fn badge(s: &str) -> Markup {
    html! { span class={"status " (s)} { (s) } }
}

/// The hidden CSRF field every form carries: the caller's token.
pub(crate) fn csrf(_d: &Dashboard) -> Markup {
    html! { input type="hidden" name="csrf" value=(crate::security::caller().csrf); }
}

/// A one-button form posting to `action`, coming back to `back` (a `/ui/` path).
pub(crate) fn button(d: &Dashboard, action: &str, label: &str, class: &str, back: &str) -> Markup {
    html! {
        form.inline method="post" action=(action) {
            (csrf(d))
            input type="hidden" name="back" value=(back);
            button class=(class) type="submit" { (label) }
        }
    }
}

/// Where a form comes back to: its `back` field if it is a dashboard path, else `default`.
pub(crate) fn back_to(back: Option<&str>, default: &str) -> String {
    match back {
        // A path of this site only, of visible characters: no `//host`, no backslash,
        // no CR/LF to split the Location header.
        Some(b)
            if b.starts_with("/ui/")
                && !b.contains("//")
                && b.bytes().all(|c| c.is_ascii_graphic() && c != b'\\') =>
        {
            b.to_owned()
        }
        _ => default.to_owned(),
    }
}

/// A part of a page fetched again from `url` when the live stream says `kind` changed.
pub(crate) fn live_part(id: &str, url: &str, kind: &str, body: Markup) -> Markup {
    html! {
        div id=(id) hx-get=(url) hx-trigger={"live-" (kind) " from:body"} hx-swap="outerHTML" {
            (body)
        }
    }
}

/// What to do when a list is empty.
pub(crate) fn empty(text: &str, command: &str) -> Markup {
    html! { div.empty { (text) " " code { (command) } } }
}

/// A short line of text.
pub(crate) fn short(s: &str, n: usize) -> String {
    let one = s.replace('\n', " ");
    if one.chars().count() <= n {
        one
    } else {
        one.chars().take(n.saturating_sub(1)).collect::<String>() + "…"
    }
}
