//! `hooks.toml`: an agent's outbound hooks, each with a name. One entry with several
//! `types` is one hook per type, signed with one secret (as `pulse hooks add --type A,B`
//! makes them). A signing secret is made when a hook is created and shown once; an
//! `Authorization` header is named by the variable that holds it (`auth_header_env`),
//! read when the plan is made — never written in a file, an export or a plan.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use jiff::SignedDuration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{FieldChange, FileError};
use crate::domain::{
    Hook, HookId, HookTarget, HookType, RetrySchedule, Secret, format_duration, parse_duration,
};

/// The hooks file.
pub const HOOKS_TOML: &str = "hooks.toml";

/// How a changed `Authorization` header shows in a plan.
const HIDDEN: &str = "***";

/// `hooks.toml`: `[[hook]]` tables.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HooksToml {
    /// The hooks.
    #[serde(default, rename = "hook", skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookToml>,
}

/// One `[[hook]]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HookToml {
    /// Its name: how `apply` finds it again (letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// What it fires on: AFTER_HEARTBEAT, HEARTBEAT_INCOMPLETE, AFTER_<TOOL>, … (`pulse
    /// hooks types`); one hook per type, all signed with one secret.
    pub types: Vec<String>,
    /// Where it delivers: an https:// URL, or eventbridge://BUS_NAME.
    pub url: String,
    /// The environment variable holding the `Authorization` header it sends (e.g.
    /// `Bearer …`): the name, never the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_header_env: Option<String>,
    /// How long one attempt may take (15s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Delays between attempts, comma-separated, or none (5s,5m,30m,2h,5h,10h,10h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<String>,
    /// Failing without a success for this long disables it (5d).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_after: Option<String>,
    /// A note for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// One hook as the files want it.
#[derive(Clone, Debug)]
pub(crate) struct HookSpec {
    pub(crate) name: String,
    pub(crate) hook_type: HookType,
    pub(crate) target: HookTarget,
    pub(crate) auth_header: Option<Secret>,
    pub(crate) timeout: SignedDuration,
    pub(crate) retry: RetrySchedule,
    pub(crate) disable_after: SignedDuration,
    pub(crate) description: Option<String>,
}

impl HookSpec {
    /// Its key among the agent's hooks: name and type.
    pub(crate) fn key(&self) -> (String, String) {
        (
            self.name.to_ascii_lowercase(),
            self.hook_type.as_str().to_owned(),
        )
    }

    /// `hook` made as the files want it, its id, secret and state kept.
    pub(crate) fn onto(&self, hook: &Hook) -> Hook {
        let mut h = hook.clone();
        h.name = Some(self.name.clone());
        h.target = self.target.clone();
        h.auth_header = self.auth_header.clone();
        h.timeout = self.timeout;
        h.retry = self.retry.clone();
        h.disable_after = self.disable_after;
        h.description = self.description.clone();
        h
    }
}

/// What happens to one hook.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum HookChange {
    /// It is made, with a new signing secret (or its siblings').
    Create {
        /// Its name.
        name: String,
        /// What it fires on.
        hook_type: String,
        /// Where it delivers.
        url: String,
    },
    /// It differs: changed in place (its id, secret and deliveries kept).
    Change {
        /// Its name.
        name: String,
        /// What it fires on.
        hook_type: String,
        /// The stored one.
        id: HookId,
        /// What differs; an `Authorization` header as `***`.
        fields: Vec<FieldChange>,
    },
    /// In the store and not in the files: removed only with `prune`.
    Remove {
        /// Its name (its id when it has none).
        name: String,
        /// What it fires on.
        hook_type: String,
        /// The stored one.
        id: HookId,
        /// Whether it is removed.
        pruned: bool,
    },
}

impl HookChange {
    /// Whether applying it writes something.
    pub fn writes(&self) -> bool {
        !matches!(self, Self::Remove { pruned: false, .. })
    }
}

/// A hook's settings the files cover, by key, for comparing; the header hidden.
fn settings(h: &Hook) -> BTreeMap<&'static str, Option<String>> {
    BTreeMap::from([
        ("url", Some(h.target.to_string())),
        (
            "auth_header",
            h.auth_header.as_ref().map(|_| HIDDEN.to_owned()),
        ),
        ("timeout", Some(format_duration(h.timeout))),
        ("retry", Some(h.retry.to_string())),
        ("disable_after", Some(format_duration(h.disable_after))),
        ("description", h.description.clone()),
    ])
}

/// What differs between a stored hook and what the files want.
pub(crate) fn differences(stored: &Hook, wanted: &Hook) -> Vec<FieldChange> {
    let mut out = FieldChange::between(&settings(stored), &settings(wanted));
    // The same header length hides a changed value: compare the values themselves.
    let header = |h: &Hook| h.auth_header.as_ref().map(|s| s.expose().to_owned());
    if header(stored).is_some() && header(wanted).is_some() && header(stored) != header(wanted) {
        out.push(FieldChange {
            field: "auth_header".into(),
            before: Some(HIDDEN.into()),
            after: Some(format!("{HIDDEN} (another value)")),
        });
    }
    if stored.name.as_deref() != wanted.name.as_deref() && stored.name.is_some() {
        out.push(FieldChange {
            field: "name".into(),
            before: stored.name.clone(),
            after: wanted.name.clone(),
        });
    }
    out
}

