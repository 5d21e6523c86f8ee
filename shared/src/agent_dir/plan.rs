//! What applying agent directories would change in a store (a [`Plan`]), field by field,
//! and carrying it out ([`apply`]). Everything is matched by name: an agent by its
//! name, a schedule, a webhook or a hook by its name in its file; nothing is made again
//! that exists. A schedule, a webhook or a hook in the store and not in the files is
//! removed only with `prune`; an agent never is, nor a memory (they are not the files'
//! to remove).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::{Value, json};

use super::hooks::{self, HookChange, HookSpec};
use super::tools::{self as tool_files, ToolChange, ToolSpecs, ToolTarget};
use super::webhooks::{self, WebhookChange, WebhookSpec};
use super::{AgentDir, FieldChange, FileError, HEARTBEAT_MD, SOUL_MD, Size};
use crate::domain::{
    Agent, AgentChanges, AgentId, EventType, Expectation, Hook, HookType, NewAgent, NewEvent,
    Registry, Schedule, ScheduleId, ScheduleRule, ToolName, Webhook, WebhookId, agents_named,
    builtin_tools,
};
use crate::engine::reminders::ScheduleSpec;
use crate::engine::{Lifecycle, LifecycleError};
use crate::error::StoreError;
use crate::llm::tokens::TokenCount;
use crate::ports::Store;

/// The event an apply that changed an agent puts in its log: what changed, from which
/// directory and source, so its next heartbeat and its story show it.
pub const APPLIED: &str = "APPLIED";

/// Why a plan could not be made or carried out.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A file is wrong.
    #[error("{0}")]
    File(#[from] FileError),
    /// The store could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store refused a change.
    #[error("{0}")]
    Lifecycle(#[from] LifecycleError),
}

/// How a plan is made.
pub struct PlanOptions<'a> {
    /// Whether what the store has and the files do not is removed.
    pub prune: bool,
    /// Whether the backend has an event bus (hooks to `eventbridge://`).
    pub event_bus: bool,
    /// The environment the variables the files name are read from.
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// Counts the texts' tokens as each agent's model does; `None`: estimated.
    pub tokens: Option<&'a crate::llm::tokens::TokenCounter>,
}

fn process_env(var: &str) -> Option<String> {
    std::env::var(var).ok()
}

impl PlanOptions<'static> {
    /// Nothing pruned, no event bus, variables from the process's environment.
    pub fn new(prune: bool) -> Self {
        Self {
            prune,
            event_bus: false,
            env: &process_env,
            tokens: None,
        }
    }
}

/// How a plan is carried out.
pub struct ApplyOptions<'a> {
    /// Where the files come from (a commit), recorded with each change.
    pub source: Option<&'a str>,
    /// The environment the variables the files name are read from.
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// Where seed memories are kept (and embedded).
    pub memories: Option<&'a crate::engine::memory::Memories>,
    /// The sessions MCP servers are listed through when `tools.toml` makes or moves one.
    pub mcp: Option<&'a crate::tools::McpClients>,
}

impl<'a> ApplyOptions<'a> {
    /// From `source`, variables from the process's environment, no memories.
    pub fn new(source: Option<&'a str>) -> Self {
        Self {
            source,
            env: &process_env,
            memories: None,
            mcp: None,
        }
    }
}

/// Gives the agent `p`'s seed memories ([`mark_applied`] records that it was given
/// them).
async fn apply_seeds(
    store: &Arc<dyn Store>,
    agent: &AgentId,
    p: &AgentPlan,
    memories: Option<&crate::engine::memory::Memories>,
    now: Timestamp,
) -> Result<(), PlanError> {
    if p.seeds.is_empty() {
        return Ok(());
    }
    let Some(book) = memories else {
        return Err(FileError::new(
            p.dir.join(super::MEMORIES_MD),
            "seed memories need the memory store, which this apply was not given",
        )
        .into());
    };
    let beat = crate::engine::memory::beat_now(store.as_ref(), agent).await?;
    let ms = now.as_millisecond().max(0) as u64;
    let seeds = p
        .seeds
        .iter()
        .map(|text| {
            let id = crate::domain::MemoryId::derived(ms, &[agent.as_str(), text]);
            let mut m = crate::domain::Memory::new(id, agent, text, beat, now)?;
            m.source = crate::domain::MemorySource::Operator;
            Ok(m)
        })
        .collect::<Result<Vec<_>, crate::error::ValidationError>>()
        .map_err(LifecycleError::Invalid)?;
    book.remember(agent, seeds).await?;
    Ok(())
}

/// Records on the agent's record, in one write (retried on a conflict), where its files
/// were applied from, so the dashboard and `agents show` say it is kept as files, and
/// the seed memories it was given, so no later apply gives them again.
async fn mark_applied(
    store: &Arc<dyn Store>,
    agent: &AgentId,
    p: &AgentPlan,
    source: Option<&str>,
    now: Timestamp,
) -> Result<(), PlanError> {
    for _ in 0..5 {
        let Some(before) = store.get_agent(agent).await? else {
            return Err(StoreError::NotFound(format!("agent {agent}")).into());
        };
        let mut after = before.clone();
        for key in p.seeds.iter().map(|t| super::seed_key(t)) {
            if !after.seeded.contains(&key) {
                after.seeded.push(key);
            }
        }
        after.applied = Some(crate::domain::AppliedFrom {
            dir: p.dir.display().to_string(),
            source: source.map(str::to_owned),
            at: now,
        });
        match store.update_agent(&after, &before).await {
            Err(StoreError::Conflict(_)) => continue,
            done => return Ok(done?),
        }
    }
    Err(StoreError::Conflict(format!(
        "agent {agent} kept changing while it was marked applied; apply again"
    ))
    .into())
}

/// What applying a directory does to its agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verb {
    /// It is not in the store: it is created.
    Create,
    /// It is, and differs: it is changed.
    Change,
    /// It is, as the files say.
    Same,
}

