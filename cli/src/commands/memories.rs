//! `pulse memories …`: what agents remember — listed, added, recalled as the agent
//! recalls, forgotten, embedded again, consolidated and restored.

use std::sync::Arc;

use clap::{Subcommand, ValueEnum};
use pulse_shared::app::Services;
use pulse_shared::domain::{Agent, Memory, MemoryId, MemoryKind, MemorySource, MemoryStatus};
use pulse_shared::engine::memory::{self, Found, Memories, Recall, consolidate};
use serde::Serialize;

use super::{AgentRef, Ctx, agent_ref, input, limit};
use crate::Failure;
use crate::output::{count, short, when};

#[derive(Subcommand, Debug)]
pub(crate) enum MemoriesCmd {
    /// An agent's memories, newest first, with kind, status and weight.
    List {
        /// The agent: its id, name or alias.
        #[arg(long)]
        agent: String,
        /// Only those in this state.
        #[arg(long, value_enum)]
        status: Option<Shown>,
        /// Only those of this kind (fact, preference, plan, episode, summary).
        #[arg(long)]
        kind: Option<String>,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Gives an agent a memory, as its operator (embedded now, recalled by meaning).
    Add {
        /// The agent: its id, name or alias.
        #[arg(long)]
        agent: Option<String>,
        /// What to remember (at most 4,000 characters). The agent may come first instead
        /// of --agent: `memories add scout "…"`.
        #[arg(value_name = "TEXT", num_args = 1..=2, required = true)]
        words: Vec<String>,
        /// fact, preference, plan, episode or summary.
        #[arg(long, default_value = "fact")]
        kind: String,
        /// How much it matters, from 0 to 1.
        #[arg(long, default_value_t = 0.5)]
        importance: f32,
    },
    /// What the agent would recall for QUERY: the same search by meaning and words,
    /// weight and importance, each with its title and when it was last recalled. Looking
    /// does not reinforce, unless --reinforce. With --id, one memory whole.
    Recall {
        /// The agent: its id, name or alias.
        #[arg(long)]
        agent: Option<String>,
        /// What to look for. The agent may come first instead of --agent: `memories
        /// recall scout "…"`.
        #[arg(value_name = "QUERY", num_args = 1..=2, required_unless_present = "id")]
        words: Vec<String>,
        /// One memory (`mem_…`) instead of a search: shown whole, nothing reinforced
        /// (without --agent, every agent is searched for it).
        #[arg(
            long,
            value_name = "MEM_ID",
            conflicts_with_all = ["words", "reinforce", "limit"]
        )]
        id: Option<String>,
        /// How many, at most.
        #[arg(long, default_value_t = 5)]
        limit: usize,
        /// Reinforce what is found and bring back suspended ones, as the agent's own
        /// recall does.
        #[arg(long)]
        reinforce: bool,
    },
    /// Deletes a memory.
    Forget {
        /// The memory's id (`mem_…`).
        id: String,
        /// Its agent; without it, every agent is searched.
        #[arg(long)]
        agent: Option<String>,
    },
    /// Embeds every memory that has no vector of the configured embedding model (after a
    /// change of PULSE_EMBED_MODEL or PULSE_EMBED_DIMENSIONS, or an outage).
    Reindex {
        /// One agent; without it, every agent.
        #[arg(long)]
        agent: Option<String>,
    },
    /// Runs an agent's consolidation now: near-duplicates merged, old faded episodes
    /// summed up by its model (spending its tokens); at most 25 % of its active memories.
    Consolidate {
        /// The agent: its id, name or alias.
        #[arg(long)]
        agent: Option<String>,
        /// The agent, given without --agent (`memories consolidate scout`).
        #[arg(hide = true, value_name = "AGENT")]
        named: Option<String>,
    },
    /// Undoes a consolidation: a summary gives back what it folded (and goes); a memory
    /// others were merged into gives them back; a folded memory comes back.
    Restore {
        /// The memory's id (`mem_…`).
        id: String,
        /// Its agent; without it, every agent is searched.
        #[arg(long)]
        agent: Option<String>,
    },
}

/// A memory's state in a listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Shown {
    /// Recalled and carried in prompts.
    Active,
    /// Faded under 0.1: found again only by a close recall.
    Suspended,
    /// Merged into another memory or a summary (restore undoes it).
    Folded,
}

