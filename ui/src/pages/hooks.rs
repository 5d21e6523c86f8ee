//! An agent's Hooks tab: the hook types with what they report, add a hook (its
//! signing secret shown once), test it, turn it on or off, delete it; each hook's last
//! deliveries with their attempts, and replay.

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use pulse_shared::domain::{
    Agent, DeliveryStatus, Hook, HookAttempt, HookDelivery, HookDeliveryId, HookId, HookTarget,
    HookType, Secret, builtin_tools,
};
use pulse_shared::engine::set_hook_active;
use serde::Deserialize;

use super::agent::View;
use super::agent_of;
use crate::layout::{Tab, agent_page, ago, badge, button, csrf, empty, live_part, short};
use crate::{Dashboard, Problem};

/// Deliveries shown per hook.
const DELIVERIES: usize = 10;

/// What a page shows once, above the hooks: a new secret, or a test's outcome.
enum Notice {
    Secret(HookId, String),
    Attempt(Box<(HookDelivery, HookAttempt)>),
    Failed(String),
}

async fn page(d: &Dashboard, agent: &Agent, notice: Option<Notice>) -> Result<Markup, Problem> {
    let registry =
        d.0.store
            .load_registry()
            .await?
            .with_builtins(builtin_tools());
    let catalogue = HookType::catalogue(registry.tools.iter().map(|t| &t.name));
    let part = cards(d, agent).await?;
    Ok(agent_page(
        agent,
        Tab::Hooks,
        html! {
            @match notice {
                Some(Notice::Secret(id, secret)) => div.secret {
                    p { "Hook " code { (id) } " added. Its signing secret (Standard Webhooks), shown this once: store it now." }
                    pre { (secret) }
                    button.quiet type="button" data-copy=(secret) { "Copy" }
                },
                Some(Notice::Attempt(done)) => div.notice {
                    @let (delivery, a) = &*done;
                    "Test delivery " code { (delivery.id) } ": " (badge(a.status.as_str()))
                    @if let Some(s) = a.http_status { " HTTP " (s) }
                    " in " (a.duration_ms) " ms"
                    @if let Some(e) = &a.error { " — " span.error { (e) } }
                },
                Some(Notice::Failed(why)) => div.notice { span.error { (why) } },
                None => {},
            }
            (part)
            h2 { "Add a hook" }
            form.grid.card method="post" action={"/ui/agents/" (agent.id) "/hooks"} {
                (csrf(d))
                label for="hook_type" { "Type" }
                select #hook_type name="hook_type" {
                    @for (t, when) in &catalogue { option value=(t) { (t) " — " (when) } }
                }
                label for="url" { "URL" }
                input #url name="url" required placeholder="https://example.com/pulse-hook";
                label for="auth_header" { "Authorization header" }
                input #auth_header name="auth_header" type="password" autocomplete="off" placeholder="optional, e.g. Bearer …";
                span {}
                button type="submit" { "Add" }
            }
        },
    ))
}

/// The hooks with their deliveries: the part the live stream refreshes when a delivery
/// changes.
async fn cards(d: &Dashboard, agent: &Agent) -> Result<Markup, Problem> {
    let now = d.0.clock.now();
    let hooks = d.0.store.list_hooks(&agent.id).await?;
    let mut cards = Vec::with_capacity(hooks.len());
    for h in &hooks {
        let deliveries = d.0.store.list_deliveries(&h.id, DELIVERIES).await?;
        cards.push(card(d, agent, h, &deliveries, now));
    }
    let url = format!("/ui/agents/{}/hooks?partial=1", agent.id);
    Ok(live_part(
        "hooks",
        &url,
        "deliveries",
        html! {
            @if hooks.is_empty() {
                (empty("No hooks: add one below to follow this agent from another system, or with", &format!("pulse hooks add --agent {} --type AFTER_HEARTBEAT --url https://…", agent.id)))
            }
            @for c in cards { (c) }
        },
    ))
}

