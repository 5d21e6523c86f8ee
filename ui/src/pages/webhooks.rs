//! An agent's Webhooks tab: each endpoint's URL with a copy button, its signing
//! secret rotated with the new one shown once, its allowed types, rate limit and wake
//! editable, and its recent requests with their outcome and reason.

use axum::Form;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use axum::response::Redirect;
use jiff::SignedDuration;
use maud::{Markup, html};
use pulse_shared::domain::{Agent, EventType, RateLimit, Webhook, WebhookId, WebhookScheme};
use serde::Deserialize;

use super::agent_of;
use crate::layout::{Tab, agent_page, ago, badge, csrf, empty, short};
use crate::{Dashboard, Problem};

/// Requests shown per webhook.
const REQUESTS: usize = 20;
/// How long a rotated-out secret keeps working.
const GRACE: SignedDuration = SignedDuration::from_hours(24);

/// Where the receiver is, as the browser reached this page: the same listener under
/// `pulse serve`.
fn origin(headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1:8080");
    format!("http://{host}")
}

async fn page(
    d: &Dashboard,
    agent: &Agent,
    origin: &str,
    secret: Option<(WebhookId, String)>,
) -> Result<Markup, Problem> {
    let now = d.0.clock.now();
    let webhooks: Vec<Webhook> =
        d.0.store
            .list_webhooks()
            .await?
            .into_iter()
            .filter(|w| w.agent_id == agent.id)
            .collect();
    let mut cards = Vec::with_capacity(webhooks.len());
    for w in &webhooks {
        let requests = d.0.store.list_requests(&w.id, REQUESTS).await?;
        let base = format!("/ui/agents/{}/webhooks/{}", agent.id, w.id);
        let url = format!("{origin}/webhooks/{}", w.id);
        let s = w.summary(now);
        cards.push(html! {
            div.card id=(w.id) {
                p { strong { code { (url) } } " " button.quiet type="button" data-copy=(url) { "Copy" } " "
                    @if w.active { (badge("active")) } @else { (badge("paused")) } }
                p.muted { (s.scheme) " signatures · " (s.secrets) " valid secret(s)"
                    @if let Some(t) = s.old_secret_retires_at { " (the old one until " (ago(now, Some(t))) ")" } }
                @if let Some(why) = &w.unreadable {
                    p.error { "Requests are answered 503: " (why) ". Restore that key, or rotate the secret and give the sender the new one." }
                }
                form.grid method="post" action={(base) "/update"} {
                    (csrf(d))
                    label { "Allowed types" }
                    input name="allow" placeholder="any" value=(s.allowed_types.iter().map(EventType::as_str).collect::<Vec<_>>().join(","));
                    label { "Rate limit" }
                    input name="rate_limit" value=(s.rate_limit.clone().unwrap_or_else(|| "none".into()));
                    label { "Wake the conversation" }
                    select name="wake" { option value="no" selected[!s.wake] { "no" } option value="yes" selected[s.wake] { "yes" } }
                    span {}
                    button.quiet type="submit" { "Save" }
                }
                p {
                    form.inline method="post" action={(base) "/rotate"}
                        data-confirm="Add a new secret? The current one keeps working for 24 hours." {
                        (csrf(d)) button.quiet type="submit" { "Rotate secret" }
                    }
                    " "
                    form.inline method="post" action={(base) "/delete"}
                        data-confirm="Delete this webhook? Its URL will answer 404." {
                        (csrf(d)) button.danger type="submit" { "Delete" }
                    }
                }
                @if requests.is_empty() { p.muted { "No requests yet." } }
                @else { div.scroll { table {
                    thead { tr { th { "Received" } th { "Status" } th { "HTTP" } th { "Type" } th { "Reason" } } }
                    tbody { @for r in &requests { tr {
                        td { (ago(now, Some(r.received_at))) }
                        td { (badge(r.status.as_str())) @if let Some(n) = r.count { " ×" (n) } }
                        td { (r.http_status) }
                        td { (r.event_type.clone().unwrap_or_default()) }
                        td.wrap { (short(r.reason.as_deref().unwrap_or_default(), 120)) }
                    } } }
                } } }
            }
        });
    }
    Ok(agent_page(
        agent,
        Tab::Webhooks,
        html! {
            @if let Some((id, secret)) = secret {
                div.secret {
                    p { "The signing secret of " code { (id) } ", shown this once: give it to the sender now." }
                    pre { (secret) }
                    button.quiet type="button" data-copy=(secret) { "Copy" }
                }
            }
            @if webhooks.is_empty() {
                (empty("No webhooks: create one below for another system to send this agent events, or with", &format!("pulse webhooks create --agent {}", agent.id)))
            }
            @for c in cards { (c) }
            h2 { "Create a webhook" }
            form.grid.card method="post" action={"/ui/agents/" (agent.id) "/webhooks"} {
                (csrf(d))
                label for="scheme" { "Signatures" }
                select #scheme name="scheme" { @for s in WebhookScheme::ALL { option value=(s.as_str()) { (s.as_str()) } } }
                label for="allow" { "Allowed types" }
                input #allow name="allow" placeholder="any (or NOTE,ISSUE)";
                span {}
                button type="submit" { "Create" }
            }
        },
    ))
}

