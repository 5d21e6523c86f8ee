//! `webhooks.toml`: the signed URLs external systems send an agent events through, each
//! with a name. A webhook's secret is made when `apply` creates it (or taken, that once,
//! from the variable `secret_env` names, for a sender that makes its own, as GitHub and
//! Stripe do) and shown once with its URL; it is never in a file, a plan or an export.
//! Its scheme does not change in place: a new scheme is a new webhook (a new name).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{FieldChange, FileError};
use crate::domain::{RateLimit, Webhook, WebhookId, WebhookScheme};

/// The webhooks file.
pub const WEBHOOKS_TOML: &str = "webhooks.toml";

/// `webhooks.toml`: `[[webhook]]` tables.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhooksToml {
    /// The webhooks.
    #[serde(default, rename = "webhook", skip_serializing_if = "Vec::is_empty")]
    pub webhooks: Vec<WebhookToml>,
}

/// One `[[webhook]]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookToml {
    /// Its name: how `apply` finds it again (letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// How requests are signed: pulse (the default), standard, github or stripe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// The event types it may create; any when left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<String>,
    /// Accepted requests an hour or a day (`100/h`, the default; `2400/d`; `none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<String>,
    /// Whether each accepted event also wakes the agent's conversation.
    #[serde(default, skip_serializing_if = "is_false")]
    pub wake: bool,
    /// The variable holding a secret the sender made (GitHub's, Stripe's), read once
    /// when the webhook is created; one is made when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_env: Option<String>,
    /// A note: what sends to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One webhook as the files want it.
#[derive(Clone, Debug)]
pub(crate) struct WebhookSpec {
    pub(crate) name: String,
    pub(crate) scheme: WebhookScheme,
    pub(crate) allowed_types: Vec<crate::domain::EventType>,
    pub(crate) rate_limit: Option<RateLimit>,
    pub(crate) wake: bool,
    pub(crate) secret_env: Option<String>,
    pub(crate) description: Option<String>,
}

impl WebhookSpec {
    /// `webhook` made as the files want it, its id, secrets and state kept.
    pub(crate) fn onto(&self, webhook: &Webhook) -> Webhook {
        let mut w = webhook.clone();
        w.name = Some(self.name.clone());
        w.allowed_types = self.allowed_types.clone();
        w.rate_limit = self.rate_limit;
        w.wake = self.wake;
        w.description = self.description.clone();
        w
    }
}

/// What happens to one webhook.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum WebhookChange {
    /// It is made: a new URL and secret, shown once.
    Create {
        /// Its name.
        name: String,
        /// Its scheme.
        scheme: String,
    },
    /// It differs: changed in place (its URL and secret kept).
    Change {
        /// Its name.
        name: String,
        /// The stored one.
        id: WebhookId,
        /// What differs.
        fields: Vec<FieldChange>,
    },
    /// In the store and not in the files: removed only with `prune` (its URL then
    /// answers 404).
    Remove {
        /// Its name (its id when it has none).
        name: String,
        /// The stored one.
        id: WebhookId,
        /// Whether it is removed.
        pruned: bool,
    },
}

impl WebhookChange {
    /// Whether applying it writes something.
    pub fn writes(&self) -> bool {
        !matches!(self, Self::Remove { pruned: false, .. })
    }
}

fn settings(w: &Webhook) -> BTreeMap<&'static str, Option<String>> {
    let types: Vec<&str> = w.allowed_types.iter().map(|t| t.as_str()).collect();
    BTreeMap::from([
        ("types", (!types.is_empty()).then(|| types.join(","))),
        (
            "rate_limit",
            Some(w.rate_limit.map_or("none".to_owned(), |r| r.to_string())),
        ),
        ("wake", Some(w.wake.to_string())),
        ("description", w.description.clone()),
    ])
}

/// What differs between a stored webhook and what the files want.
pub(crate) fn differences(stored: &Webhook, wanted: &Webhook) -> Vec<FieldChange> {
    let mut out = FieldChange::between(&settings(stored), &settings(wanted));
    if stored.name.is_some() && stored.name != wanted.name {
        out.push(FieldChange {
            field: "name".into(),
            before: stored.name.clone(),
            after: wanted.name.clone(),
        });
    }
    out
}