/// The hooks `file` asks for: every value checked, each type one that fires
/// (`valid_types`), each header read from its variable (`env`).
pub(crate) fn specs(
    file: &Path,
    hooks: &[HookToml],
    valid_types: &[String],
    event_bus: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<HookSpec>, FileError> {
    let mut out = Vec::new();
    let mut names = HashSet::new();
    for h in hooks {
        let name = h.name.trim().to_owned();
        let bad = |problem: String| FileError::new(file, format!("hook {name:?}: {problem}"));
        super::check_name(&name).map_err(|p| FileError::new(file, format!("hook name {p}")))?;
        if !names.insert(name.to_ascii_lowercase()) {
            return Err(FileError::new(
                file,
                format!("two hooks are named {name:?}; each needs its own name"),
            ));
        }
        let target = HookTarget::parse(&h.url).map_err(|e| bad(e.to_string()))?;
        if matches!(target, HookTarget::EventBridge { .. }) && !event_bus {
            return Err(bad(format!(
                "{target} needs the AWS backend: this store has no event bus; use an https:// URL"
            )));
        }
        let timeout = match &h.timeout {
            Some(t) => parse_duration("timeout", t)
                .and_then(Hook::check_timeout)
                .map_err(|e| bad(e.to_string()))?,
            None => Hook::DEFAULT_TIMEOUT,
        };
        let retry = match &h.retry {
            Some(r) => RetrySchedule::parse(r).map_err(|e| bad(e.to_string()))?,
            None => RetrySchedule::standard(),
        };
        let disable_after = match &h.disable_after {
            Some(d) => {
                let d = parse_duration("disable_after", d).map_err(|e| bad(e.to_string()))?;
                if d < SignedDuration::from_mins(1) {
                    return Err(bad(
                        "disable_after: give at least 1m (the default is 5d)".into()
                    ));
                }
                d
            }
            None => Hook::DEFAULT_DISABLE_AFTER,
        };
        let auth_header = match h.auth_header_env.as_deref().map(str::trim) {
            None => None,
            Some(var) => {
                let value = env(var).filter(|v| !v.trim().is_empty()).ok_or_else(|| {
                    bad(format!(
                        "auth_header_env names {var}, which is not set: set it to the Authorization header to send (it is never written in a file)"
                    ))
                })?;
                if http::HeaderValue::from_str(&value).is_err() {
                    return Err(bad(format!(
                        "{var} does not hold a value that fits in an HTTP header"
                    )));
                }
                Some(Secret::new(value))
            }
        };
        let description = h
            .description
            .as_deref()
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(str::to_owned);
        if h.types.is_empty() {
            return Err(bad(
                "give `types`: what it fires on (`pulse hooks types` lists them)".into(),
            ));
        }
        let mut seen = HashSet::new();
        for t in &h.types {
            let hook_type = HookType::parse(t).map_err(|e| bad(e.to_string()))?;
            if !valid_types.iter().any(|v| v == hook_type.as_str()) {
                return Err(bad(format!(
                    "{hook_type} fires on nothing: it is neither a lifecycle type nor BEFORE_/AFTER_ of a registered tool (`pulse hooks types` lists them)"
                )));
            }
            if !seen.insert(hook_type.as_str().to_owned()) {
                continue;
            }
            out.push(HookSpec {
                name: name.clone(),
                hook_type,
                target: target.clone(),
                auth_header: auth_header.clone(),
                timeout,
                retry: retry.clone(),
                disable_after,
                description: description.clone(),
            });
        }
    }
    Ok(out)
}

/// The entries that describe `hooks`: those of one name (or, unnamed, one id) together,
/// their types gathered. A header is named by a variable made from the name, to set
/// before applying.
pub(super) fn entries(hooks: &[Hook]) -> Vec<HookToml> {
    let mut out: Vec<HookToml> = Vec::new();
    let mut sorted: Vec<&Hook> = hooks.iter().collect();
    sorted.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
    for h in sorted {
        let name = h.name.clone().unwrap_or_else(|| h.id.to_string());
        if let Some(e) = out.iter_mut().find(|e| e.name.eq_ignore_ascii_case(&name)) {
            e.types.push(h.hook_type.as_str().to_owned());
            continue;
        }
        let default_retry = RetrySchedule::standard();
        out.push(HookToml {
            types: vec![h.hook_type.as_str().to_owned()],
            url: h.target.to_string(),
            auth_header_env: h.auth_header.as_ref().map(|_| header_variable(&name)),
            timeout: (h.timeout != Hook::DEFAULT_TIMEOUT).then(|| format_duration(h.timeout)),
            retry: (h.retry != default_retry).then(|| h.retry.to_string()),
            disable_after: (h.disable_after != Hook::DEFAULT_DISABLE_AFTER)
                .then(|| format_duration(h.disable_after)),
            description: h.description.clone(),
            name,
        });
    }
    out
}

/// The variable an export names for a hook's `Authorization` header:
/// `PULSE_HOOK_AUTH_` and the name in capitals, other characters as `_`.
pub fn header_variable(name: &str) -> String {
    format!("PULSE_HOOK_AUTH_{}", crate::domain::upper_snake(name))
}
