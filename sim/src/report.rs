//! What a run reports: its seed, what happened, the faults injected by kind, and each
//! invariant with what it checked and its first violation. Everything but the wall time
//! is the same for the same seed, byte for byte.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

/// What happened in a run.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Counts {
    /// Heartbeats that completed.
    pub heartbeats_completed: u64,
    /// Heartbeats that failed (and were retried by the next).
    pub heartbeats_failed: u64,
    /// Heartbeats cancelled (a user message interrupted them, or the agent was paused).
    pub heartbeats_cancelled: u64,
    /// Actions the tool owed (one per event a completed window covers).
    pub actions: u64,
    /// Events no completed window covers yet: their agent's next heartbeat is still to
    /// come (after failures it backs off).
    pub events_waiting: u64,
    /// Calls the tool received.
    pub tool_calls: u64,
    /// Requests the model received.
    pub llm_requests: u64,
    /// User messages queued.
    pub messages: u64,
    /// Of those, parked in the dead-letter queue after their last receive.
    pub messages_dead_lettered: u64,
    /// Messages that appeared in Discord.
    pub discord_posts: u64,
    /// Requests hook receivers received.
    pub hook_requests: u64,
    /// Hook deliveries that succeeded.
    pub hook_deliveries: u64,
    /// Tool successes repeated for one action id (at-least-once after a crash between
    /// the call and its record).
    pub tool_repeats: u64,
    /// Hook successes repeated for one delivery id (the same, for hooks).
    pub hook_repeats: u64,
    /// Reply parts that appeared twice: posted, the worker gone before the turn recorded
    /// it, and posted again after Discord forgot the nonce.
    pub discord_repeats: u64,
    /// Agents the operator deleted.
    pub agents_deleted: u64,
    /// Messages left in the sessions queue at the end.
    pub queued_at_end: u64,
    /// Messages the sessions queue dead-lettered.
    pub dead_letters: u64,
}

/// One invariant's outcome.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Invariant {
    /// Its name.
    pub name: &'static str,
    /// What it says.
    pub says: &'static str,
    /// Cases checked.
    pub checked: u64,
    /// Cases that broke it.
    pub violations: u64,
    /// The first that did.
    pub first: Option<String>,
}

impl Invariant {
    pub(crate) fn new(name: &'static str, says: &'static str) -> Self {
        Self {
            name,
            says,
            checked: 0,
            violations: 0,
            first: None,
        }
    }

    /// Counts one case; `why` describes it if it broke the invariant.
    pub(crate) fn checked(&mut self, ok: bool, why: impl FnOnce() -> String) {
        self.checked += 1;
        if !ok {
            self.violations += 1;
            if self.first.is_none() {
                self.first = Some(why());
            }
        }
    }

    /// Counts `cases`, of which `broken` broke it.
    pub(crate) fn checked_all(&mut self, cases: u64, broken: &[String]) {
        self.checked += cases;
        self.violations += broken.len() as u64;
        if self.first.is_none() {
            self.first = broken.first().cloned();
        }
    }

    /// Whether it held.
    pub fn held(&self) -> bool {
        self.violations == 0
    }

    /// How it came out, as the report says it: `pass`, `FAIL`, or `not exercised` when
    /// the run gave it no case to check (it held, but proved nothing).
    pub fn verdict(&self) -> &'static str {
        match (self.held(), self.checked) {
            (false, _) => "FAIL",
            (true, 0) => "not exercised",
            (true, _) => "pass",
        }
    }
}