/// `GET /ui/agents/{id}/webhooks`.
pub(crate) async fn list(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    page(&d, &agent, &origin(&headers), None).await
}

fn allowed(s: &str) -> Result<Vec<EventType>, Problem> {
    Webhook::parse_allowed(s.split(',')).map_err(|e| Problem::Invalid(e.to_string()))
}

#[derive(Deserialize)]
pub(crate) struct CreateForm {
    scheme: String,
    #[serde(default)]
    allow: String,
}

/// `POST /ui/agents/{id}/webhooks`: the page again, with the new secret shown once.
pub(crate) async fn create(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(f): Form<CreateForm>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    let scheme = WebhookScheme::parse(&f.scheme).map_err(|e| Problem::Invalid(e.to_string()))?;
    let secret = pulse_signatures::inbound::generate_secret();
    let mut w = Webhook::new(agent.id.clone(), scheme, &secret, d.0.clock.now())
        .map_err(|e| Problem::Invalid(e.to_string()))?;
    w.allowed_types = allowed(&f.allow)?;
    d.0.store.create_webhook(&w).await?;
    page(&d, &agent, &origin(&headers), Some((w.id.clone(), secret))).await
}

async fn webhook_of(d: &Dashboard, agent: &Agent, id: &str) -> Result<Webhook, Problem> {
    let not_found = || Problem::NotFound(format!("webhook {id}"));
    let id = WebhookId::parse(id).map_err(|_| not_found())?;
    match d.0.store.get_webhook(&id).await? {
        Some(w) if w.agent_id == agent.id => Ok(w),
        _ => Err(not_found()),
    }
}

#[derive(Deserialize)]
pub(crate) struct UpdateForm {
    #[serde(default)]
    allow: String,
    rate_limit: String,
    wake: String,
}

/// `POST /ui/agents/{id}/webhooks/{webhook}/update`.
pub(crate) async fn update(
    State(d): State<Dashboard>,
    Path((id, webhook)): Path<(String, String)>,
    Form(f): Form<UpdateForm>,
) -> Result<Redirect, Problem> {
    let agent = agent_of(&d, &id).await?;
    let mut w = webhook_of(&d, &agent, &webhook).await?;
    w.allowed_types = allowed(&f.allow)?;
    w.rate_limit =
        RateLimit::parse(f.rate_limit.trim()).map_err(|e| Problem::Invalid(e.to_string()))?;
    w.wake = f.wake == "yes";
    d.0.store.update_webhook(&w).await?;
    Ok(Redirect::to(&format!("/ui/agents/{}/webhooks", agent.id)))
}

/// `POST /ui/agents/{id}/webhooks/{webhook}/rotate`: a new secret, shown once; the old
/// one keeps working for a day.
pub(crate) async fn rotate(
    State(d): State<Dashboard>,
    Path((id, webhook)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    let mut w = webhook_of(&d, &agent, &webhook).await?;
    let secret = pulse_signatures::inbound::generate_secret();
    w.rotate(&secret, GRACE, d.0.clock.now())
        .map_err(|e| Problem::Invalid(e.to_string()))?;
    d.0.store.update_webhook(&w).await?;
    page(&d, &agent, &origin(&headers), Some((w.id.clone(), secret))).await
}

/// `POST /ui/agents/{id}/webhooks/{webhook}/delete`.
pub(crate) async fn delete(
    State(d): State<Dashboard>,
    Path((id, webhook)): Path<(String, String)>,
) -> Result<Redirect, Problem> {
    let agent = agent_of(&d, &id).await?;
    let w = webhook_of(&d, &agent, &webhook).await?;
    d.0.store.delete_webhook(&w.id).await?;
    Ok(Redirect::to(&format!("/ui/agents/{}/webhooks", agent.id)))
}