/// What happens to one schedule.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum ScheduleChange {
    /// It is made.
    Create {
        /// Its name.
        name: String,
        /// When and about what.
        rule: String,
    },
    /// It differs: the stored one is deleted and the files' made, under the same name.
    Replace {
        /// Its name.
        name: String,
        /// The stored one.
        id: ScheduleId,
        /// The stored one, described.
        before: String,
        /// The files', described.
        after: String,
    },
    /// It is in the store and not in the files: removed only with `prune`.
    Remove {
        /// Its name (its id when it has none).
        name: String,
        /// The stored one.
        id: ScheduleId,
        /// The stored one, described.
        rule: String,
        /// Whether it is removed (`--prune`) or kept.
        pruned: bool,
    },
}

impl ScheduleChange {
    /// Whether applying it writes something.
    pub fn writes(&self) -> bool {
        !matches!(self, Self::Remove { pruned: false, .. })
    }
}

/// What applying one directory does.
#[derive(Clone, Debug, Serialize)]
pub struct AgentPlan {
    /// The directory.
    pub dir: PathBuf,
    /// The agent's name.
    pub name: String,
    /// The stored agent's id, when it exists.
    pub agent_id: Option<AgentId>,
    /// What happens to it.
    pub verb: Verb,
    /// The settings that differ (on create, every one set).
    pub fields: Vec<FieldChange>,
    /// What happens to its schedules.
    pub schedules: Vec<ScheduleChange>,
    /// What happens to its hooks.
    pub hooks: Vec<HookChange>,
    /// What happens to its webhooks.
    pub webhooks: Vec<WebhookChange>,
    /// What happens to the tools it owns and its subscriptions.
    pub tools: Vec<ToolChange>,
    /// The seed memories it is given (those of `memories.md` it was never given), each
    /// by its first line's first words.
    pub memories: Vec<String>,
    /// Its texts' sizes against their budgets.
    pub sizes: Vec<Size>,
    /// The tokens its persona and instructions add to every heartbeat's prompt.
    pub prompt_tokens: usize,
    /// The tokens every heartbeat's prompt starts with before its events, memories and
    /// history: the system prompt (with the persona), Pulse's tools and the MCP tools it
    /// is given as last listed, and its instructions; and how they were counted.
    pub prompt_total: TokenCount,
    #[serde(skip)]
    new: NewAgent,
    #[serde(skip)]
    specs: BTreeMap<String, ScheduleSpec>,
    #[serde(skip)]
    hook_specs: Vec<HookSpec>,
    #[serde(skip)]
    webhook_specs: Vec<WebhookSpec>,
    #[serde(skip)]
    seeds: Vec<String>,
    #[serde(skip)]
    tool_specs: ToolSpecs,
}

impl AgentPlan {
    /// The spec of its hook `name` of `hook_type`.
    fn hook_spec(&self, name: &str, hook_type: &str) -> &HookSpec {
        self.hook_specs
            .iter()
            .find(|s| s.name == name && s.hook_type.as_str() == hook_type)
            .expect("a planned hook has its spec")
    }

    /// How many writes applying it makes.
    pub fn changes(&self) -> usize {
        self.fields.len()
            + self.schedules.iter().filter(|c| c.writes()).count()
            + self.hooks.iter().filter(|c| c.writes()).count()
            + self.webhooks.iter().filter(|c| c.writes()).count()
            + self.tools.iter().filter(|c| c.writes()).count()
            + self.seeds.len()
    }
}

/// What applying directories does, one plan per directory.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    /// Each directory's.
    pub agents: Vec<AgentPlan>,
}

impl Plan {
    /// How many writes applying it makes.
    pub fn changes(&self) -> usize {
        self.agents.iter().map(AgentPlan::changes).sum()
    }
}

/// What [`apply`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// Agents created.
    pub created: Vec<AgentId>,
    /// Agents changed.
    pub changed: Vec<AgentId>,
    /// Agents already as their files say.
    pub same: usize,
    /// The signing secrets of hooks made, each shown this once.
    pub secrets: Vec<NewSecret>,
    /// The webhooks made: their URLs' ids and secrets, each shown this once.
    pub webhooks: Vec<NewWebhook>,
}

/// A new webhook: where it is, and the secret its sender signs with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NewWebhook {
    /// The agent.
    pub agent: String,
    /// The webhook's name.
    pub name: String,
    /// Its id, the last segment of its URL (`/webhooks/{id}`).
    pub id: WebhookId,
    /// Its secret; `None` when it came from the variable the file names.
    pub secret: Option<String>,
}

/// A new hook's signing secret, to give its receiver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NewSecret {
    /// The agent.
    pub agent: String,
    /// The hook's name.
    pub hook: String,
    /// The secret (`whsec_…`).
    pub secret: String,
}

/// The settings of `agent` a directory covers, flattened to the files' keys.
fn settings(agent: &Agent) -> BTreeMap<String, String> {
    const NOT_SETTINGS: [&str; 12] = [
        "seeded",
        "applied",
        "id",
        "session",
        "created_at",
        "last_interaction_at",
        "paused_at",
        "snoozed_until",
        "auto_paused_since",
        "cancel_requested_at",
        "next_wake",
        "granted",
    ];
    let mut out = BTreeMap::new();
    let Ok(Value::Object(mut doc)) = serde_json::to_value(agent) else {
        return out;
    };
    for k in NOT_SETTINGS {
        doc.remove(k);
    }
    fn flat(prefix: &str, v: Value, out: &mut BTreeMap<String, String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    flat(&format!("{prefix}{k}."), v, out);
                }
            }
            Value::Null => {}
            Value::String(s) => {
                out.insert(prefix.trim_end_matches('.').to_owned(), s);
            }
            other => {
                out.insert(prefix.trim_end_matches('.').to_owned(), other.to_string());
            }
        }
    }
    flat("", Value::Object(doc), &mut out);
    out.into_iter()
        .map(|(k, v)| {
            let key = match k.as_str() {
                "persona" => SOUL_MD.to_owned(),
                "slack.chat" => "slack.channel".to_owned(),
                "instructions" => HEARTBEAT_MD.to_owned(),
                "discord_channel" => "discord.channel".to_owned(),
                "expect.must" => "expect".to_owned(),
                "expect.alert_after" => "alert_after".to_owned(),
                other => match other.strip_prefix("llm.") {
                    Some(rest) => format!("model.{rest}"),
                    None => other.to_owned(),
                },
            };
            (key, v)
        })
        .collect()
}

