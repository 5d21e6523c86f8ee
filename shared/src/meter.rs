//! The numbers an operator watches: every metric Pulse records, named once here.
//!
//! The engine records through the [`metrics`] facade; where the numbers go is the
//! process's choice. The Lambda functions install an Embedded Metric Format collector
//! ([`crate::lambda::Metrics`]) and print one JSON line per label set after each
//! invocation, which CloudWatch turns into metrics with no API call; `pulse serve`
//! installs the Prometheus recorder and serves it at `GET /metrics`. Without a recorder
//! (the CLI's other verbs, the tests) recording costs nothing.
//!
//! Labels are few and fixed (an outcome, a token kind, a provider): never an agent, a
//! hook or a webhook id, which would make a metric per agent. The Lambda collector adds
//! the function (`sweeper`, `worker`, `receiver`, `dispatcher`) as a dimension.

use std::time::Duration;

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge};

use crate::domain::Usage;

/// Heartbeats finished, by `outcome`: `completed`, `failed`, `cancelled` (the agent was
/// deleted, a user interrupted, or the breaker tripped).
pub const HEARTBEATS: &str = "pulse_heartbeats_total";
/// Heartbeats finished, by how they ended: `acted`, `nothing_to_do`, `skipped`, `failed`,
/// `incomplete`.
pub const HEARTBEAT_OUTCOMES: &str = "pulse_heartbeat_outcomes_total";
/// Heartbeats claimed by sweeps.
pub const CLAIMED: &str = "pulse_heartbeats_claimed_total";
/// The most overdue of the heartbeats the last sweep claimed: seconds from its due time
/// to its claim (0 when the sweep claimed none). Above two sweep intervals, the sweeper is
/// stalled or throttled.
pub const LATENESS_MAX: &str = "pulse_heartbeat_lateness_max_seconds";
/// The 99th percentile of the last sweep's lateness.
pub const LATENESS_P99: &str = "pulse_heartbeat_lateness_p99_seconds";
/// Seconds from a heartbeat's due time to the start of its run's work: its claim and its
/// wait on the sessions queue (a heartbeat held back by a snooze, a quiet period or the
/// active hours is filed again with a later due time, and counted from that). The
/// sweep's lateness stops at the claim; this one shows workers that cannot keep up.
pub const START_DELAY: &str = "pulse_heartbeat_start_delay_seconds";
/// The buckets (upper bounds, seconds) a Prometheus scrape reports [`START_DELAY`] in.
pub const START_DELAY_BUCKETS: [f64; 10] =
    [0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0];
/// Actions that failed (the tool answered an error or could not be reached).
pub const ACTIONS_FAILED: &str = "pulse_actions_failed_total";
/// Events a tool returned past the cascade depth cap: recorded, not processed.
pub const CASCADE_CAPPED: &str = "pulse_cascade_capped_events_total";
/// Conversation turns, by `outcome`: `answered` or `failed` (to be delivered again).
pub const TURNS: &str = "pulse_turns_total";
/// Seconds from a user's message to the end of the turn that answered it.
pub const TURN_LATENCY: &str = "pulse_turn_latency_seconds";
/// The buckets (upper bounds, seconds) a Prometheus scrape reports [`TURN_LATENCY`] in: a
/// histogram counts from the start and never empties, where a summary's quantiles read
/// 0 once its window passes without a turn.
pub const TURN_LATENCY_BUCKETS: [f64; 10] =
    [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];
/// Model tokens, by `kind` (`input`, `output`) and `provider`.
pub const TOKENS: &str = "pulse_model_tokens_total";
/// Hook delivery attempts and their ends, by `outcome`: `succeeded`, `failed` (an
/// attempt failed; another may follow), `dead_lettered` (every attempt failed).
pub const HOOK_DELIVERIES: &str = "pulse_hook_deliveries_total";
/// Signed webhook requests, by `outcome`: `accepted`, `duplicate`, `rate_limited`,
/// `unavailable`, or why one was refused (`not_found`, `disabled`, `bad_signature`,
/// `bad_body`, `not_allowed`, `refused_before`).
pub const WEBHOOK_REQUESTS: &str = "pulse_webhook_requests_total";
/// What reached the Discord gateway, by `outcome`: `accepted` (queued for its agent),
/// `stranger` (a direct message from a user no agent lets in), `bot` (from a bot, the
/// agent's own included), `not_addressed` (a channel message that does not mention the
/// agent, or in a channel no agent answers in), `rate_limited` (past the messages a
/// minute an agent reads from one person), `reaction` (a reaction to the agent's
/// message, recorded as an event), `malformed` (a payload that could not be read).
pub const GATEWAY_MESSAGES: &str = "pulse_discord_gateway_messages_total";