/// A validated memories command.
pub(crate) enum MemoriesPlan {
    List {
        agent: AgentRef,
        status: Option<Shown>,
        kind: Option<MemoryKind>,
        limit: usize,
    },
    Add {
        agent: AgentRef,
        text: String,
        kind: MemoryKind,
        importance: f32,
    },
    Recall {
        agent: AgentRef,
        query: String,
        limit: usize,
        reinforce: bool,
    },
    RecallId {
        id: MemoryId,
        agent: Option<AgentRef>,
    },
    Forget {
        id: MemoryId,
        agent: Option<AgentRef>,
    },
    Reindex {
        agent: Option<AgentRef>,
    },
    Consolidate {
        agent: AgentRef,
    },
    Restore {
        id: MemoryId,
        agent: Option<AgentRef>,
    },
}

/// The agent and the text of `memories add` and `recall`: `--agent A TEXT`, or the
/// older `A TEXT`.
fn agent_and(
    agent: Option<String>,
    mut words: Vec<String>,
    what: &str,
) -> Result<(String, String), Failure> {
    match (agent, words.len()) {
        (Some(a), 1) => Ok((a, words.remove(0))),
        (None, 2) => {
            let text = words.remove(1);
            Ok((words.remove(0), text))
        }
        (Some(_), _) => Err(twice()),
        (None, _) => Err(Failure::Input(format!(
            "which agent? give --agent ID|NAME|ALIAS before {what}"
        ))),
    }
}

fn twice() -> Failure {
    Failure::Input("the agent is given twice: give --agent ID|NAME|ALIAS once".into())
}

fn which_agent() -> Failure {
    Failure::Input("which agent? give --agent ID|NAME|ALIAS".into())
}

pub(crate) fn plan(cmd: MemoriesCmd) -> Result<MemoriesPlan, Failure> {
    let kind = |k: &str| MemoryKind::parse(k).map_err(input);
    let agent_opt = |a: Option<String>| a.as_deref().map(agent_ref).transpose();
    Ok(match cmd {
        MemoriesCmd::List {
            agent,
            status,
            kind: k,
            limit: n,
        } => MemoriesPlan::List {
            agent: agent_ref(&agent)?,
            status,
            kind: k.as_deref().map(kind).transpose()?,
            limit: limit(n)?,
        },
        MemoriesCmd::Add {
            agent,
            words,
            kind: k,
            importance,
        } => {
            let (agent, text) = agent_and(agent, words, "the memory's text")?;
            let text = text.trim().to_owned();
            if text.is_empty() {
                return Err(Failure::Input("give the memory's text".into()));
            }
            MemoriesPlan::Add {
                agent: agent_ref(&agent)?,
                text,
                kind: kind(&k)?,
                importance: Memory::check_importance(importance).map_err(input)?,
            }
        }
        MemoriesCmd::Recall {
            agent,
            id: Some(id),
            ..
        } => MemoriesPlan::RecallId {
            id: MemoryId::parse(id.trim()).map_err(input)?,
            agent: agent_opt(agent)?,
        },
        MemoriesCmd::Recall {
            agent,
            words,
            id: None,
            limit: n,
            reinforce,
        } => {
            let (agent, query) = agent_and(agent, words, "what to recall")?;
            if query.trim().is_empty() {
                return Err(Failure::Input("give something to recall".into()));
            }
            MemoriesPlan::Recall {
                agent: agent_ref(&agent)?,
                query,
                limit: limit(n)?,
                reinforce,
            }
        }
        MemoriesCmd::Forget { id, agent } => MemoriesPlan::Forget {
            id: MemoryId::parse(id.trim()).map_err(input)?,
            agent: agent_opt(agent)?,
        },
        MemoriesCmd::Reindex { agent } => MemoriesPlan::Reindex {
            agent: agent_opt(agent)?,
        },
        MemoriesCmd::Consolidate { agent, named } => MemoriesPlan::Consolidate {
            agent: agent_ref(&match (agent, named) {
                (Some(a), None) | (None, Some(a)) => a,
                (Some(_), Some(_)) => return Err(twice()),
                (None, None) => return Err(which_agent()),
            })?,
        },
        MemoriesCmd::Restore { id, agent } => MemoriesPlan::Restore {
            id: MemoryId::parse(id.trim()).map_err(input)?,
            agent: agent_opt(agent)?,
        },
    })
}

impl MemoriesPlan {
    /// Whether the command changes anything.
    pub(crate) fn writes(&self) -> bool {
        !matches!(
            self,
            Self::List { .. }
                | Self::Recall {
                    reinforce: false,
                    ..
                }
                | Self::RecallId { .. }
        )
    }
}

/// A memory as listed: the record, and its state and weight at the agent's beat.
#[derive(Serialize)]
struct Listed {
    #[serde(flatten)]
    memory: Memory,
    state: Shown,
    weight: f32,
}

