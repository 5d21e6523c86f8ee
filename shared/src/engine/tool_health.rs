//! Tool health: whether a tool's calls are mostly failing, told once to the agents'
//! hooks as `TOOL_DEGRADED`, and once more as `TOOL_RECOVERED` when they stop failing.
//!
//! Outcomes are counted per agent and tool, in fixed windows of the clock ([`WINDOW`]):
//! an agent's hooks are told of its own calls, never another agent's. A tool is degraded
//! when, within one window, it has had at least [`MIN_CALLS`] calls and at least
//! [`FAILED_SHARE`] % of them failed (an UNKNOWN outcome counts as failed: nobody knows
//! it worked). It recovers in a later window with as many calls and a smaller share.
//!
//! The counts are kept by each process (a worker, `pulse serve`), so a tool called from
//! several Lambda instances is judged by each on its own share of the calls. What is
//! emitted is still told once: the delivery ids derive from the tool, the change and
//! the window, so two processes that see the same change in the same window queue the
//! same deliveries, which the dispatcher sends once.

use std::collections::HashMap;
use std::sync::Mutex;

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::domain::{Agent, AgentId, HookRoute, HookType, ToolName};
use crate::engine::hooks::{Emission, HookEmitter};

/// The span outcomes are counted over.
pub const WINDOW: std::time::Duration = std::time::Duration::from_secs(10 * 60);
/// The fewest calls in a window that a judgement is made on.
pub const MIN_CALLS: u32 = 5;
/// The share of failed calls, in percent, at which a tool is degraded.
pub const FAILED_SHARE: u32 = 50;

/// A change in a tool's health, to be told to the hooks.
#[derive(Clone, Debug, PartialEq)]
pub struct HealthChange {
    /// `TOOL_DEGRADED` or `TOOL_RECOVERED`.
    pub hook_type: HookType,
    /// The tool.
    pub tool: ToolName,
    /// Calls and failures in the window that decided it.
    pub calls: u32,
    /// Of which failed.
    pub failed: u32,
    /// When the window started (ms since the epoch): the delivery ids' stamp.
    pub window_ms: u64,
}

impl HealthChange {
    /// The hook's data.
    pub fn data(&self) -> Value {
        json!({
            "tool_name": self.tool,
            "calls": self.calls,
            "failed": self.failed,
            "window_start": Timestamp::from_millisecond(self.window_ms as i64).ok(),
            "window_minutes": WINDOW.as_secs() / 60,
            "threshold_percent": FAILED_SHARE,
        })
    }

    /// The hook emission: one per tool, change and window.
    pub fn emission(self) -> Emission {
        Emission {
            hook_type: self.hook_type.clone(),
            heartbeat_id: None,
            action_id: None,
            data: self.data(),
            triggered_by: "TOOL_HEALTH".to_owned(),
            key_ms: self.window_ms,
            key: self.key(),
        }
    }

    /// Logs the change and queues its hook to `agent`'s hooks (when hooks are on). A
    /// queue that refuses it is logged, not retried: the action it follows is recorded.
    pub async fn announce(self, hooks: Option<&HookEmitter>, routes: &[HookRoute], agent: &Agent) {
        tracing::warn!(tool = %self.tool, change = %self.hook_type, calls = self.calls, failed = self.failed, "tool health changed");
        let Some(hooks) = hooks else {
            return;
        };
        if let Err(e) = hooks.emit(routes, agent, self.emission()).await {
            tracing::warn!(error = %e, "a tool health hook was not queued");
        }
    }

    /// What makes its deliveries unique: the tool, the change, the window.
    pub fn key(&self) -> Vec<String> {
        vec![
            self.tool.to_string(),
            self.hook_type.to_string(),
            self.window_ms.to_string(),
        ]
    }
}

#[derive(Default)]
struct Window {
    index: u64,
    calls: u32,
    failed: u32,
    /// The window the tool was found degraded in, while it is.
    degraded_in: Option<u64>,
}

/// The counts of this process, by agent and tool.
#[derive(Default)]
pub struct ToolHealth {
    tools: Mutex<HashMap<(AgentId, ToolName), Window>>,
}

