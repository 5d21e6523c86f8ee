//! `pulse apply DIR…` and `pulse export AGENT DIR`: agents kept as directories of files
//! (see `pulse_shared::agent_dir`), applied with a plan, written back from the store.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use clap::Args;
use pulse_shared::agent_dir::{
    self, AgentDir, AgentPlan, ApplyOptions, HookChange, Owned, Plan, PlanOptions, ScheduleChange,
    ToolChange, Verb, WebhookChange,
};
use pulse_shared::engine::EngineSettings;

use super::{AgentRef, Ctx, agent_ref};
use crate::Failure;
use crate::output::{count, outln};

#[derive(Args, Debug)]
pub(crate) struct ApplyArgs {
    /// Agent directories, each holding agent.toml (and SOUL.md, HEARTBEAT.md,
    /// schedules.toml as it needs).
    #[arg(required = true, value_name = "DIR")]
    dirs: Vec<PathBuf>,
    /// Apply without asking (for CI).
    #[arg(long, conflicts_with_all = ["dry_run", "check"])]
    yes: bool,
    /// Print the plan and apply nothing: exits 0 when nothing would change, 2 when
    /// something would.
    #[arg(long, conflicts_with = "check")]
    dry_run: bool,
    /// Say where the store differs from the files (an edit made in the dashboard or the
    /// CLI) and exit 1 when it does; applies nothing.
    #[arg(long)]
    check: bool,
    /// Remove what the store has and the files do not (schedules); never an agent, its
    /// memories or its history.
    #[arg(long)]
    prune: bool,
    /// Where the files come from, recorded with each change (e.g. a commit:
    /// `--source "$(git rev-parse --short HEAD)"`).
    #[arg(long, value_name = "TEXT")]
    source: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct ExportArgs {
    /// The agent: its id, name or alias.
    agent: String,
    /// The directory to write: agent.toml, SOUL.md, HEARTBEAT.md, schedules.toml.
    dir: PathBuf,
    /// Write over files already there.
    #[arg(long)]
    force: bool,
}

enum Mode {
    Ask,
    Yes,
    DryRun,
    Check,
}

pub(crate) struct ApplyPlan {
    dirs: Vec<AgentDir>,
    mode: Mode,
    prune: bool,
    source: Option<String>,
}

pub(crate) struct ExportPlan {
    agent: AgentRef,
    dir: PathBuf,
    force: bool,
}

/// Reads and checks every directory before anything is opened.
pub(crate) fn plan(a: ApplyArgs) -> Result<ApplyPlan, Failure> {
    let dirs = a
        .dirs
        .iter()
        .map(|d| AgentDir::read(d).map_err(|e| Failure::Input(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    for d in &dirs {
        d.new_agent().map_err(|e| Failure::Input(e.to_string()))?;
    }
    let mode = match (a.yes, a.dry_run, a.check) {
        (true, _, _) => Mode::Yes,
        (_, true, _) => Mode::DryRun,
        (_, _, true) => Mode::Check,
        _ => Mode::Ask,
    };
    Ok(ApplyPlan {
        dirs,
        mode,
        prune: a.prune,
        source: a
            .source
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty()),
    })
}

pub(crate) fn plan_export(a: ExportArgs) -> Result<ExportPlan, Failure> {
    Ok(ExportPlan {
        agent: agent_ref(&a.agent)?,
        dir: a.dir,
        force: a.force,
    })
}

impl ApplyPlan {
    /// A first apply makes the database; so may its dry run (against an empty store:
    /// everything is to create).
    pub(crate) fn writes(&self) -> bool {
        true
    }
}

fn unset(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("(unset)")
}

fn print_agent(p: &AgentPlan) {
    let verb = match p.verb {
        Verb::Create => "create",
        Verb::Change => "change",
        Verb::Same => "no changes",
    };
    outln!("{} ({}): {verb}", p.name, p.dir.display());
    for f in &p.fields {
        match (p.verb, &f.before, &f.after) {
            (Verb::Create, _, after) => outln!("  + {} = {}", f.field, unset(after)),
            (_, None, after) => outln!("  + {} = {}", f.field, unset(after)),
            (_, before, None) => outln!("  - {} (was {})", f.field, unset(before)),
            (_, before, after) => {
                outln!("  ~ {}: {} -> {}", f.field, unset(before), unset(after))
            }
        }
    }
    for s in &p.schedules {
        match s {
            ScheduleChange::Create { name, rule } => outln!("  + schedule {name}: {rule}"),
            ScheduleChange::Replace {
                name,
                before,
                after,
                ..
            } => outln!("  ~ schedule {name}: {before} -> {after}"),
            ScheduleChange::Remove {
                name,
                rule,
                pruned: true,
                ..
            } => outln!("  - schedule {name}: {rule}"),
            ScheduleChange::Remove { name, rule, .. } => outln!(
                "  ! schedule {name}: {rule}: in the store, not in the files; kept (--prune removes it)"
            ),
        }
    }
    for h in &p.hooks {
        match h {
            HookChange::Create {
                name,
                hook_type,
                url,
            } => outln!("  + hook {name} {hook_type}: {url}"),
            HookChange::Change {
                name,
                hook_type,
                fields,
                ..
            } => {
                let fields: Vec<String> = fields
                    .iter()
                    .map(|f| format!("{}: {} -> {}", f.field, unset(&f.before), unset(&f.after)))
                    .collect();
                outln!("  ~ hook {name} {hook_type}: {}", fields.join("; "));
            }
            HookChange::Remove {
                name,
                hook_type,
                pruned: true,
                ..
            } => outln!("  - hook {name} {hook_type}"),
            HookChange::Remove {
                name, hook_type, ..
            } => outln!(
                "  ! hook {name} {hook_type}: in the store, not in the files; kept (--prune removes it)"
            ),
        }
    }
    for w in &p.webhooks {
        match w {
            WebhookChange::Create { name, scheme } => {
                outln!("  + webhook {name} ({scheme}): a new URL and secret, shown once applied")
            }
            WebhookChange::Change { name, fields, .. } => {
                let fields: Vec<String> = fields
                    .iter()
                    .map(|f| format!("{}: {} -> {}", f.field, unset(&f.before), unset(&f.after)))
                    .collect();
                outln!("  ~ webhook {name}: {}", fields.join("; "));
            }
            WebhookChange::Remove {
                name, pruned: true, ..
            } => outln!("  - webhook {name}: its URL answers 404 from then on"),
            WebhookChange::Remove { name, .. } => outln!(
                "  ! webhook {name}: in the store, not in the files; kept (--prune removes it)"
            ),
        }
    }
    for t in &p.tools {
        match t {
            ToolChange::Create { name, detail, .. } => outln!("  + {name}: {detail}"),
            ToolChange::Change { name, fields, .. } => {
                let fields: Vec<String> = fields
                    .iter()
                    .map(|f| format!("{}: {} -> {}", f.field, unset(&f.before), unset(&f.after)))
                    .collect();
                outln!("  ~ {name}: {}", fields.join("; "));
            }
            ToolChange::Remove {
                name, pruned: true, ..
            } => outln!("  - {name}"),
            ToolChange::Remove { name, .. } => {
                outln!("  ! {name}: in the store, not in the files; kept (--prune removes it)")
            }
        }
    }
    for m in &p.memories {
        outln!("  + memory: {m}");
    }
    if !p.sizes.is_empty() {
        let sizes: Vec<String> = p
            .sizes
            .iter()
            .map(|s| {
                let tokens = if s.exact {
                    format!("{} of {} tokens", s.tokens, s.token_budget)
                } else {
                    format!("about {} tokens", s.tokens)
                };
                format!(
                    "{} {} of {} characters, {tokens}",
                    s.file, s.chars, s.budget
                )
            })
            .collect();
        outln!(
            "  sizes: {}; each heartbeat's prompt carries {}{} tokens of them",
            sizes.join(", "),
            if p.sizes.iter().all(|s| s.exact) {
                ""
            } else {
                "about "
            },
            p.prompt_tokens
        );
    }
    let total = &p.prompt_total;
    outln!(
        "  every heartbeat's prompt starts with {}{} tokens (the system prompt with SOUL.md, the tools' definitions, HEARTBEAT.md), before its events, memories and history; counted by {}",
        if total.exact { "" } else { "about " },
        total.tokens,
        total.by
    );
}

fn print_plan(plan: &Plan) {
    for p in &plan.agents {
        print_agent(p);
    }
    let of = |v: Verb| plan.agents.iter().filter(|p| p.verb == v).count();
    outln!(
        "plan: {} to create, {} to change, {} unchanged; {}",
        count(of(Verb::Create), "agent"),
        of(Verb::Change),
        of(Verb::Same),
        count(plan.changes(), "change")
    );
}

/// With --json, the one document: the plan, how many writes it makes, and what was
/// applied (null when nothing was).
fn print_json(cx: &Ctx<'_>, plan: &Plan, applied: Option<&agent_dir::Applied>) {
    cx.out.json_value(&serde_json::json!({
        "plan": plan,
        "changes": plan.changes(),
        "applied": applied,
    }));
}

/// Asks on a terminal; elsewhere, refuses without `--yes`.
fn confirmed() -> Result<bool, Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(Failure::Input(
            "nothing applied: run again with --yes to apply this plan (or --dry-run to only print it)".into(),
        ));
    }
    print!("apply this plan? [y/N] ");
    std::io::stdout().flush().ok();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}

pub(crate) async fn execute(p: ApplyPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let store = &cx.b.store;
    let now = cx.clock.now();
    let env = |var: &str| std::env::var(var).ok();
    // Texts are counted as each agent's model counts them: OpenAI's tokenizers here,
    // Anthropic's count-tokens endpoint with the configured key.
    let counter = pulse_shared::llm::tokens::TokenCounter::new(
        cx.config.llm.clone(),
        pulse_shared::app::egress(cx.config),
    );
    let options = PlanOptions {
        prune: p.prune,
        event_bus: cx.b.bus.is_some(),
        env: &env,
        tokens: Some(&counter),
    };
    let plan = agent_dir::plan(store.as_ref(), &p.dirs, &options, now)
        .await
        .map_err(failure)?;
    let json = cx.out.json;
    if !json {
        print_plan(&plan);
    }
    let changes = plan.changes();
    let stop = match p.mode {
        Mode::Check if changes == 0 => Some(Ok("the store matches the files")),
        Mode::Check => Some(Err(Failure::Attention(format!(
            "the store differs from the files ({}): apply the files with `pulse apply --yes`, or write the store's settings out with `pulse export AGENT DIR`",
            count(changes, "difference")
        )))),
        _ if changes == 0 => Some(Ok("nothing to change: the store matches the files")),
        Mode::DryRun => Some(Err(Failure::Planned(format!(
            "{} planned; nothing applied (--dry-run)",
            count(changes, "change")
        )))),
        Mode::Ask if json => Some(Err(Failure::Input(
            "nothing applied: with --json, give --yes to apply (or --dry-run to only plan)".into(),
        ))),
        Mode::Ask if !confirmed()? => Some(Err(Failure::Input("nothing applied".into()))),
        Mode::Ask | Mode::Yes => None,
    };
    if let Some(stop) = stop {
        if json {
            print_json(cx, &plan, None);
        }
        return match stop {
            Ok(note) => {
                if !json {
                    eprintln!("{note}");
                }
                Ok(())
            }
            Err(e) => Err(e),
        };
    }
    let ops = cx.b.lifecycle(cx.clock.clone(), &EngineSettings::default());
    let services = pulse_shared::app::Services::from_config(cx.config);
    let book = cx.b.memories(&services);
    // MCP servers the files declare are listed as they are made, as `tools add-mcp` does.
    let local = p
        .dirs
        .iter()
        .any(|d| d.tools.servers.iter().any(|m| !m.command.is_empty()));
    if local {
        super::mcp::local_servers(cx.config)?;
    }
    let agent_tools = cx.b.agent_tools_with(cx.clock.clone(), &services, local);
    let applied = agent_dir::apply(
        store,
        &ops,
        &plan,
        &ApplyOptions {
            source: p.source.as_deref(),
            env: &env,
            memories: Some(&book),
            mcp: Some(agent_tools.clients()),
        },
        now,
    )
    .await
    .map_err(failure)?;
    // Where the receiver is reachable, for the URLs of webhooks made.
    let base = std::env::var("PULSE_PUBLIC_URL")
        .ok()
        .or_else(|| cx.public_url.clone())
        .unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
    let base = base.trim_end_matches('/');
    if json {
        print_json(cx, &plan, Some(&applied));
    } else {
        outln!(
            "applied: {} created, {} changed, {} unchanged",
            count(applied.created.len(), "agent"),
            applied.changed.len(),
            applied.same
        );
        for w in &applied.webhooks {
            match &w.secret {
                Some(secret) => outln!(
                    "webhook {} of {}: {base}/webhooks/{} signed with {secret} (shown this once: give both to the sender)",
                    w.name,
                    w.agent,
                    w.id
                ),
                None => outln!(
                    "webhook {} of {}: {base}/webhooks/{} (signed with the secret its variable held)",
                    w.name,
                    w.agent,
                    w.id
                ),
            }
        }
        for s in &applied.secrets {
            outln!(
                "hook {} of {} signs with {} (shown this once: give it to the receiver)",
                s.hook,
                s.agent,
                s.secret
            );
        }
    }
    Ok(())
}

fn failure(e: agent_dir::PlanError) -> Failure {
    match e {
        agent_dir::PlanError::Store(e) => super::store(e),
        agent_dir::PlanError::Lifecycle(e) => super::agents::lifecycle_failure(e),
        agent_dir::PlanError::File(e) => Failure::Input(e.to_string()),
    }
}

pub(crate) async fn export(p: ExportPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let agent = p.agent.find(cx.b).await?;
    let own = Owned::of(cx.b.store.as_ref(), &agent.id).await?;
    let dir = AgentDir::of(&agent, &own, &p.dir);
    let files = dir.files();
    if !p.force {
        let there: Vec<String> = files
            .iter()
            .map(|(name, _)| p.dir.join(name))
            .filter(|f| f.exists())
            .map(|f| f.display().to_string())
            .collect();
        if !there.is_empty() {
            return Err(Failure::Input(format!(
                "{} already there; nothing written (--force writes over them)",
                there.join(", ")
            )));
        }
    }
    std::fs::create_dir_all(&p.dir)
        .map_err(|e| Failure::Input(format!("cannot make {}: {e}", p.dir.display())))?;
    let mut written = Vec::new();
    for (name, text) in &files {
        let path = p.dir.join(name);
        std::fs::write(&path, text)
            .map_err(|e| Failure::Input(format!("cannot write {}: {e}", path.display())))?;
        written.push(*name);
    }
    cx.out.done(&format!(
        "wrote agent {} ({}) to {}: {}; `pulse apply {}` now changes nothing",
        agent.name,
        agent.id,
        p.dir.display(),
        written.join(", "),
        p.dir.display()
    ));
    let variables: Vec<&String> = dir
        .tools
        .tools
        .iter()
        .flat_map(|t| t.config_env.values())
        .chain(
            dir.tools
                .servers
                .iter()
                .flat_map(|m| m.headers_env.values()),
        )
        .collect();
    if !variables.is_empty() {
        eprintln!(
            "note: tools.toml names the variables that hold its tools' config values and headers, never written in a file: set {} before applying these files",
            variables
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for h in dir.hooks.iter().filter(|h| h.auth_header_env.is_some()) {
        eprintln!(
            "note: hook {} sends an Authorization header, never written in a file: set {} to it before applying these files",
            h.name,
            h.auth_header_env.as_deref().unwrap_or_default()
        );
    }
    Ok(())
}
