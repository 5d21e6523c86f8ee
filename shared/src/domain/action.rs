//! Actions: the record of each run of a tool on an event, and the clipping that keeps a
//! record's answer within bounds.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::event::json_size;
use super::ids::{ActionId, AgentId, EventId, HeartbeatId, ToolName};
use super::mcp::ModelCall;

/// Where an action is in its life. Actions are created when they start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ActionStatus {
    /// The tool is being called.
    Running,
    /// The tool succeeded.
    Completed,
    /// The tool failed; `error` says why.
    Failed,
    /// The tool stopped because a user message interrupted its heartbeat.
    Cancelled,
    /// The tool chose not to run (the heartbeat agent with nothing to think about);
    /// `error` says why.
    Skipped,
    /// The request went out and no answer came back (a timeout, a connection lost
    /// mid-answer, a worker that stopped during the call): the tool may have done its
    /// work. Never run again on its own unless the tool is idempotent; an operator
    /// settles it (`pulse actions retry` or `pulse actions resolve`).
    Unknown,
}

impl ActionStatus {
    /// Every status, in the order of an action's life.
    pub const ALL: [ActionStatus; 6] = [
        Self::Running,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
        Self::Skipped,
        Self::Unknown,
    ];

    /// The stored name (`RUNNING`, ...), as it is serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "RUNNING",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
            Self::Skipped => "SKIPPED",
            Self::Unknown => "UNKNOWN",
        }
    }

    /// Reads a name, in any case.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s.trim()))
    }

    /// Whether the action is over.
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Running)
    }
}

/// One run of one tool for one event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Action {
    /// Derived from (event, tool).
    pub id: ActionId,
    /// The agent.
    pub agent_id: AgentId,
    /// The heartbeat that ran it (the latest, if it ran again after a crash).
    pub heartbeat_id: HeartbeatId,
    /// The event that triggered it. A model's call to an MCP tool has an id of its own
    /// here, derived from the call and dated with its run's event (or chat turn), so
    /// each call is one action and is filed, kept and deleted with its run.
    pub event_id: EventId,
    /// The tool (for a model's call, the MCP server).
    pub tool: ToolName,
    /// Its status.
    pub status: ActionStatus,
    /// 1 on the first run; more if a worker died while the tool ran.
    pub attempt: u32,
    /// Cascade depth of the triggering event.
    pub depth: u8,
    /// What was sent to the tool.
    pub request: Value,
    /// What the tool answered (or what is known of a failed exchange).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<Value>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When this attempt started.
    pub started_at: Timestamp,
    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Timestamp>,
    /// How long the tool took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Events the tool returned, appended to the log.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub new_events: Vec<EventId>,
    /// Set for a call the model made to one of an MCP server's tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<ModelCall>,
}

impl Action {
    /// The most of a tool's answer the action keeps, as JSON (the engine reads all of
    /// it). With the request, which holds an event of up to
    /// [`MAX_EVENT_BYTES`](super::MAX_EVENT_BYTES) and is kept whole, the record stays
    /// well inside a DynamoDB item's 400 KB.
    pub const KEPT_RESPONSE: usize = 64 * 1024;

    /// Keeps `response` as the action's: whole, or [`clipped`] to
    /// [`Self::KEPT_RESPONSE`] (its longest texts cut, its usage figures kept, so costs
    /// still count what the call spent).
    pub fn keep_response(&mut self, response: Option<Value>) {
        self.response = response.map(|r| clipped(r, Self::KEPT_RESPONSE));
    }

    /// What the action ran, as listings and `pulse tools stats` name it: the tool, or
    /// for a model's call `server/tool`.
    pub fn label(&self) -> String {
        match &self.call {
            Some(c) => format!("{}/{}", self.tool, c.tool),
            None => self.tool.to_string(),
        }
    }
}

/// `value` within `limit` bytes of JSON: whole when it fits; else with its longest
/// strings cut (each cut one ending `… [N more bytes]`), so that its shape — usage
/// figures, statuses, ids, what was scheduled — is kept; else, when strings are not what
/// makes it long, the start of its JSON text, marked clipped, with the whole length.
///
/// The bound holds by construction, escapes counted: the strings' written sizes are
/// read in one pass, one cap is chosen from them that removes the excess (each cut
/// string given room for its marker), every longer string is cut to it once, and what
/// is written is measured. Linear in the value's size, but for sorting its strings.
pub fn clipped(mut value: Value, limit: usize) -> Value {
    let whole = json_size(&value);
    if whole <= limit {
        return value;
    }
    let mut sizes = Vec::new();
    string_sizes(&value, &mut sizes);
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    if let Some(cap) = cap_for(&sizes, whole - limit) {
        cut_strings(&mut value, cap);
        if json_size(&value) <= limit {
            return value;
        }
    }
    let text = value.to_string();
    let start = super::event::json_prefix(&text, limit.saturating_sub(CLIPPED_WRAPPER));
    serde_json::json!({"clipped": true, "bytes": whole, "start": start})
}