/// The differences between two agents' settings; texts by their size, never whole.
fn differences(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) -> Vec<FieldChange> {
    let keys: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    let text = |s: &String| format!("{} characters", s.chars().count());
    keys.into_iter()
        .filter_map(|k| {
            let (b, a) = (before.get(k), after.get(k));
            if b == a {
                return None;
            }
            let is_text = k == SOUL_MD || k == HEARTBEAT_MD;
            let (before, mut after) = if is_text {
                (b.map(text), a.map(text))
            } else {
                (b.cloned(), a.cloned())
            };
            if is_text && before == after {
                after = after.map(|a| format!("{a}, edited"));
            }
            Some(FieldChange {
                field: k.clone(),
                before,
                after,
            })
        })
        .collect()
}

/// A schedule as the plan names it.
fn describe(rule: &ScheduleRule, note: Option<&str>, expect: Option<Expectation>) -> String {
    let mut out = match rule {
        ScheduleRule::Cron { pattern, timezone } => format!("cron {pattern} ({timezone})"),
        ScheduleRule::Once { at } => format!("once at {at}"),
    };
    if let Some(n) = note {
        out.push_str(&format!(", note {n:?}"));
    }
    if let Some(e) = expect {
        out.push_str(&format!(
            ", expect {} after {}",
            e.must.as_str(),
            e.alert_after
        ));
    }
    out
}

fn stored(s: &Schedule) -> String {
    describe(&s.rule, s.note.as_deref(), s.expect)
}

/// The directory's schedules as specs, by name (checked on reading).
fn specs(dir: &AgentDir) -> BTreeMap<String, ScheduleSpec> {
    dir.schedules
        .iter()
        .filter_map(|s| {
            let rule = s.rule(&dir.agent.timezone).ok()?;
            let expect = s.expectation().ok()?;
            let name = s.name.trim().to_owned();
            let note = s
                .note
                .as_deref()
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_owned);
            Some((
                name.to_ascii_lowercase(),
                ScheduleSpec {
                    rule,
                    note,
                    expect,
                    name: Some(name),
                },
            ))
        })
        .collect()
}

fn describe_spec(s: &ScheduleSpec) -> String {
    describe(&s.rule, s.note.as_deref(), s.expect)
}

/// What becomes of the agent's schedules `have` when the files ask for `specs`; a new
/// one is checked as making it would check it (its time not passed, its note short).
fn schedule_changes(
    dir: &AgentDir,
    agent: &AgentId,
    have: &[Schedule],
    specs: &BTreeMap<String, ScheduleSpec>,
    prune: bool,
    now: Timestamp,
) -> Result<Vec<ScheduleChange>, FileError> {
    let mut out = Vec::new();
    let mut have: Vec<&Schedule> = have.iter().collect();
    have.sort_by(|a, b| a.id.cmp(&b.id));
    let mut matched = std::collections::HashSet::new();
    for s in have {
        let key = s.key().to_ascii_lowercase();
        match specs.get(&key) {
            Some(spec) if matched.insert(key.clone()) => {
                if spec.rule != s.rule || spec.note != s.note || spec.expect != s.expect {
                    out.push(ScheduleChange::Replace {
                        name: spec.name.clone().unwrap_or_default(),
                        id: s.id.clone(),
                        before: stored(s),
                        after: describe_spec(spec),
                    });
                }
            }
            _ => out.push(ScheduleChange::Remove {
                name: s.key().to_owned(),
                id: s.id.clone(),
                rule: stored(s),
                pruned: prune,
            }),
        }
    }
    for (key, spec) in specs.iter().filter(|(k, _)| !matched.contains(*k)) {
        let name = spec.name.clone().unwrap_or_else(|| key.clone());
        Schedule::new(agent, spec.rule.clone(), spec.note.clone(), now).map_err(|e| {
            FileError::new(
                dir.path.join(super::SCHEDULES_TOML),
                format!("schedule {name:?}: {e}"),
            )
        })?;
        out.push(ScheduleChange::Create {
            name,
            rule: describe_spec(spec),
        });
    }
    Ok(out)
}