/// A recalled memory as shown.
#[derive(Serialize)]
struct Recalled {
    #[serde(flatten)]
    found: Found,
    state: Shown,
    /// Its first line, cut to 80 characters.
    title: String,
    /// When a recall last returned it before this one, in words ("3 days ago", "never").
    last_recalled_ago: String,
}

/// One memory read whole: the record, its state and weight at the agent's beat, and
/// its times in words.
#[derive(Serialize)]
struct Whole {
    #[serde(flatten)]
    memory: Memory,
    state: Shown,
    weight: f32,
    title: String,
    kept_ago: String,
    last_recalled_ago: String,
}

/// When a recall last returned a memory, in words: "3 days ago", or "never".
fn recalled_ago(at: Option<jiff::Timestamp>, now: jiff::Timestamp) -> String {
    at.map_or_else(|| "never".to_owned(), |t| memory::ago(t, now))
}

fn state(m: &Memory, status: MemoryStatus) -> Shown {
    match (&m.folded_into, status) {
        (Some(_), _) => Shown::Folded,
        (None, MemoryStatus::Active) => Shown::Active,
        (None, MemoryStatus::Suspended) => Shown::Suspended,
    }
}

fn state_name(s: Shown) -> &'static str {
    match s {
        Shown::Active => "active",
        Shown::Suspended => "suspended",
        Shown::Folded => "folded",
    }
}

fn memories(cx: &Ctx<'_>, services: &Services) -> Arc<Memories> {
    cx.b.memories(services)
}

pub(crate) async fn execute(plan: MemoriesPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let services = Services::from_config(cx.config);
    let book = memories(cx, &services);
    match plan {
        MemoriesPlan::List {
            agent,
            status,
            kind,
            limit,
        } => list(cx, &book, &agent.find(cx.b).await?, status, kind, limit).await,
        MemoriesPlan::Add {
            agent,
            text,
            kind,
            importance,
        } => {
            let agent = agent.find(cx.b).await?;
            let now = cx.clock.now();
            let beat = memory::beat_now(cx.b.store.as_ref(), &agent.id).await?;
            let id = MemoryId::derived(
                now.as_millisecond().max(0) as u64,
                &[agent.id.as_str(), &text, &now.to_string()],
            );
            let mut m = Memory::new(id, &agent.id, &text, beat, now).map_err(input)?;
            m.kind = kind;
            m.importance = importance;
            m.source = MemorySource::Operator;
            let kept = book.remember(&agent.id, vec![m]).await?.remove(0);
            let note = if kept.embedding.is_some() {
                format!("{} remembers it ({}).", agent.name, book.model())
            } else {
                format!(
                    "{} remembers it; it could not be embedded now ({}), so it is found by its words until a later recall or `pulse memories reindex` embeds it.",
                    agent.name,
                    book.model()
                )
            };
            cx.out.created(&kept, kept.id.as_str(), &note);
            Ok(())
        }
        MemoriesPlan::Recall {
            agent,
            query,
            limit,
            reinforce,
        } => recall(cx, &book, &agent.find(cx.b).await?, query, limit, reinforce).await,
        MemoriesPlan::RecallId { id, agent } => {
            let agent = owner(cx, agent, &id).await?;
            read(cx, &book, &agent, &id).await
        }
        MemoriesPlan::Forget { id, agent } => {
            let agent = owner(cx, agent, &id).await?;
            book.forget(&agent.id, &id).await?;
            cx.out
                .done(&format!("{} no longer remembers {id}.", agent.name));
            Ok(())
        }
        MemoriesPlan::Reindex { agent } => reindex(cx, &book, agent).await,
        MemoriesPlan::Consolidate { agent } => {
            let agent = agent.find(cx.b).await?;
            let beat = memory::beat_now(cx.b.store.as_ref(), &agent.id).await?;
            let done = consolidate::consolidate(
                &book,
                cx.b.store.as_ref(),
                Some((services.llm.as_ref(), &cx.config.engine.prices)),
                &agent,
                beat,
                cx.clock.now(),
            )
            .await?;
            if cx.out.json {
                cx.out.json_value(&done);
                return Ok(());
            }
            crate::output::outln!(
                "{} of {} active memories folded: {} merged into duplicates, {} into {}; {} held back by the 25 % gate; {} tokens.",
                done.merged + done.summarized,
                done.active,
                done.merged,
                done.summarized,
                count(done.summaries.len(), "summary"),
                done.held_back,
                done.tokens
            );
            if done.changed_meanwhile > 0 {
                eprintln!(
                    "{} not folded: their memories changed during the pass (forgotten, folded or recalled elsewhere); the next pass tries again",
                    count(done.changed_meanwhile, "memory")
                );
            }
            if let Some(why) = &done.no_summary {
                eprintln!("no summary of old faded episodes: {why}");
            }
            Ok(())
        }
        MemoriesPlan::Restore { id, agent } => {
            let agent = owner(cx, agent, &id).await?;
            let done = consolidate::restore(&book, cx.b.store.as_ref(), &agent, &id)
                .await?
                .ok_or_else(|| Failure::Input(format!("{} has no memory {id}", agent.name)))?;
            if cx.out.json {
                cx.out.json_value(&done);
            } else if done.restored.is_empty() {
                return Err(Failure::Input(format!(
                    "nothing to restore: no memory was folded into {id}, and it is not folded itself"
                )));
            } else {
                let removed = done
                    .removed
                    .as_ref()
                    .map_or(String::new(), |s| format!("; the summary {s} is gone"));
                crate::output::outln!("{} back{removed}.", count(done.restored.len(), "memory"));
            }
            Ok(())
        }
    }
}

