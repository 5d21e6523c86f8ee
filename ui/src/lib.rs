//! The Pulse dashboard: server-rendered pages for watching and steering agents.
//!
//! `pulse serve` mounts it under `/ui/` beside the receiver; `pulse dashboard` serves it
//! alone against the configured backend (SQLite, or DynamoDB and SQS with the operator's
//! own credentials). The Lambda functions never link it: an AWS deployment has no public
//! admin surface.
//!
//! Pages are rendered with maud; htmx (vendored, embedded) refreshes parts of them when
//! the live stream (server-sent events, `live.rs`) says something changed. Handlers call
//! the engine and the ports only.

mod assets;
mod charts;
mod layout;
mod live;
mod pages;
mod security;
mod sessions;

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use pulse_shared::app::{Connected, Services};
use pulse_shared::engine::memory::Memories;
use pulse_shared::engine::{
    DispatchSettings, Dispatcher, EngineSettings, Lifecycle, LifecycleError,
};
use pulse_shared::error::StoreError;
use pulse_shared::ports::{Clock, SessionQueue, Store};

pub use security::{Access, AccessError};

/// The dashboard: what its handlers share.
#[derive(Clone)]
pub struct Dashboard(Arc<Inner>);

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    /// The sessions queue: messages sent from the Chat tab.
    pub(crate) queue: Arc<dyn SessionQueue>,
    pub(crate) lifecycle: Lifecycle,
    /// Sends hook tests and replays; `None` when the backend has no hooks queue.
    pub(crate) dispatcher: Option<Dispatcher>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) guard: security::Guard,
    /// Recalls as the agents do, for the Memories tab's search.
    pub(crate) memories: Arc<Memories>,
    /// Runs an action again (the Actions tab's Retry), through the agents' tools.
    pub(crate) runner: pulse_shared::engine::HeartbeatRunner,
    /// The prices costs are shown at.
    pub(crate) prices: Arc<pulse_shared::engine::Prices>,
    /// Where a trace is shown (`PULSE_TRACE_URL`), its id as `{trace_id}`.
    pub(crate) trace_url: Option<String>,
}

impl Dashboard {
    /// The dashboard over a connected backend, reached as `access` says; hook tests and
    /// replays go out through the services' egress, and memory searches embed with their
    /// embedder.
    pub fn new(
        b: &Connected,
        clock: Arc<dyn Clock>,
        settings: &EngineSettings,
        services: &Services,
        access: Access,
    ) -> Self {
        let memories = b.memories(services);
        let tools = b.tools(
            clock.clone(),
            settings,
            services,
            memories.clone(),
            b.agent_tools(clock.clone(), services),
        );
        Self(Arc::new(Inner {
            store: b.store.clone(),
            queue: b.queue.clone(),
            lifecycle: b.lifecycle(clock.clone(), settings),
            dispatcher: b.dispatcher(clock.clone(), &services.egress, DispatchSettings::default()),
            runner: b.runner(clock.clone(), settings, tools),
            clock,
            guard: security::Guard::new(access),
            memories,
            prices: settings.prices.clone(),
            trace_url: settings.trace_url.clone(),
        }))
    }