/// What applying `dirs` to `store` would do. Refused, writing nothing, when a file is
/// wrong, two directories name one agent, or an agent's settings would not be valid.
pub async fn plan(
    store: &dyn Store,
    dirs: &[AgentDir],
    options: &PlanOptions<'_>,
    now: Timestamp,
) -> Result<Plan, PlanError> {
    let prune = options.prune;
    let agents = store.list_agents().await?;
    let registry = store.load_registry().await?.with_builtins(builtin_tools());
    // Every directory's tools first: one may subscribe to, give or hook a tool another
    // declares.
    let mut all_specs = Vec::with_capacity(dirs.len());
    let mut declared: BTreeMap<ToolName, PathBuf> = BTreeMap::new();
    for dir in dirs {
        let tools_file = dir.path.join(tool_files::TOOLS_TOML);
        let specs = tool_files::specs(&tools_file, &dir.tools, options.env, now)?;
        for t in &specs.tools {
            if let Some(other) = declared.insert(t.name.clone(), dir.path.clone()) {
                return Err(FileError::new(
                    &tools_file,
                    format!(
                        "declares tool {}, as {} does: a tool belongs to one agent's files (the others subscribe to it)",
                        t.name,
                        other.display()
                    ),
                )
                .into());
            }
        }
        all_specs.push(specs);
    }
    let all_declared: Vec<crate::domain::Tool> = all_specs
        .iter()
        .flat_map(|s| s.tools.iter().cloned())
        .collect();
    let valid_types: Vec<String> = HookType::catalogue(
        registry
            .tools
            .iter()
            .chain(all_declared.iter())
            .map(|t| &t.name),
    )
    .into_iter()
    .map(|(t, _)| t.as_str().to_owned())
    .collect();
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut out = Vec::new();
    for (dir, tool_specs) in dirs.iter().zip(all_specs) {
        let new = dir.new_agent()?;
        let key = new.name.trim().to_lowercase();
        if let Some(other) = seen.insert(key, dir.path.clone()) {
            return Err(FileError::new(
                dir.path.join(super::AGENT_TOML),
                format!(
                    "names agent {:?}, as {} does: one directory per agent",
                    new.name.trim(),
                    other.display()
                ),
            )
            .into());
        }
        let invalid = |e: crate::error::ValidationError| {
            FileError::new(dir.path.join(super::AGENT_TOML), e.to_string())
        };
        let specs = specs(dir);
        let hook_specs = hooks::specs(
            &dir.path.join(hooks::HOOKS_TOML),
            &dir.hooks,
            &valid_types,
            options.event_bus,
            options.env,
        )?;
        let webhooks_file = dir.path.join(webhooks::WEBHOOKS_TOML);
        let webhook_specs = webhooks::specs(&webhooks_file, &dir.webhooks)?;
        let tools_file = dir.path.join(tool_files::TOOLS_TOML);
        check_tool_references(dir, &new, &tool_specs, &all_declared, &registry)?;
        let existing = agents_named(&agents, new.name.trim())
            .into_iter()
            .find(|a| a.name.eq_ignore_ascii_case(new.name.trim()));
        let given: &[String] = existing.map(|a| a.seeded.as_slice()).unwrap_or_default();
        let mut seeds: Vec<String> = Vec::new();
        for m in &dir.memories {
            let key = super::seed_key(m);
            if !given.contains(&key) && !seeds.iter().any(|s| super::seed_key(s) == key) {
                seeds.push(m.clone());
            }
        }
        let tools = tool_changes(
            &tools_file,
            existing,
            &agents,
            &registry,
            &tool_specs,
            &new.tools,
            prune,
        )?;
        let (agent_id, fields, schedules, hooks, webhooks, wanted) = match existing {
            None => {
                let (created, _) = new.clone().create(now).map_err(invalid)?;
                if let Some(other) = agents_named(&agents, &created.name).first() {
                    return Err(FileError::new(
                        dir.path.join(super::AGENT_TOML),
                        format!(
                            "{:?} is the alias of agent {} ({:?}); give this one another name",
                            created.name, other.id, other.name
                        ),
                    )
                    .into());
                }
                let fields = differences(&BTreeMap::new(), &settings(&created));
                let schedules = schedule_changes(dir, &created.id, &[], &specs, prune, now)?;
                let hooks = hook_specs.iter().map(created_hook).collect();
                let webhooks = webhooks::changes(&webhooks_file, &[], &webhook_specs, prune)?;
                (None, fields, schedules, hooks, webhooks, created)
            }
            Some(agent) => {
                let desired = AgentChanges::to(&new).apply(agent).map_err(invalid)?;
                let fields = differences(&settings(agent), &settings(&desired));
                let have = store.schedules(&agent.id).await?;
                let schedules = schedule_changes(dir, &agent.id, &have, &specs, prune, now)?;
                let hooks = hook_changes(&store.list_hooks(&agent.id).await?, &hook_specs, prune);
                let stored: Vec<Webhook> = store
                    .list_webhooks()
                    .await?
                    .into_iter()
                    .filter(|w| w.agent_id == agent.id)
                    .collect();
                let webhooks = webhooks::changes(&webhooks_file, &stored, &webhook_specs, prune)?;
                (
                    Some(agent.id.clone()),
                    fields,
                    schedules,
                    hooks,
                    webhooks,
                    desired,
                )
            }
        };
        let prompt = heartbeat_prompt(&wanted, &registry, &tool_specs);
        let (sizes, prompt_tokens, prompt_total) =
            count_sizes(dir, &wanted, &prompt, options.tokens).await?;
        // A sender's own secret is read when its webhook is made, and only then.
        for w in &webhooks {
            let WebhookChange::Create { name, .. } = w else {
                continue;
            };
            let var = webhook_specs
                .iter()
                .find(|s| s.name == *name)
                .and_then(|s| s.secret_env.as_deref());
            if let Some(var) = var
                && (options.env)(var).is_none_or(|v| v.trim().is_empty())
            {
                return Err(FileError::new(
                    &webhooks_file,
                    format!(
                        "webhook {name:?}: secret_env names {var}, which is not set: set it to the secret the sender signs with (it is read once, when the webhook is made, and never written in a file)"
                    ),
                )
                .into());
            }
        }
        let unchanged = fields.is_empty()
            && schedules.iter().all(|c| !c.writes())
            && hooks.iter().all(|c| !c.writes())
            && webhooks.iter().all(|c| !c.writes())
            && tools.iter().all(|c| !c.writes())
            && seeds.is_empty();
        let verb = match (&agent_id, unchanged) {
            (None, _) => Verb::Create,
            (Some(_), true) => Verb::Same,
            (Some(_), false) => Verb::Change,
        };
        out.push(AgentPlan {
            dir: dir.path.clone(),
            name: new.name.trim().to_owned(),
            agent_id,
            verb,
            fields,
            schedules,
            hooks,
            webhooks,
            tools,
            memories: seeds
                .iter()
                .map(|m| crate::engine::memory::title(m))
                .collect(),
            sizes,
            prompt_tokens,
            prompt_total,
            new,
            specs,
            hook_specs,
            webhook_specs,
            seeds,
            tool_specs,
        });
    }
    Ok(Plan { agents: out })
}