async fn list(
    cx: &Ctx<'_>,
    book: &Memories,
    agent: &Agent,
    status: Option<Shown>,
    kind: Option<MemoryKind>,
    limit: usize,
) -> Result<(), Failure> {
    let beat = memory::beat_now(cx.b.store.as_ref(), &agent.id).await?;
    let half_life = agent.memory_half_life_beats();
    let mut all = book.all(&agent.id).await?;
    all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
    let rows: Vec<Listed> = all
        .into_iter()
        .map(|m| Listed {
            state: state(&m, m.status_at(beat, half_life)),
            weight: m.weight_at(beat, half_life),
            memory: m,
        })
        .filter(|l| status.is_none_or(|s| s == l.state))
        .filter(|l| kind.is_none_or(|k| k == l.memory.kind))
        .take(limit)
        .collect();
    cx.out.table(
        &rows,
        &[
            "ID",
            "KEPT",
            "KIND",
            "STATE",
            "WEIGHT",
            "IMPORTANCE",
            "RECALLED",
            "FROM",
            "TEXT",
        ],
        |l| {
            let m = &l.memory;
            vec![
                m.id.to_string(),
                when(Some(m.created_at)),
                m.kind.as_str().into(),
                state_name(l.state).into(),
                format!("{:.2}", l.weight),
                format!("{:.2}", m.importance),
                if m.recalls == 0 {
                    "never".into()
                } else {
                    format!("{}× {}", m.recalls, when(m.recalled_at))
                },
                match m.read_from().as_slice() {
                    [] => m.source.as_str().into(),
                    from => format!("{} after {}", m.source.as_str(), from.join(", ")),
                },
                short(&m.text, 100),
            ]
        },
    );
    Ok(())
}

async fn recall(
    cx: &Ctx<'_>,
    book: &Memories,
    agent: &Agent,
    query: String,
    limit: usize,
    reinforce: bool,
) -> Result<(), Failure> {
    let beat = memory::beat_now(cx.b.store.as_ref(), &agent.id).await?;
    let r = Recall {
        limit,
        reinforce,
        skip_folded: false,
        ..Recall::for_model(&query, beat)
    };
    let now = cx.clock.now();
    let found = book.recall(agent, &r, now).await?;
    let rows: Vec<Recalled> = found
        .into_iter()
        .map(|f| Recalled {
            state: if f.reactivated {
                Shown::Active
            } else {
                state(&f.memory, f.status)
            },
            title: memory::title(&f.memory.text),
            last_recalled_ago: recalled_ago(f.recalled_before, now),
            found: f,
        })
        .collect();
    cx.out.table(
        &rows,
        &[
            "ID", "MATCH", "KIND", "STATE", "WEIGHT", "RECALLED", "TITLE",
        ],
        |r| {
            let f = &r.found;
            let mut shown = state_name(r.state).to_owned();
            if f.reactivated {
                shown.push_str(" (brought back)");
            }
            vec![
                f.memory.id.to_string(),
                format!("{:.2}", f.score),
                f.memory.kind.as_str().into(),
                shown,
                format!("{:.2}", f.weight),
                r.last_recalled_ago.clone(),
                r.title.clone(),
            ]
        },
    );
    if !cx.out.json && book.model().starts_with("offline") {
        eprintln!(
            "(the offline embedder matches words, not meaning: set PULSE_EMBED_MODEL for recall by meaning)"
        );
    }
    Ok(())
}