/// Every metric, with its unit and what it means: what the exporters print beside them.
pub fn describe() {
    describe_counter!(HEARTBEATS, Unit::Count, "Heartbeats finished, by outcome");
    describe_counter!(
        HEARTBEAT_OUTCOMES,
        Unit::Count,
        "Heartbeats finished, by what they did: acted, nothing_to_do, skipped, failed, incomplete; and undeliverable, counted again when what a heartbeat said is given up on"
    );
    describe_counter!(CLAIMED, Unit::Count, "Heartbeats claimed by sweeps");
    describe_gauge!(
        LATENESS_MAX,
        Unit::Seconds,
        "Due time to claim of the most overdue heartbeat the last sweep claimed"
    );
    describe_gauge!(
        LATENESS_P99,
        Unit::Seconds,
        "99th percentile of due time to claim in the last sweep"
    );
    describe_histogram!(
        START_DELAY,
        Unit::Seconds,
        "A heartbeat's due time to the start of its run (claim and queue wait)"
    );
    describe_counter!(ACTIONS_FAILED, Unit::Count, "Actions that failed");
    describe_counter!(
        CASCADE_CAPPED,
        Unit::Count,
        "Events past the cascade depth cap: recorded, not processed"
    );
    describe_counter!(TURNS, Unit::Count, "Conversation turns, by outcome");
    describe_histogram!(
        TURN_LATENCY,
        Unit::Seconds,
        "A user's message to the end of the turn that answered it"
    );
    describe_counter!(TOKENS, Unit::Count, "Model tokens, by kind and provider");
    describe_counter!(
        HOOK_DELIVERIES,
        Unit::Count,
        "Hook delivery attempts and dead letters, by outcome"
    );
    describe_counter!(
        WEBHOOK_REQUESTS,
        Unit::Count,
        "Signed webhook requests, by outcome"
    );
    describe_counter!(
        GATEWAY_MESSAGES,
        Unit::Count,
        "What reached the Discord gateway, by outcome"
    );
}

/// A heartbeat finished this way (`completed`, `failed`, `cancelled`).
pub fn heartbeat(outcome: &'static str) {
    counter!(HEARTBEATS, "outcome" => outcome).increment(1);
}

/// A heartbeat ended this way (`acted`, `nothing_to_do`, `skipped`, `failed`).
pub fn heartbeat_outcome(kind: &'static str) {
    counter!(HEARTBEAT_OUTCOMES, "outcome" => kind).increment(1);
}

/// One sweep's claims and how late each was (due time to claim).
pub fn sweep(lateness: &[Duration]) {
    counter!(CLAIMED).increment(lateness.len() as u64);
    let (max, p99) = max_and_p99(lateness);
    gauge!(LATENESS_MAX).set(max.as_secs_f64());
    gauge!(LATENESS_P99).set(p99.as_secs_f64());
}

/// The largest of `values` and their 99th percentile (nearest rank); zero when empty.
pub fn max_and_p99(values: &[Duration]) -> (Duration, Duration) {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let Some(&max) = sorted.last() else {
        return (Duration::ZERO, Duration::ZERO);
    };
    // Nearest rank: the smallest value with at least 99 % of them at or below it.
    let rank = (sorted.len() * 99).div_ceil(100).max(1);
    (max, sorted[rank - 1])
}

/// An action failed.
pub fn action_failed() {
    counter!(ACTIONS_FAILED).increment(1);
}

/// `n` events were held back at the cascade depth cap.
pub fn cascade_capped(n: usize) {
    counter!(CASCADE_CAPPED).increment(n as u64);
}

/// A heartbeat's run began its work `delay` after its due time.
pub fn heartbeat_started(delay: Duration) {
    metrics::histogram!(START_DELAY).record(delay.as_secs_f64());
}

/// A turn was answered, `latency` after the message it answered arrived.
pub fn turn_answered(latency: Duration) {
    counter!(TURNS, "outcome" => "answered").increment(1);
    metrics::histogram!(TURN_LATENCY).record(latency.as_secs_f64());
}

/// A turn failed and its messages will be delivered again.
pub fn turn_failed() {
    counter!(TURNS, "outcome" => "failed").increment(1);
}

/// A turn's reply was not delivered: to be tried again, or (`given_up`) undeliverable.
pub fn reply_undelivered(given_up: bool) {
    let outcome = if given_up {
        "undeliverable"
    } else {
        "delivery_retried"
    };
    counter!(TURNS, "outcome" => outcome).increment(1);
}

/// A model answered, using these tokens.
pub fn tokens(provider: &'static str, usage: &Usage) {
    counter!(TOKENS, "kind" => "input", "provider" => provider).increment(usage.input_tokens);
    counter!(TOKENS, "kind" => "output", "provider" => provider).increment(usage.output_tokens);
}

/// A hook delivery attempt ended (`succeeded`, `failed`), or a delivery was
/// dead-lettered (`dead_lettered`).
pub fn hook_delivery(outcome: &'static str) {
    counter!(HOOK_DELIVERIES, "outcome" => outcome).increment(1);
}

/// A signed webhook request was answered this way.
pub fn webhook_request(outcome: &'static str) {
    counter!(WEBHOOK_REQUESTS, "outcome" => outcome).increment(1);
}

/// Something reached the Discord gateway and ended this way.
pub fn gateway_message(outcome: &'static str) {
    counter!(GATEWAY_MESSAGES, "outcome" => outcome).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_99th_percentile_is_the_nearest_rank() {
        let s = Duration::from_secs;
        assert_eq!(max_and_p99(&[]), (s(0), s(0)));
        assert_eq!(max_and_p99(&[s(7)]), (s(7), s(7)));
        // 100 values 1..=100: the 99th is 99.
        let hundred: Vec<_> = (1..=100).rev().map(s).collect();
        assert_eq!(max_and_p99(&hundred), (s(100), s(99)));
        // 10 values: the nearest rank of 99 % is the 10th, the largest.
        let ten: Vec<_> = (1..=10).map(s).collect();
        assert_eq!(max_and_p99(&ten), (s(10), s(10)));
        // 1000 values: the 990th.
        let thousand: Vec<_> = (1..=1000).map(s).collect();
        assert_eq!(max_and_p99(&thousand), (s(1000), s(990)));
    }
}