/// What every heartbeat of `agent` sends before what changes from beat to beat: the
/// system prompt, the tools' definitions (Pulse's, and those of the MCP servers it is
/// given, as the registry or the files have them, within the bytes a request offers),
/// and the instructions.
fn heartbeat_prompt(agent: &Agent, registry: &Registry, specs: &ToolSpecs) -> String {
    use crate::engine::prompt;
    let mut text = prompt::system(agent);
    text.push_str(&serde_json::to_string(&prompt::tools()).unwrap_or_default());
    let mut offered = String::new();
    for given in &agent.tools {
        // As last listed (a server the files make is listed when applied).
        let server = registry
            .tools
            .iter()
            .chain(specs.tools.iter())
            .find(|t| t.name == given.server)
            .and_then(|t| t.mcp_server());
        for tool in server.into_iter().flat_map(|m| m.allowed()) {
            offered.push_str(&serde_json::to_string(tool).unwrap_or_default());
        }
    }
    let mut cut = offered.len().min(crate::domain::MAX_OFFERED_BYTES);
    while !offered.is_char_boundary(cut) {
        cut -= 1;
    }
    text.push_str(&offered[..cut]);
    if let Some(i) = &agent.instructions {
        text.push_str(i);
    }
    text
}

/// Counts `dir`'s texts and the heartbeat prompt's fixed part `prompt` as `agent`'s
/// model does (estimated without a counter); refused, naming the file, its tokens and
/// how they were counted, when a text the model counted is over its token budget.
async fn count_sizes(
    dir: &AgentDir,
    agent: &Agent,
    prompt: &str,
    counter: Option<&crate::llm::tokens::TokenCounter>,
) -> Result<(Vec<Size>, usize, TokenCount), FileError> {
    let mut sizes = dir.sizes();
    let texts: Vec<&str> = [&dir.soul, &dir.heartbeat]
        .into_iter()
        .flatten()
        .map(String::as_str)
        .chain([prompt])
        .collect();
    let mut counts = match counter {
        Some(counter) => counter.count(agent, &texts).await,
        None => texts
            .iter()
            .map(|t| TokenCount::estimate(t, "no model's counting was asked for"))
            .collect(),
    };
    let total = counts
        .pop()
        .unwrap_or_else(|| TokenCount::estimate(prompt, ""));
    for (size, count) in sizes.iter_mut().zip(counts) {
        if count.exact && count.tokens > size.token_budget {
            return Err(FileError::new(
                dir.path.join(size.file),
                format!(
                    "{} tokens, counted by {}; the budget is {} tokens, as it is sent with every model call: shorten it (nothing was applied)",
                    count.tokens, count.by, size.token_budget
                ),
            ));
        }
        size.tokens = count.tokens;
        size.counted_by = count.by;
        size.exact = count.exact;
    }
    let tokens = sizes.iter().map(|s| s.tokens).sum();
    Ok((sizes, tokens, total))
}

/// Every tool the files name is there once they are applied: a subscription's tool is
/// declared by these files or another directory's, or registered (and runs on events: not an MCP server), and
/// each MCP server `agent.toml` gives the agent is declared or registered.
fn check_tool_references(
    dir: &AgentDir,
    new: &NewAgent,
    specs: &ToolSpecs,
    declared: &[crate::domain::Tool],
    registry: &Registry,
) -> Result<(), FileError> {
    let find = |name: &ToolName| {
        specs
            .tools
            .iter()
            .chain(declared.iter())
            .chain(registry.tools.iter())
            .find(|t| t.name == *name)
    };
    for (tool, event, _, _) in &specs.subscriptions {
        match find(tool) {
            Some(t) if t.mcp_server().is_none() => {}
            Some(_) => {
                return Err(FileError::new(
                    dir.path.join(tool_files::TOOLS_TOML),
                    format!(
                        "subscription of {tool} to {event}: {tool} is an MCP server, whose tools the model calls; give the agent `tools = [\"mcp:{tool}\"]` in agent.toml"
                    ),
                ));
            }
            None => {
                return Err(FileError::new(
                    dir.path.join(tool_files::TOOLS_TOML),
                    format!(
                        "subscription of {tool} to {event}: there is no tool {tool}; declare it under [[tool]] or register it with `pulse tools add`"
                    ),
                ));
            }
        }
    }
    for t in &new.tools {
        if find(&t.server).is_none_or(|t| t.mcp_server().is_none()) {
            return Err(FileError::new(
                dir.path.join(super::AGENT_TOML),
                format!(
                    "tools names mcp:{0}, and there is no MCP server {0}: declare it under [[mcp]] in tools.toml, or register it with `pulse tools add-mcp`",
                    t.server
                ),
            ));
        }
    }
    Ok(())
}