/// Memory `id` of `agent`, whole: a few `label: value` lines, then its full text (or the
/// record, its state and weight as JSON). Reading it does not reinforce it.
async fn read(cx: &Ctx<'_>, book: &Memories, agent: &Agent, id: &MemoryId) -> Result<(), Failure> {
    let m = book.get(&agent.id, id).await?.ok_or_else(|| {
        Failure::Input(format!(
            "{} has no memory {id}; `pulse memories list --agent {}` shows its memories",
            agent.name, agent.name
        ))
    })?;
    let now = cx.clock.now();
    let beat = memory::beat_now(cx.b.store.as_ref(), &agent.id).await?;
    let half_life = agent.memory_half_life_beats();
    let shown = Whole {
        state: state(&m, m.status_at(beat, half_life)),
        weight: m.weight_at(beat, half_life),
        title: memory::title(&m.text),
        kept_ago: memory::ago(m.created_at, now),
        last_recalled_ago: recalled_ago(m.recalled_at, now),
        memory: m,
    };
    if cx.out.json {
        cx.out.json_value(&shown);
        return Ok(());
    }
    let m = &shown.memory;
    let recalled = match m.recalled_at {
        Some(t) => format!(
            "{} ({}, {}× in all)",
            when(Some(t)),
            shown.last_recalled_ago,
            m.recalls
        ),
        None => "never".to_owned(),
    };
    let from = match m.read_from().as_slice() {
        [] => m.source.as_str().to_owned(),
        from => format!("{} after {}", m.source.as_str(), from.join(", ")),
    };
    crate::output::outln!("id: {}", m.id);
    crate::output::outln!("agent: {}", agent.name);
    crate::output::outln!("kind: {}", m.kind.as_str());
    crate::output::outln!("state: {}", state_name(shown.state));
    crate::output::outln!("weight: {:.2}", shown.weight);
    crate::output::outln!("importance: {:.2}", m.importance);
    crate::output::outln!("kept: {} ({})", when(Some(m.created_at)), shown.kept_ago);
    crate::output::outln!("last recalled: {recalled}");
    crate::output::outln!("from: {from}");
    if let Some(into) = &m.folded_into {
        crate::output::outln!("folded into: {into}");
    }
    crate::output::outln!();
    crate::output::outln!("{}", m.text);
    Ok(())
}

/// The agent that has memory `id`: the one given, or the one of all that has it.
async fn owner(cx: &Ctx<'_>, agent: Option<AgentRef>, id: &MemoryId) -> Result<Agent, Failure> {
    if let Some(agent) = agent {
        let agent = agent.find(cx.b).await?;
        return match cx.b.store.get_memory(&agent.id, id).await? {
            Some(_) => Ok(agent),
            None => Err(Failure::Input(format!(
                "{} has no memory {id}; `pulse memories list --agent {}` shows its memories",
                agent.name, agent.name
            ))),
        };
    }
    for agent in cx.b.store.list_agents().await? {
        if cx.b.store.get_memory(&agent.id, id).await?.is_some() {
            return Ok(agent);
        }
    }
    Err(Failure::Input(format!(
        "no agent has a memory {id}; `pulse memories list --agent NAME` shows an agent's memories"
    )))
}

async fn reindex(cx: &Ctx<'_>, book: &Memories, agent: Option<AgentRef>) -> Result<(), Failure> {
    let agents = match agent {
        Some(a) => vec![a.find(cx.b).await?],
        None => cx.b.store.list_agents().await?,
    };
    let mut report = Vec::new();
    for agent in &agents {
        let bar = indicatif::ProgressBar::new(0).with_style(
            indicatif::ProgressStyle::with_template(
                "{prefix} [{bar:30}] {pos}/{len} memories embedded ({eta} left)",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_prefix(agent.name.clone());
        let (done, left) = book
            .reindex(agent, |done, total| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            })
            .await?;
        bar.finish_and_clear();
        report.push(serde_json::json!({
            "agent_id": agent.id, "agent": agent.name, "embedded": done, "left": left
        }));
        if !cx.out.json {
            crate::output::outln!(
                "{}: {} embedded with {}{}",
                agent.name,
                count(done, "memory"),
                book.model(),
                if left > 0 {
                    format!("; {left} could not be (the embedder failed: run it again later)")
                } else {
                    String::new()
                }
            );
        }
    }
    if cx.out.json {
        cx.out.json_value(&report);
    }
    let left: u64 = report.iter().filter_map(|r| r["left"].as_u64()).sum();
    if left > 0 {
        return Err(Failure::Attention(format!(
            "{left} memories are still without a vector of {}: `pulse memories reindex` again when the embedder answers",
            book.model()
        )));
    }
    Ok(())
}