    /// Its routes, all under `/ui/` (and `/`, which leads there).
    pub fn router(&self) -> Router {
        use pages::{agent, agents, approvals, chat, hooks, login, mind, trace, webhooks};
        Router::new()
            .route("/", get(|| async { Redirect::to("/ui/") }))
            .route("/ui", get(|| async { Redirect::to("/ui/") }))
            .route("/ui/", get(agents::list))
            .route("/ui/login", get(login::form).post(login::submit))
            .route("/ui/logout", post(login::logout))
            .route("/ui/assets/{file}", get(assets::serve))
            .route("/ui/agents", post(agents::create))
            .route("/ui/approvals", get(approvals::list))
            .route("/ui/approvals/count", get(approvals::count))
            .route("/ui/approvals/{agent}/{id}/{verb}", post(approvals::decide))
            .route("/ui/agents/{id}", get(agent::home))
            .route("/ui/agents/{id}/heartbeats", get(agent::heartbeats))
            .route("/ui/agents/{id}/charts", get(agent::charts))
            .route("/ui/agents/{id}/charts.json", get(agent::charts_json))
            .route("/ui/charts.json", get(agents::charts_json))
            .route("/ui/agents/{id}/heartbeats/{beat}", get(trace::show))
            .route("/ui/agents/{id}/events", get(agent::events))
            .route("/ui/agents/{id}/actions", get(agent::actions))
            .route("/ui/agents/{id}/settings", get(agent::settings))
            .route("/ui/agents/{id}/conversation", get(chat::old_address))
            .route("/ui/agents/{id}/chat", get(chat::show).post(chat::send))
            .route("/ui/agents/{id}/wake", post(agent::wake))
            .route("/ui/agents/{id}/actions/{action}/retry", post(agent::retry))
            .route(
                "/ui/agents/{id}/actions/{action}/resolve/{to}",
                post(agent::resolve),
            )
            .route(
                "/ui/agents/{id}/heartbeats/{beat}/cancel",
                post(agent::cancel),
            )
            .route("/ui/agents/{id}/snooze", post(agent::snooze))
            .route("/ui/agents/{id}/memories", get(mind::memories))
            .route("/ui/agents/{id}/tools", get(mind::tools))
            .route("/ui/agents/{id}/tools/{tool}/{to}", post(mind::switch_tool))
            .route(
                "/ui/agents/{id}/subscriptions/{sub}/{to}",
                post(mind::switch_subscription),
            )
            .route("/ui/agents/{id}/update", post(agent::update))
            .route("/ui/agents/{id}/pause", post(agent::pause))
            .route("/ui/agents/{id}/resume", post(agent::resume))
            .route("/ui/agents/{id}/delete", post(agent::delete))
            .route("/ui/agents/{id}/live", get(live::stream))
            .route("/ui/agents/{id}/hooks", get(hooks::list).post(hooks::add))
            .route("/ui/agents/{id}/hooks/{hook}/test", post(hooks::test))
            .route("/ui/agents/{id}/hooks/{hook}/delete", post(hooks::delete))
            .route(
                "/ui/agents/{id}/hooks/{hook}/deliveries/{delivery}/replay",
                post(hooks::replay),
            )
            .route("/ui/agents/{id}/hooks/{hook}/{to}", post(hooks::switch))
            .route(
                "/ui/agents/{id}/webhooks",
                get(webhooks::list).post(webhooks::create),
            )
            .route(
                "/ui/agents/{id}/webhooks/{webhook}/update",
                post(webhooks::update),
            )
            .route(
                "/ui/agents/{id}/webhooks/{webhook}/rotate",
                post(webhooks::rotate),
            )
            .route(
                "/ui/agents/{id}/webhooks/{webhook}/delete",
                post(webhooks::delete),
            )
            .route("/ui/{*rest}", get(pages::no_page))
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                security::protect,
            ))
            .with_state(self.clone())
    }
}

/// Why a page could not be shown: a page of its own with the status.
pub(crate) enum Problem {
    /// The thing named is not there (404).
    NotFound(String),
    /// The input was wrong (400); nothing was written.
    Invalid(String),
    /// What was asked was done already, otherwise (409): a second decision.
    Conflict(String),
    /// Storage failed (503).
    Store(StoreError),
}

impl From<StoreError> for Problem {
    fn from(e: StoreError) -> Self {
        match e {
            // The record named in the URL or form is not there: 404, not an outage.
            StoreError::NotFound(what) => Self::NotFound(what),
            StoreError::AlreadyExists(what) => Self::Invalid(format!("{what} already exists")),
            other => Self::Store(other),
        }
    }
}

impl From<LifecycleError> for Problem {
    fn from(e: LifecycleError) -> Self {
        match e {
            LifecycleError::NotFound(id) => Self::NotFound(format!("agent {id}")),
            LifecycleError::Invalid(v) => Self::Invalid(v.to_string()),
            LifecycleError::Store(StoreError::AlreadyExists(what)) => {
                Self::Invalid(format!("{what} already exists"))
            }
            LifecycleError::Store(e) => Self::Store(e),
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let (status, text) = match self {
            Self::NotFound(what) => (StatusCode::NOT_FOUND, format!("{what} not found")),
            Self::Invalid(why) => (StatusCode::BAD_REQUEST, why),
            Self::Conflict(why) => (StatusCode::CONFLICT, why),
            Self::Store(e) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the store could not be read: {}",
                    pulse_shared::error::chain(&e)
                ),
            ),
        };
        let body = layout::page(
            "Problem",
            None,
            maud::html! {
                h1 { "Something is wrong" }
                p.error { (text) }
                p { a href="/ui/" { "Back to the agents" } }
            },
        );
        (status, body).into_response()
    }
}