/// The webhooks `file` asks for, every value checked.
pub(crate) fn specs(file: &Path, webhooks: &[WebhookToml]) -> Result<Vec<WebhookSpec>, FileError> {
    let mut out = Vec::new();
    let mut names = HashSet::new();
    for w in webhooks {
        let name = w.name.trim().to_owned();
        let bad = |problem: String| FileError::new(file, format!("webhook {name:?}: {problem}"));
        super::check_name(&name).map_err(|p| FileError::new(file, format!("webhook name {p}")))?;
        if !names.insert(name.to_ascii_lowercase()) {
            return Err(FileError::new(
                file,
                format!("two webhooks are named {name:?}; each needs its own name"),
            ));
        }
        let scheme = match &w.scheme {
            Some(s) => WebhookScheme::parse(s).map_err(|e| bad(e.to_string()))?,
            None => WebhookScheme::Pulse,
        };
        let allowed_types = Webhook::parse_allowed(w.types.iter().map(String::as_str))
            .map_err(|e| bad(e.to_string()))?;
        let rate_limit = match &w.rate_limit {
            Some(r) => RateLimit::parse(r).map_err(|e| bad(e.to_string()))?,
            None => Some(RateLimit::DEFAULT),
        };
        out.push(WebhookSpec {
            name,
            scheme,
            allowed_types,
            rate_limit,
            wake: w.wake,
            secret_env: w.secret_env.as_deref().map(str::trim).map(str::to_owned),
            description: w
                .description
                .as_deref()
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(str::to_owned),
        });
    }
    Ok(out)
}

/// What becomes of `stored` webhooks when the files ask for `specs`; refused when one
/// would change its scheme.
pub(crate) fn changes(
    file: &Path,
    stored: &[Webhook],
    specs: &[WebhookSpec],
    prune: bool,
) -> Result<Vec<WebhookChange>, FileError> {
    let mut out = Vec::new();
    let mut matched = HashSet::new();
    let mut stored: Vec<&Webhook> = stored.iter().collect();
    stored.sort_by(|a, b| a.id.cmp(&b.id));
    for w in stored {
        let name = w.name.clone().unwrap_or_else(|| w.id.to_string());
        let key = name.to_ascii_lowercase();
        match specs.iter().find(|s| s.name.to_ascii_lowercase() == key) {
            Some(spec) if matched.insert(key.clone()) => {
                if spec.scheme != w.scheme {
                    return Err(FileError::new(
                        file,
                        format!(
                            "webhook {name:?}: its scheme is {}; a scheme does not change in place (its senders sign for it): give the {} one another name, a new URL and secret",
                            w.scheme, spec.scheme
                        ),
                    ));
                }
                let fields = differences(w, &spec.onto(w));
                if !fields.is_empty() {
                    out.push(WebhookChange::Change {
                        name: spec.name.clone(),
                        id: w.id.clone(),
                        fields,
                    });
                }
            }
            _ => out.push(WebhookChange::Remove {
                name,
                id: w.id.clone(),
                pruned: prune,
            }),
        }
    }
    out.extend(
        specs
            .iter()
            .filter(|s| !matched.contains(&s.name.to_ascii_lowercase()))
            .map(|s| WebhookChange::Create {
                name: s.name.clone(),
                scheme: s.scheme.to_string(),
            }),
    );
    Ok(out)
}

/// The entries that describe `webhooks`, named by their id when they have no name.
pub(super) fn entries(webhooks: &[Webhook]) -> Vec<WebhookToml> {
    let mut sorted: Vec<&Webhook> = webhooks.iter().collect();
    sorted.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
    sorted
        .into_iter()
        .map(|w| WebhookToml {
            name: w.name.clone().unwrap_or_else(|| w.id.to_string()),
            scheme: (w.scheme != WebhookScheme::Pulse).then(|| w.scheme.to_string()),
            types: w
                .allowed_types
                .iter()
                .map(|t| t.as_str().to_owned())
                .collect(),
            rate_limit: (w.rate_limit != Some(RateLimit::DEFAULT))
                .then(|| w.rate_limit.map_or("none".to_owned(), |r| r.to_string())),
            wake: w.wake,
            secret_env: None,
            description: w.description.clone(),
        })
        .collect()
}