/// A run's report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The seed: the same seed replays the same run.
    pub seed: u64,
    /// Agents in the fleet.
    pub agents: usize,
    /// Shards the fleet was simulated in: deployments of their own, run side by side.
    pub shards: usize,
    /// The most agents a shard holds.
    pub shard_agents: usize,
    /// Simulated seconds, before the drain.
    pub simulated_seconds: u64,
    /// The fault mix.
    pub faults: String,
    /// Where the run kept its state: `sqlite`, or `aws` (over an emulator).
    pub backend: String,
    /// The emulator's URL, on the AWS backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// What happened.
    pub counts: Counts,
    /// Faults injected, by kind.
    pub injected: BTreeMap<String, u64>,
    /// On the AWS backend, the requests the engine sent the emulator (each of the SDK's
    /// retries counts), by operation: what the run costs on AWS.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, u64>,
    /// The invariants.
    pub invariants: Vec<Invariant>,
    /// Wall time of the run: the only figure that differs between runs of one seed.
    pub wall_seconds: f64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        let Counts {
            heartbeats_completed,
            heartbeats_failed,
            heartbeats_cancelled,
            actions,
            events_waiting,
            tool_calls,
            llm_requests,
            messages,
            messages_dead_lettered,
            discord_posts,
            hook_requests,
            hook_deliveries,
            tool_repeats,
            hook_repeats,
            discord_repeats,
            agents_deleted,
            queued_at_end,
            dead_letters,
        } = o;
        self.heartbeats_completed += heartbeats_completed;
        self.heartbeats_failed += heartbeats_failed;
        self.heartbeats_cancelled += heartbeats_cancelled;
        self.actions += actions;
        self.events_waiting += events_waiting;
        self.tool_calls += tool_calls;
        self.llm_requests += llm_requests;
        self.messages += messages;
        self.messages_dead_lettered += messages_dead_lettered;
        self.discord_posts += discord_posts;
        self.hook_requests += hook_requests;
        self.hook_deliveries += hook_deliveries;
        self.tool_repeats += tool_repeats;
        self.hook_repeats += hook_repeats;
        self.discord_repeats += discord_repeats;
        self.agents_deleted += agents_deleted;
        self.queued_at_end += queued_at_end;
        self.dead_letters += dead_letters;
    }
}

impl Report {
    /// Names this shard's report's violations with the shard and its seed, for a run
    /// of several.
    pub(crate) fn name_shard(&mut self, index: usize) {
        let seed = self.seed;
        for i in &mut self.invariants {
            i.first = i
                .first
                .take()
                .map(|f| format!("in shard {index} (seed {seed}): {f}"));
        }
    }

    /// Adds the next shard's report to this one (the first shard's, or the sum so far):
    /// counts, faults and each invariant's cases add up; an invariant's first violation
    /// stays the earliest shard's.
    pub(crate) fn absorb(&mut self, next: Report) {
        self.shards += 1;
        self.counts += next.counts;
        for (kind, n) in next.injected {
            *self.injected.entry(kind).or_default() += n;
        }
        for (op, n) in next.requests {
            *self.requests.entry(op).or_default() += n;
        }
        for (mine, theirs) in self.invariants.iter_mut().zip(next.invariants) {
            mine.checked += theirs.checked;
            mine.violations += theirs.violations;
            mine.first = mine.first.take().or(theirs.first);
        }
    }