/// What becomes of the tools the agent's files own and of its subscriptions when the
/// files ask for `specs`. A tool of that name owned by another agent's files, or the
/// deployment's, is refused; one the agent owns and the files no longer declare is
/// removed only with `prune`, and then only when nothing else uses it.
fn tool_changes(
    file: &std::path::Path,
    existing: Option<&Agent>,
    agents: &[Agent],
    registry: &Registry,
    specs: &ToolSpecs,
    given: &[crate::domain::AgentTool],
    prune: bool,
) -> Result<Vec<ToolChange>, FileError> {
    let mut out = Vec::new();
    let id = existing.map(|a| &a.id);
    for t in &specs.tools {
        match registry.tools.iter().find(|r| r.name == t.name) {
            None => out.push(ToolChange::create(ToolTarget::of(t), tool_files::place(t))),
            Some(r) if r.owner.is_some() && r.owner.as_ref() == id => {
                let fields = tool_files::differences(r, &tool_files::onto(r, t));
                if !fields.is_empty() {
                    out.push(ToolChange::change(ToolTarget::of(t), fields));
                }
            }
            Some(r) => {
                let whose = match &r.owner {
                    None => "the deployment's (registered with `pulse tools add`, shared by every agent)".to_owned(),
                    Some(o) => match agents.iter().find(|a| a.id == *o) {
                        Some(a) => format!("owned by agent {}'s files", a.name),
                        None => format!(
                            "owned by the files of agent {o}, deleted since (`pulse tools remove {}` frees the name)",
                            t.name
                        ),
                    },
                };
                return Err(FileError::new(
                    file,
                    format!(
                        "tool {} is registered already, {whose}: subscribe to it under [[subscription]] without declaring it, or give yours another name",
                        t.name
                    ),
                ));
            }
        }
    }
    let Some(id) = id else {
        out.extend(
            specs
                .subscriptions
                .iter()
                .map(|(tool, event, order, filter)| {
                    ToolChange::create(
                        ToolTarget::Subscription(tool.clone(), event.clone()),
                        tool_files::describe_route(*order, filter),
                    )
                }),
        );
        return Ok(out);
    };
    let stored: Vec<_> = registry
        .subscriptions
        .iter()
        .filter(|s| s.agent_id.as_ref() == Some(id))
        .collect();
    for (tool, event, order, filter) in &specs.subscriptions {
        match stored
            .iter()
            .find(|s| s.tool == *tool && s.event_type == *event)
        {
            Some(s) => {
                let fields = tool_files::subscription_fields(s, *order, filter);
                if !fields.is_empty() {
                    out.push(ToolChange::change(
                        ToolTarget::Subscription(tool.clone(), event.clone()),
                        fields,
                    ));
                }
            }
            None => out.push(ToolChange::create(
                ToolTarget::Subscription(tool.clone(), event.clone()),
                tool_files::describe_route(*order, filter),
            )),
        }
    }
    let wanted = |tool: &ToolName, event: &EventType| {
        specs
            .subscriptions
            .iter()
            .any(|(t, e, _, _)| t == tool && e == event)
    };
    for s in stored.iter().filter(|s| !wanted(&s.tool, &s.event_type)) {
        out.push(ToolChange::remove(
            ToolTarget::Subscription(s.tool.clone(), s.event_type.clone()),
            prune,
        ));
    }
    let mut owned: Vec<_> = registry
        .tools
        .iter()
        .filter(|r| r.owner.as_ref() == Some(id))
        .filter(|r| !specs.tools.iter().any(|t| t.name == r.name))
        .collect();
    owned.sort_by(|a, b| a.name.cmp(&b.name));
    for r in owned {
        if prune {
            let subscribed = registry
                .subscriptions
                .iter()
                .any(|s| s.tool == r.name && s.agent_id.as_ref() != Some(id))
                || specs.subscriptions.iter().any(|(t, ..)| *t == r.name);
            let attached = given.iter().any(|t| t.server == r.name)
                || agents
                    .iter()
                    .any(|a| a.id != *id && a.tools.iter().any(|t| t.server == r.name));
            if subscribed || attached {
                return Err(FileError::new(
                    file,
                    format!(
                        "{} is no longer declared, and --prune cannot remove it: {} still uses it; keep it in tools.toml, or take it from them first",
                        tool_files::label(r),
                        if subscribed {
                            "a subscription"
                        } else {
                            "an agent"
                        }
                    ),
                ));
            }
        }
        out.push(ToolChange::remove(ToolTarget::of(r), prune));
    }
    Ok(out)
}

fn created_hook(s: &HookSpec) -> HookChange {
    HookChange::Create {
        name: s.name.clone(),
        hook_type: s.hook_type.as_str().to_owned(),
        url: s.target.to_string(),
    }
}

/// What becomes of `stored` hooks when the files ask for `specs`.
fn hook_changes(stored: &[Hook], specs: &[HookSpec], prune: bool) -> Vec<HookChange> {
    let mut out = Vec::new();
    let mut matched = std::collections::HashSet::new();
    let mut stored: Vec<&Hook> = stored.iter().collect();
    stored.sort_by(|a, b| a.id.cmp(&b.id));
    for h in stored {
        let name = h.name.clone().unwrap_or_else(|| h.id.to_string());
        let key = (name.to_ascii_lowercase(), h.hook_type.as_str().to_owned());
        match specs.iter().find(|s| s.key() == key) {
            Some(spec) if matched.insert(key.clone()) => {
                let fields = hooks::differences(h, &spec.onto(h));
                if !fields.is_empty() {
                    out.push(HookChange::Change {
                        name: spec.name.clone(),
                        hook_type: key.1,
                        id: h.id.clone(),
                        fields,
                    });
                }
            }
            _ => out.push(HookChange::Remove {
                name,
                hook_type: key.1,
                id: h.id.clone(),
                pruned: prune,
            }),
        }
    }
    out.extend(
        specs
            .iter()
            .filter(|s| !matched.contains(&s.key()))
            .map(created_hook),
    );
    out
}