fn card(
    d: &Dashboard,
    agent: &Agent,
    h: &Hook,
    deliveries: &[HookDelivery],
    now: jiff::Timestamp,
) -> Markup {
    let base = format!("/ui/agents/{}/hooks/{}", agent.id, h.id);
    let back = format!("/ui/agents/{}/hooks", agent.id);
    html! {
        div.card id=(h.id) {
            p {
                strong { (h.hook_type) } " → " code { (h.target) } " "
                @if h.active { (badge("active")) } @else { (badge("paused")) " " span.muted { (h.disabled_reason.clone().unwrap_or_default()) } }
            }
            @if let Some(why) = &h.unreadable {
                p.error { "Deliveries are not sent: " (why) ". Restore that key, or run " code { "pulse hooks rotate " (h.id) } "." }
            }
            p.muted {
                "Last fired " (ago(now, deliveries.first().map(|d| d.created_at)))
                @if let Some(since) = h.failing_since { " · failing since " (ago(now, Some(since))) }
                " · retries " (h.retry.to_string())
            }
            p {
                (button(d, &format!("{base}/test"), "Test", "", &back)) " "
                @if h.active { (button(d, &format!("{base}/disable"), "Disable", "quiet", &back)) }
                @else { (button(d, &format!("{base}/enable"), "Enable", "quiet", &back)) }
                " "
                form.inline method="post" action={(base) "/delete"} data-confirm="Delete this hook and its delivery log?" {
                    (csrf(d))
                    button.danger type="submit" { "Delete" }
                }
            }
            @if !deliveries.is_empty() {
                div.scroll { table {
                    thead { tr { th { "Delivery" } th { "Type" } th { "Status" } th { "Attempts" } th { "When" } th { "Last error" } th {} } }
                    tbody { @for del in deliveries { tr {
                        td { code { (del.id) } }
                        td { (del.hook_type) }
                        td { (badge(del.status.as_str())) }
                        td { (del.attempts) }
                        td { (ago(now, Some(del.created_at))) }
                        td.wrap { (del.last_error.as_deref().map(|e| short(e, 100)).unwrap_or_default()) }
                        td { @if matches!(del.status, DeliveryStatus::Exhausted | DeliveryStatus::Cancelled) {
                            (button(d, &format!("{base}/deliveries/{}/replay", del.id), "Replay", "quiet", &back))
                        } }
                    } } }
                } }
            }
        }
    }
}

/// `GET /ui/agents/{id}/hooks[?partial=1]`.
pub(crate) async fn list(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Query(view): Query<View>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    if view.is_partial() {
        return cards(&d, &agent).await;
    }
    page(&d, &agent, None).await
}

#[derive(Deserialize)]
pub(crate) struct AddForm {
    hook_type: String,
    url: String,
    #[serde(default)]
    auth_header: String,
}

/// `POST /ui/agents/{id}/hooks`: the page again, with the new secret shown once.
pub(crate) async fn add(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Form(f): Form<AddForm>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    let invalid = |e: pulse_shared::error::ValidationError| Problem::Invalid(e.to_string());
    let hook_type = HookType::parse(f.hook_type.trim()).map_err(invalid)?;
    let registry =
        d.0.store
            .load_registry()
            .await?
            .with_builtins(builtin_tools());
    if !HookType::catalogue(registry.tools.iter().map(|t| &t.name))
        .iter()
        .any(|(t, _)| *t == hook_type)
    {
        return Err(Problem::Invalid(format!(
            "hook type {hook_type} fires on nothing"
        )));
    }
    let target = HookTarget::parse(f.url.trim()).map_err(invalid)?;
    if matches!(target, HookTarget::EventBridge { .. }) {
        return Err(Problem::Invalid(
            "eventbridge:// targets are added with `pulse hooks add` on the AWS backend".into(),
        ));
    }
    let secret = pulse_signatures::inbound::generate_secret();
    let mut hook = Hook::new(
        agent.id.clone(),
        hook_type,
        target,
        &secret,
        d.0.clock.now(),
    );
    let auth = f.auth_header.trim();
    if !auth.is_empty() {
        if axum::http::HeaderValue::from_str(auth).is_err() {
            return Err(Problem::Invalid(
                "the authorization header does not fit in an HTTP header".into(),
            ));
        }
        hook.auth_header = Some(Secret::new(auth));
    }
    d.0.store.create_hook(&hook).await?;
    page(&d, &agent, Some(Notice::Secret(hook.id.clone(), secret))).await
}