/// Room for a cut string's marker, `… [N more bytes]`, as written.
const CUT_MARKER: usize = 40;
/// A string is never cut below this many bytes (nor is one this short cut at all).
const MIN_KEPT: usize = 64;
/// Room for `{"clipped":true,"bytes":N,"start":""}` around the start of the text.
const CLIPPED_WRAPPER: usize = 64;

/// The written sizes of every string value in `v` (keys are kept whole).
fn string_sizes(v: &Value, out: &mut Vec<usize>) {
    match v {
        Value::String(s) => out.push(super::event::json_str_len(s)),
        Value::Array(items) => items.iter().for_each(|i| string_sizes(i, out)),
        Value::Object(map) => map.values().for_each(|i| string_sizes(i, out)),
        _ => {}
    }
}

/// The largest cap such that cutting every string longer than it (sizes sorted, the
/// longest first) removes `excess` bytes with a marker on each; None when that would
/// cut a string below [`MIN_KEPT`].
fn cap_for(sizes: &[usize], excess: usize) -> Option<usize> {
    let mut sum = 0;
    for (k, size) in sizes.iter().enumerate() {
        let cut = k + 1;
        sum += size;
        // Cutting the `cut` longest to `cap` removes sum - cut * cap, and adds markers.
        let Some(room) = sum.checked_sub(excess + cut * CUT_MARKER) else {
            continue;
        };
        let cap = room / cut;
        if cap >= sizes.get(cut).copied().unwrap_or(0) {
            return (cap >= MIN_KEPT).then_some(cap);
        }
    }
    None
}

/// Every string of `v` written longer than `cap` bytes cut to at most `cap`, and marked.
fn cut_strings(v: &mut Value, cap: usize) {
    match v {
        Value::String(s) if super::event::json_str_len(s) > cap => {
            let kept = super::event::json_prefix(s, cap);
            *s = format!("{kept}… [{} more bytes]", s.len() - kept.len());
        }
        Value::Array(items) => items.iter_mut().for_each(|i| cut_strings(i, cap)),
        Value::Object(map) => map.values_mut().for_each(|i| cut_strings(i, cap)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn clipping_cuts_the_longest_texts_and_keeps_the_shape() {
        let small = json!({"usage": {"input_tokens": 7}, "output": "ok"});
        assert_eq!(clipped(small.clone(), 1_000), small);
        let big = json!({
            "usage": {"input_tokens": 7},
            "output": {"scheduled": ["sc_1"], "steps": [{"result": "x".repeat(50_000)}, {"result": "é".repeat(30_000)}]},
        });
        let kept = clipped(big, 10_000);
        assert!(json_size(&kept) <= 10_000, "{}", json_size(&kept));
        assert_eq!(kept["usage"], json!({"input_tokens": 7}));
        assert_eq!(kept["output"]["scheduled"], json!(["sc_1"]));
        let first = kept["output"]["steps"][0]["result"].as_str().unwrap();
        assert!(
            first.starts_with("xxx") && first.ends_with("more bytes]"),
            "{first}"
        );
        let second = kept["output"]["steps"][1]["result"].as_str().unwrap();
        assert!(second.starts_with('é'), "cut on a character's boundary");
        // Made long by something else than text: the start of it, marked.
        let numbers = json!((0..5_000).collect::<Vec<u32>>());
        let kept = clipped(numbers, 1_000);
        assert_eq!(kept["clipped"], json!(true));
        assert!(json_size(&kept) <= 1_000, "{}", json_size(&kept));
        assert!(kept["start"].as_str().unwrap().starts_with("[0,1,2,"));
    }

    /// Values of the shapes that once broke the bound: many short strings (a fallback
    /// whose JSON text doubled as it was escaped again), quotes and control characters,
    /// wide characters, deep nesting.
    fn hostile() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let text = prop_oneof![
            "[a-z]{0,12}",
            "[\"\\\\\u{1}\n\t]{0,200}",
            "[𝄞é\"]{0,300}",
            "[a-z\"]{300,3000}",
        ];
        let leaf = prop_oneof![
            text.prop_map(Value::String),
            any::<i64>().prop_map(|n| json!(n)),
            Just(Value::Null),
        ];
        leaf.prop_recursive(4, 400, 40, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..40).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z\"]{1,8}", inner, 0..20)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        #[test]
        fn the_bound_holds_for_any_value(value in hostile(), limit in 100usize..6_000) {
            let fits = json_size(&value) <= limit;
            let kept = clipped(value.clone(), limit);
            proptest::prop_assert!(json_size(&kept) <= limit, "{} > {limit}", json_size(&kept));
            if fits {
                proptest::prop_assert_eq!(kept, value);
            }
        }
    }

    #[test]
    fn action_statuses_are_named_as_they_are_serialized() {
        for st in ActionStatus::ALL {
            assert_eq!(serde_json::to_value(st).unwrap(), json!(st.as_str()));
            assert_eq!(ActionStatus::parse(&st.as_str().to_lowercase()), Some(st));
        }
        assert_eq!(ActionStatus::parse("DONE"), None);
    }
}