/// Writes the hook changes of one agent; the secrets of hooks made with a new one.
async fn apply_hooks(
    store: &Arc<dyn Store>,
    agent: &AgentId,
    agent_name: &str,
    p: &AgentPlan,
    now: Timestamp,
) -> Result<Vec<NewSecret>, PlanError> {
    let mut secrets = Vec::new();
    for change in &p.hooks {
        match change {
            HookChange::Create {
                name, hook_type, ..
            } => {
                let spec = p.hook_spec(name, hook_type);
                // Hooks of one name sign with one secret: a sibling's, else a new one.
                let sibling = store
                    .list_hooks(agent)
                    .await?
                    .into_iter()
                    .find(|h| {
                        h.unreadable.is_none()
                            && h.name
                                .as_deref()
                                .is_some_and(|n| n.eq_ignore_ascii_case(name))
                    })
                    .map(|h| h.secret.expose().to_owned());
                let secret = match sibling {
                    Some(s) => s,
                    None => {
                        let s = pulse_signatures::inbound::generate_secret();
                        secrets.push(NewSecret {
                            agent: agent_name.to_owned(),
                            hook: name.clone(),
                            secret: s.clone(),
                        });
                        s
                    }
                };
                let hook = Hook::new(
                    agent.clone(),
                    spec.hook_type.clone(),
                    spec.target.clone(),
                    &secret,
                    now,
                );
                store.create_hook(&spec.onto(&hook)).await?;
            }
            HookChange::Change {
                id,
                name,
                hook_type,
                ..
            } => {
                let spec = p.hook_spec(name, hook_type);
                let mut written = false;
                for _ in 0..5 {
                    let Some(stored) = store.get_hook(id).await? else {
                        break;
                    };
                    let mut hook = spec.onto(&stored);
                    hook.version += 1;
                    match store.update_hook(&hook).await {
                        Ok(()) => {
                            written = true;
                            break;
                        }
                        Err(StoreError::Conflict(_)) => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                if !written {
                    return Err(StoreError::Conflict(format!(
                        "hook {id} kept changing while it was updated, or was deleted; apply again"
                    ))
                    .into());
                }
            }
            HookChange::Remove {
                id, pruned: true, ..
            } => store.delete_hook(id).await?,
            HookChange::Remove { pruned: false, .. } => {}
        }
    }
    Ok(secrets)
}

/// Makes and changes the tools the agent's files own (an MCP server listed through
/// `mcp` when made or moved), each owned by `agent`.
async fn make_tools(
    store: &Arc<dyn Store>,
    agent: &AgentId,
    p: &AgentPlan,
    mcp: Option<&crate::tools::McpClients>,
    now: Timestamp,
) -> Result<(), PlanError> {
    let file = p.dir.join(tool_files::TOOLS_TOML);
    let mut registry = None;
    for change in &p.tools {
        let create = match change {
            ToolChange::Create { .. } => true,
            ToolChange::Change { .. } => false,
            ToolChange::Remove { .. } => continue,
        };
        let Some(spec) = p
            .tool_specs
            .tools
            .iter()
            .find(|t| ToolTarget::of(t) == *change.target())
        else {
            continue;
        };
        if create {
            let mut tool = spec.clone();
            tool.owner = Some(agent.clone());
            tool.created_at = now;
            if tool.mcp_server().is_some() {
                tool = listed(mcp, &file, tool, now).await?;
            }
            store.add_tool(&tool).await?;
            continue;
        }
        if registry.is_none() {
            registry = Some(store.load_registry().await?);
        }
        let Some(stored) = registry
            .as_ref()
            .and_then(|r| r.tools.iter().find(|t| t.name == spec.name))
        else {
            return Err(StoreError::NotFound(format!(
                "tool {}, removed meanwhile; apply again",
                spec.name
            ))
            .into());
        };
        let mut tool = tool_files::onto(stored, spec);
        if tool_files::relist(stored, &tool) {
            tool = listed(mcp, &file, tool, now).await?;
        }
        store.update_tool(&tool).await?;
    }
    Ok(())
}

/// `tool` (an MCP server) with its tools as it lists them now; refused, with nothing
/// more applied, when it cannot be reached or does not list a tool its allow-list names.
async fn listed(
    mcp: Option<&crate::tools::McpClients>,
    file: &std::path::Path,
    mut tool: crate::domain::Tool,
    now: Timestamp,
) -> Result<crate::domain::Tool, PlanError> {
    let Some(clients) = mcp else {
        return Err(FileError::new(
            file,
            format!(
                "MCP server {}: its tools are listed when it is made, and this apply was given no MCP client",
                tool.name
            ),
        )
        .into());
    };
    let mut server = tool.mcp_server().cloned().expect("an MCP server");
    let (tools, left_out) = clients
        .list(&tool.name, &server)
        .await
        .map_err(|why| FileError::new(file, format!("{why}; it was not applied")))?;
    for why in left_out {
        tracing::warn!(server = %tool.name, "{why}");
    }
    server.tools = tools;
    server.listed_at = Some(now);
    let missing = server.missing_allowed();
    if !missing.is_empty() {
        let have: Vec<&str> = server.tools.iter().map(|t| t.name.as_str()).collect();
        return Err(FileError::new(
            file,
            format!(
                "MCP server {}: allow names tools it does not list: {}; it lists {}",
                tool.name,
                missing.join(", "),
                have.join(", ")
            ),
        )
        .into());
    }
    tool.kind = crate::domain::ToolKind::Mcp(Box::new(server));
    Ok(tool)
}

/// Makes, changes and (pruned) removes the agent's subscriptions, then removes the
/// tools its files no longer declare (pruned).
async fn finish_tools(
    store: &Arc<dyn Store>,
    agent: &AgentId,
    p: &AgentPlan,
    now: Timestamp,
) -> Result<(), PlanError> {
    if p.tools.iter().all(|c| !c.writes()) {
        return Ok(());
    }
    let registry = store.load_registry().await?;
    let stored = |tool: &ToolName, event: &EventType| {
        registry.subscriptions.iter().find(|s| {
            s.agent_id.as_ref() == Some(agent) && s.tool == *tool && s.event_type == *event
        })
    };
    for (tool, event, order, filter) in &p.tool_specs.subscriptions {
        let target = ToolTarget::Subscription(tool.clone(), event.clone());
        let Some(change) = p.tools.iter().find(|c| *c.target() == target) else {
            continue;
        };
        let mut made = tool_files::subscription(agent, tool, event, *order, filter, now);
        if let ToolChange::Change { .. } = change
            && let Some(old) = stored(tool, event)
        {
            // Changed in place: its id, its switch and its date kept.
            store.remove_subscription(&old.id).await?;
            made.id = old.id.clone();
            made.active = old.active;
            made.created_at = old.created_at;
        }
        store.add_subscription(&made).await?;
    }
    let pruned = p
        .tools
        .iter()
        .filter(|c| matches!(c, ToolChange::Remove { pruned: true, .. }))
        .map(ToolChange::target);
    // Subscriptions first: a tool goes once nothing of this agent's runs it.
    let (subscriptions, tools): (Vec<_>, Vec<_>) =
        pruned.partition(|t| matches!(t, ToolTarget::Subscription(..)));
    for target in subscriptions {
        if let ToolTarget::Subscription(tool, event) = target
            && let Some(old) = stored(tool, event)
        {
            store.remove_subscription(&old.id).await?;
        }
    }
    for tool in tools.into_iter().filter_map(ToolTarget::tool) {
        store.remove_tool(tool).await?;
    }
    Ok(())
}

/// Writes the webhook changes of one agent; the webhooks made.
async fn apply_webhooks(
    store: &Arc<dyn Store>,
    agent: &AgentId,
    agent_name: &str,
    p: &AgentPlan,
    env: &dyn Fn(&str) -> Option<String>,
    now: Timestamp,
) -> Result<Vec<NewWebhook>, PlanError> {
    let mut made = Vec::new();
    for change in &p.webhooks {
        let spec_of = |name: &str| {
            p.webhook_specs
                .iter()
                .find(|s| s.name == name)
                .expect("a planned webhook has its spec")
        };
        match change {
            WebhookChange::Create { name, .. } => {
                let spec = spec_of(name);
                let given = spec.secret_env.as_deref().and_then(env);
                let secret = given
                    .clone()
                    .unwrap_or_else(pulse_signatures::inbound::generate_secret);
                pulse_signatures::inbound::sign(spec.scheme.signing(), &secret, b"{}", 0, "check")
                    .map_err(|e| {
                        FileError::new(
                            p.dir.join(webhooks::WEBHOOKS_TOML),
                            format!(
                                "webhook {name:?}: the secret is not one the {} scheme takes: {e}",
                                spec.scheme
                            ),
                        )
                    })?;
                let webhook = Webhook::new(agent.clone(), spec.scheme, &secret, now)
                    .map_err(LifecycleError::Invalid)?;
                let webhook = spec.onto(&webhook);
                store.create_webhook(&webhook).await?;
                made.push(NewWebhook {
                    agent: agent_name.to_owned(),
                    name: name.clone(),
                    id: webhook.id.clone(),
                    secret: given.is_none().then_some(secret),
                });
            }
            WebhookChange::Change { id, name, .. } => {
                let Some(stored) = store.get_webhook(id).await? else {
                    return Err(StoreError::NotFound(format!(
                        "webhook {id}, deleted meanwhile; apply again"
                    ))
                    .into());
                };
                store.update_webhook(&spec_of(name).onto(&stored)).await?;
            }
            WebhookChange::Remove {
                id, pruned: true, ..
            } => store.delete_webhook(id).await?,
            WebhookChange::Remove { pruned: false, .. } => {}
        }
    }
    Ok(made)
}

/// Carries `plan` out: creates and changes agents and their schedules, and puts an
/// [`APPLIED`] event in each changed agent's log with what changed and `source` (a
/// file, a commit). Stops at the first refusal, saying which agent; what was applied
/// before it stays (applying again finishes the rest).
pub async fn apply(
    store: &Arc<dyn Store>,
    ops: &Lifecycle,
    plan: &Plan,
    options: &ApplyOptions<'_>,
    now: Timestamp,
) -> Result<Applied, PlanError> {
    let source = options.source;
    let mut applied = Applied::default();
    // First every agent to make, and every tool the files declare: a tool one directory
    // declares is then there when another's settings give it or its subscriptions name it.
    let mut ids = Vec::with_capacity(plan.agents.len());
    for p in &plan.agents {
        let id = match (&p.agent_id, p.verb) {
            (_, Verb::Same) => None,
            (Some(id), _) => Some(id.clone()),
            (None, _) => {
                let (agent, first) = p.new.clone().create(now).map_err(LifecycleError::Invalid)?;
                store.create_agent(&agent, &first).await?;
                applied.created.push(agent.id.clone());
                Some(agent.id)
            }
        };
        if let Some(id) = &id {
            make_tools(store, id, p, options.mcp, now).await?;
        }
        ids.push(id);
    }
    for (p, id) in plan.agents.iter().zip(ids) {
        let Some(id) = id else {
            applied.same += 1;
            continue;
        };
        if p.agent_id.is_some() {
            if !p.fields.is_empty() {
                ops.update(&id, &AgentChanges::to(&p.new)).await?;
            }
            applied.changed.push(id.clone());
        }
        for change in &p.schedules {
            match change {
                ScheduleChange::Create { name, .. } => {
                    let spec = p.specs[&name.to_ascii_lowercase()].clone();
                    ops.schedule_spec(&id, spec).await?;
                }
                ScheduleChange::Replace { name, id: old, .. } => {
                    ops.unschedule(&id, old).await?;
                    let spec = p.specs[&name.to_ascii_lowercase()].clone();
                    ops.schedule_spec(&id, spec).await?;
                }
                ScheduleChange::Remove {
                    id: old,
                    pruned: true,
                    ..
                } => {
                    ops.unschedule(&id, old).await?;
                }
                ScheduleChange::Remove { pruned: false, .. } => {}
            }
        }
        applied
            .secrets
            .extend(apply_hooks(store, &id, &p.name, p, now).await?);
        applied
            .webhooks
            .extend(apply_webhooks(store, &id, &p.name, p, options.env, now).await?);
        finish_tools(store, &id, p, now).await?;
        apply_seeds(store, &id, p, options.memories, now).await?;
        mark_applied(store, &id, p, source, now).await?;
        let mut changed: Vec<String> = p.fields.iter().map(|f| f.field.clone()).collect();
        changed.extend(p.schedules.iter().filter(|c| c.writes()).map(|c| match c {
            ScheduleChange::Create { name, .. } => format!("schedule {name} made"),
            ScheduleChange::Replace { name, .. } => format!("schedule {name} changed"),
            ScheduleChange::Remove { name, .. } => format!("schedule {name} removed"),
        }));
        changed.extend(p.hooks.iter().filter(|c| c.writes()).map(|c| match c {
            HookChange::Create {
                name, hook_type, ..
            } => format!("hook {name} {hook_type} made"),
            HookChange::Change {
                name, hook_type, ..
            } => {
                format!("hook {name} {hook_type} changed")
            }
            HookChange::Remove {
                name, hook_type, ..
            } => {
                format!("hook {name} {hook_type} removed")
            }
        }));
        changed.extend(p.tools.iter().filter(|c| c.writes()).map(|c| match c {
            ToolChange::Create { name, .. } => format!("{name} made"),
            ToolChange::Change { name, .. } => format!("{name} changed"),
            ToolChange::Remove { name, .. } => format!("{name} removed"),
        }));
        let payload = json!({
            "verb": p.verb,
            "changed": changed,
            "dir": p.dir.display().to_string(),
            "source": source,
        });
        let event = NewEvent::new(APPLIED, payload, None)
            .map_err(LifecycleError::Invalid)?
            .into_event(id.clone(), "apply", now);
        store.append(&event).await?;
    }
    Ok(applied)
}