impl ToolHealth {
    /// Counts an outcome of `agent`'s call of `tool` at `now`; the change it makes to
    /// that agent's view of the tool, if any.
    pub fn record(
        &self,
        agent: &AgentId,
        tool: &ToolName,
        ok: bool,
        now: Timestamp,
    ) -> Option<HealthChange> {
        let span = WINDOW.as_millis() as u64;
        let index = now.as_millisecond().max(0) as u64 / span;
        let mut tools = self.tools.lock().unwrap_or_else(|p| p.into_inner());
        let w = tools.entry((agent.clone(), tool.clone())).or_default();
        if w.index != index {
            w.index = index;
            w.calls = 0;
            w.failed = 0;
        }
        w.calls += 1;
        w.failed += u32::from(!ok);
        if w.calls < MIN_CALLS {
            return None;
        }
        let failing = w.failed * 100 >= FAILED_SHARE * w.calls;
        let hook_type = match w.degraded_in {
            None if failing => {
                w.degraded_in = Some(index);
                HookType::TOOL_DEGRADED
            }
            // Recovery is judged on a window of its own, not on the one that degraded it.
            Some(since) if !failing && index > since => {
                w.degraded_in = None;
                HookType::TOOL_RECOVERED
            }
            _ => return None,
        };
        Some(HealthChange {
            hook_type: HookType::of(hook_type),
            tool: tool.clone(),
            calls: w.calls,
            failed: w.failed,
            window_ms: index * span,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(minutes: i64) -> Timestamp {
        // 1,800,000,000 s is a multiple of 600: a window starts there.
        Timestamp::from_second(1_800_000_000 + minutes * 60).unwrap()
    }

    #[test]
    fn a_tool_is_degraded_once_and_recovers_in_a_later_window() {
        let h = ToolHealth::default();
        let me = AgentId::generate();
        let t = ToolName::parse("mailer").unwrap();
        // Four failures are too few to judge.
        for _ in 0..4 {
            assert_eq!(h.record(&me, &t, false, at(1)), None);
        }
        let degraded = h
            .record(&me, &t, false, at(2))
            .expect("degraded at the fifth");
        let change = degraded.clone();
        assert_eq!(change.hook_type.as_str(), HookType::TOOL_DEGRADED);
        assert_eq!((change.calls, change.failed), (5, 5));
        // Told once: more failures and a few successes in the same window say nothing.
        for ok in [false, true, true, true, true, true, true] {
            assert_eq!(h.record(&me, &t, ok, at(3)), None);
        }
        // The next window: four successes are too few, the fifth recovers it.
        for _ in 0..4 {
            assert_eq!(h.record(&me, &t, true, at(11)), None);
        }
        let change = h.record(&me, &t, true, at(12)).expect("recovered");
        assert_eq!(change.hook_type.as_str(), HookType::TOOL_RECOVERED);
        assert_eq!(change.window_ms, degraded.window_ms + 600_000);
        assert_ne!(change.key(), degraded.key());
        assert_eq!(h.record(&me, &t, true, at(13)), None);
    }

    #[test]
    fn under_half_failing_is_healthy_and_tools_are_counted_apart() {
        let h = ToolHealth::default();
        let me = AgentId::generate();
        let (a, b) = (ToolName::parse("a").unwrap(), ToolName::parse("b").unwrap());
        for ok in [true, false, true, false, true, true] {
            assert_eq!(h.record(&me, &a, ok, at(0)), None);
        }
        for _ in 0..4 {
            assert_eq!(h.record(&me, &b, false, at(0)), None);
        }
        assert!(h.record(&me, &b, false, at(0)).is_some());
    }

    #[test]
    fn an_agent_is_told_of_its_own_calls_only() {
        let h = ToolHealth::default();
        let (me, other) = (AgentId::generate(), AgentId::generate());
        let t = ToolName::parse("mailer").unwrap();
        // Another agent's failure does not count toward mine.
        assert_eq!(h.record(&other, &t, false, at(0)), None);
        for _ in 0..4 {
            assert_eq!(h.record(&me, &t, false, at(0)), None);
        }
        let change = h
            .record(&me, &t, false, at(0))
            .expect("degraded at my fifth");
        assert_eq!((change.calls, change.failed), (5, 5));
    }
}