async fn hook_of(d: &Dashboard, agent: &Agent, hook: &str) -> Result<Hook, Problem> {
    let not_found = || Problem::NotFound(format!("hook {hook}"));
    let id = HookId::parse(hook).map_err(|_| not_found())?;
    match d.0.store.get_hook(&id).await? {
        Some(h) if h.agent_id == agent.id => Ok(h),
        _ => Err(not_found()),
    }
}

/// `POST /ui/agents/{id}/hooks/{hook}/test`: one signed test delivery, now.
pub(crate) async fn test(
    State(d): State<Dashboard>,
    Path((id, hook)): Path<(String, String)>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    let hook = hook_of(&d, &agent, &hook).await?;
    let notice = match &d.0.dispatcher {
        None => Notice::Failed(
            "hooks are not configured on this backend (PULSE_HOOKS_QUEUE_URL)".into(),
        ),
        Some(dispatcher) => match dispatcher.send_test(&hook).await {
            Ok(done) => Notice::Attempt(Box::new(done)),
            Err(e) => Notice::Failed(pulse_shared::error::chain(&e)),
        },
    };
    page(&d, &agent, Some(notice)).await
}

/// `POST /ui/agents/{id}/hooks/{hook}/enable` and `/disable`.
pub(crate) async fn switch(
    State(d): State<Dashboard>,
    Path((id, hook, to)): Path<(String, String, String)>,
) -> Result<Response, Problem> {
    let agent = agent_of(&d, &id).await?;
    let hook = hook_of(&d, &agent, &hook).await?;
    let active = match to.as_str() {
        "enable" => true,
        "disable" => false,
        _ => return Err(Problem::NotFound(format!("/{to}"))),
    };
    set_hook_active(d.0.store.as_ref(), &hook.id, active).await?;
    Ok(Redirect::to(&format!("/ui/agents/{}/hooks", agent.id)).into_response())
}

/// `POST /ui/agents/{id}/hooks/{hook}/delete`.
pub(crate) async fn delete(
    State(d): State<Dashboard>,
    Path((id, hook)): Path<(String, String)>,
) -> Result<Redirect, Problem> {
    let agent = agent_of(&d, &id).await?;
    let hook = hook_of(&d, &agent, &hook).await?;
    d.0.store.delete_hook(&hook.id).await?;
    Ok(Redirect::to(&format!("/ui/agents/{}/hooks", agent.id)))
}

/// `POST /ui/agents/{id}/hooks/{hook}/deliveries/{delivery}/replay`.
pub(crate) async fn replay(
    State(d): State<Dashboard>,
    Path((id, hook, delivery)): Path<(String, String, String)>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    hook_of(&d, &agent, &hook).await?;
    let delivery = HookDeliveryId::parse(&delivery)
        .map_err(|_| Problem::NotFound(format!("delivery {delivery}")))?;
    let notice = match &d.0.dispatcher {
        None => Notice::Failed("hooks are not configured on this backend".into()),
        Some(dispatcher) => match dispatcher.replay(&delivery).await {
            Ok(done) => Notice::Attempt(Box::new(done)),
            Err(e) => Notice::Failed(pulse_shared::error::chain(&e)),
        },
    };
    page(&d, &agent, Some(notice)).await
}