    /// The invariant named `name`.
    pub fn invariant(&self, name: &str) -> Option<&Invariant> {
        self.invariants.iter().find(|i| i.name == name)
    }

    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.invariants.iter().all(Invariant::held)
    }

    /// Heartbeats finished per wall second.
    pub fn heartbeats_per_second(&self) -> f64 {
        let c = &self.counts;
        let n = c.heartbeats_completed + c.heartbeats_failed + c.heartbeats_cancelled;
        n as f64 / self.wall_seconds.max(1e-9)
    }

    /// The command that replays this run.
    pub fn replay(&self) -> String {
        let split = if self.shard_agents == crate::SHARD_AGENTS {
            String::new()
        } else {
            format!(" --shard-agents {}", self.shard_agents)
        };
        let backend = match &self.endpoint {
            Some(url) => format!(" --backend aws --endpoint {url}"),
            None => String::new(),
        };
        format!(
            "pulse simulate --agents {} --duration {}s --seed {} --faults {}{split}{backend}",
            self.agents, self.simulated_seconds, self.seed, self.faults
        )
    }

    /// The report for a person.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let c = &self.counts;
        let hours = self.simulated_seconds as f64 / 3600.0;
        let _ = writeln!(
            s,
            "seed {}: {} agents, {hours} simulated hours, faults {}, on {}",
            self.seed,
            self.agents,
            self.faults,
            match &self.endpoint {
                Some(url) => format!("the AWS adapters over the emulator at {url}"),
                None => "the embedded store".into(),
            }
        );
        if self.shards > 1 {
            let _ = writeln!(
                s,
                "in {} shards of at most {} agents, each a deployment of its own, run side by side",
                self.shards, self.shard_agents
            );
        }
        let _ = writeln!(
            s,
            "heartbeats: {} completed, {} failed, {} cancelled",
            c.heartbeats_completed, c.heartbeats_failed, c.heartbeats_cancelled
        );
        let _ = writeln!(
            s,
            "actions owed {} (events still waiting for a heartbeat {}), tool calls {}, model requests {}, user messages {}, Discord posts {}",
            c.actions, c.events_waiting, c.tool_calls, c.llm_requests, c.messages, c.discord_posts
        );
        let _ = writeln!(
            s,
            "hook requests {}, deliveries succeeded {}; agents deleted {}; sessions queue at the end {}, dead letters {}",
            c.hook_requests, c.hook_deliveries, c.agents_deleted, c.queued_at_end, c.dead_letters
        );
        let _ = writeln!(
            s,
            "at-least-once repeats after a lost answer: {} tool successes, {} hook successes (same ids), {} Discord posts; user messages dead-lettered {}",
            c.tool_repeats, c.hook_repeats, c.discord_repeats, c.messages_dead_lettered
        );
        if !self.requests.is_empty() {
            let total: u64 = self.requests.values().sum();
            let beats = c.heartbeats_completed + c.heartbeats_failed + c.heartbeats_cancelled;
            let per = |n: u64| n as f64 / beats.max(1) as f64;
            let _ = writeln!(
                s,
                "AWS requests the engine sent: {total}, {:.1} per heartbeat cycle ({beats} heartbeats; turns and hook deliveries included), by operation:",
                per(total)
            );
            let mut ops: Vec<_> = self.requests.iter().collect();
            ops.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            for (op, n) in ops {
                let _ = writeln!(s, "  {op:<24} {n:>8}  {:>6.2} per heartbeat", per(*n));
            }
        }
        let total: u64 = self.injected.values().sum();
        let _ = writeln!(s, "faults injected: {total}");
        for (kind, n) in &self.injected {
            let _ = writeln!(s, "  {kind:<24} {n}");
        }
        let _ = writeln!(s, "invariants:");
        for i in &self.invariants {
            let _ = writeln!(s, "  {}  {:<22} {} checked", i.verdict(), i.name, i.checked);
            if let Some(first) = &i.first {
                let _ = writeln!(s, "        {} violations; the first: {first}", i.violations);
            }
        }
        let _ = writeln!(
            s,
            "wall time {:.1} s: {:.0} heartbeats per second",
            self.wall_seconds,
            self.heartbeats_per_second()
        );
        if !self.passed() {
            let _ = writeln!(s, "replay: {}", self.replay());
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::Invariant;

    #[test]
    fn an_invariant_that_checked_nothing_is_not_exercised_rather_than_passed() {
        let mut i = Invariant::new("claims_fenced", "one claim at a time");
        assert_eq!(i.verdict(), "not exercised");
        assert!(i.held(), "nothing broke it");
        i.checked(true, String::new);
        assert_eq!(i.verdict(), "pass");
        i.checked(false, || "two claims".into());
        assert_eq!(i.verdict(), "FAIL");
    }
}
