//! A hook's deliveries: listed with their attempts, sent again one by one (`replay`), all
//! since a time (`recover`) or all the dead-letter queue holds (`redrive`).

use pulse_shared::app::Connected;
use pulse_shared::domain::{AttemptStatus, HookAttempt, HookDelivery, HookDeliveryId, HookId};
use pulse_shared::engine::{Dispatcher, Recovered, Redriven};

use super::super::AgentRef;
use super::require_hook;
use crate::Failure;
use crate::output::{Out, outln, short, when};

/// Sends a failed, exhausted or cancelled delivery again, now; prints the attempt.
pub(super) async fn replay(
    dispatcher: &Dispatcher,
    out: &Out,
    id: &HookDeliveryId,
) -> Result<(), Failure> {
    let (d, a) = dispatcher.replay(id).await.map_err(|e| match e {
        pulse_shared::error::EngineError::Missing(m)
        | pulse_shared::error::EngineError::Contended(m) => Failure::Input(m),
        other => Failure::Runtime(other.into()),
    })?;
    print_attempt(out, &d, &a);
    succeeded(&d, &a)
}

/// Sends again what failed since `since`: one hook's deliveries, one agent's hooks', or
/// every hook's.
pub(super) async fn recover(
    b: &Connected,
    dispatcher: &Dispatcher,
    out: &Out,
    hook: Option<HookId>,
    agent: Option<AgentRef>,
    since: jiff::Timestamp,
) -> Result<(), Failure> {
    let hooks = match (hook, agent) {
        (Some(id), _) => vec![require_hook(b, &id).await?],
        (None, Some(agent)) => b.store.list_hooks(&agent.id(b).await?).await?,
        (None, None) => {
            let mut all = Vec::new();
            for a in b.store.list_agents().await? {
                all.extend(b.store.list_hooks(&a.id).await?);
            }
            all
        }
    };
    let done = dispatcher
        .recover(&hooks, since)
        .await
        .map_err(|e| Failure::Runtime(e.into()))?;
    recovered(out, &done, since)
}

/// Sends the dead-letter queue's deliveries again; exit 1 when some stay in it.
pub(super) async fn redrive(
    dispatcher: &Dispatcher,
    out: &Out,
    limit: usize,
) -> Result<(), Failure> {
    let done = dispatcher
        .redrive(limit)
        .await
        .map_err(|e| Failure::Runtime(e.into()))?;
    redriven(out, &done, limit)
}

fn redriven(out: &Out, done: &Redriven, limit: usize) -> Result<(), Failure> {
    let left = done.left();
    let reasons = |v: &[(String, String)]| {
        v.iter()
            .map(|(id, why)| serde_json::json!({"id": id, "reason": why}))
            .collect::<Vec<_>>()
    };
    if out.json {
        out.json_value(&serde_json::json!({
            "sent": sent_json(&done.sent),
            "dropped": reasons(&done.dropped),
            "kept": reasons(&done.kept),
            "left": left,
        }));
    } else {
        print_sent(&done.sent);
        for (id, why) in &done.dropped {
            eprintln!("removed {id}: {why}");
        }
        for (id, why) in &done.kept {
            eprintln!("kept {id}: {why}");
        }
        let taken = done.sent.len() + done.dropped.len() + done.kept.len();
        let succeeded = done
            .sent
            .iter()
            .filter(|(_, a)| a.status == AttemptStatus::Success)
            .count();
        eprintln!(
            "{} taken from the hooks dead-letter queue: {succeeded} sent and succeeded, {} removed with nothing to send, {left} left in it{}",
            crate::output::count(taken, "dead letter"),
            done.dropped.len(),
            if taken == limit {
                " (more may wait: run it again)"
            } else {
                ""
            }
        );
    }
    if left > 0 {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "{left} of the dead letters stay in the queue; `pulse hooks deliveries --hook ID` shows why each failed"
        )));
    }
    Ok(())
}

/// One line a delivery sent again: its id, type, the attempt's status and HTTP status.
fn print_sent(sent: &[(HookDelivery, HookAttempt)]) {
    for (d, a) in sent {
        outln!(
            "{}  {}  {}  {}",
            d.id,
            d.hook_type,
            a.status.as_str(),
            a.http_status.map_or("-".into(), |s| s.to_string())
        );
    }
}

/// The JSON of deliveries sent again: each with its id on top.
fn sent_json(sent: &[(HookDelivery, HookAttempt)]) -> Vec<serde_json::Value> {
    sent.iter()
        .map(|(d, a)| serde_json::json!({"id": d.id, "delivery": d, "attempt": a}))
        .collect()
}

pub(super) fn print_attempt(out: &Out, d: &HookDelivery, a: &HookAttempt) {
    if out.json {
        out.json_value(&serde_json::json!({ "delivery": d, "attempt": a }));
        return;
    }
    outln!(
        "{}  attempt {}  {}  {}  {} ms",
        d.id,
        a.attempt,
        a.status.as_str(),
        a.http_status.map_or("-".into(), |s| s.to_string()),
        a.duration_ms
    );
    if let Some(e) = &a.error {
        eprintln!("error: {e}");
    }
    if let Some(body) = &a.response_body {
        eprintln!("response: {}", short(body, 300));
    }
    eprintln!("delivery {} is now {}", d.id, d.status.as_str());
}

/// What `hooks recover` did; exit 1 when an attempt failed or a delivery was skipped.
fn recovered(out: &Out, done: &Recovered, since: jiff::Timestamp) -> Result<(), Failure> {
    let failed = done
        .replayed
        .iter()
        .filter(|(_, a)| a.status != AttemptStatus::Success)
        .count();
    if out.json {
        out.json_value(&serde_json::json!({
            "replayed": sent_json(&done.replayed),
            "skipped": done.skipped.iter().map(|(id, why)| serde_json::json!({"id": id, "reason": why})).collect::<Vec<_>>(),
            "truncated": done.truncated,
        }));
    } else {
        print_sent(&done.replayed);
        for (id, why) in &done.skipped {
            eprintln!("skipped {id}: {why}");
        }
        for hook in &done.truncated {
            eprintln!(
                "hook {hook} has more than {} deliveries since then: run it again for the older ones",
                pulse_shared::engine::RECOVER_SCAN
            );
        }
        eprintln!(
            "sent {} again since {since}: {} succeeded, {failed} failed; {} skipped",
            crate::output::count(done.replayed.len(), "delivery"),
            done.replayed.len() - failed,
            done.skipped.len()
        );
    }
    if failed > 0 || !done.skipped.is_empty() {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "{failed} of the deliveries sent again failed and {} were skipped; `pulse hooks deliveries --hook ID` shows each",
            done.skipped.len()
        )));
    }
    Ok(())
}

/// Exit 1 when the attempt did not succeed (after printing it), so scripts can tell.
pub(super) fn succeeded(d: &HookDelivery, a: &HookAttempt) -> Result<(), Failure> {
    if a.status == AttemptStatus::Success {
        return Ok(());
    }
    Err(Failure::Runtime(anyhow::anyhow!(
        "attempt {} of delivery {} did not succeed ({}); the delivery is {}",
        a.attempt,
        d.id,
        a.status.as_str(),
        d.status.as_str()
    )))
}

/// Lists a hook's latest deliveries (with their attempts in JSON).
pub(super) async fn list(
    b: &Connected,
    out: &Out,
    hook: &HookId,
    limit: usize,
) -> Result<(), Failure> {
    require_hook(b, hook).await?;
    let deliveries = b.store.list_deliveries(hook, limit).await?;
    if out.json {
        let mut rows = Vec::new();
        for d in &deliveries {
            let attempts = b.store.list_attempts(&d.id).await?;
            rows.push(serde_json::json!({ "id": d.id, "delivery": d, "attempts": attempts }));
        }
        out.json_value(&rows);
        return Ok(());
    }
    out.table(
        &deliveries,
        &[
            "DELIVERY", "TYPE", "STATUS", "ATTEMPTS", "LAST", "NEXT", "CREATED", "ERROR",
        ],
        |d| {
            vec![
                d.id.to_string(),
                d.hook_type.to_string(),
                d.status.as_str().to_owned(),
                d.attempts.to_string(),
                d.last_status.map_or("-".into(), |s| s.as_str().to_owned()),
                when(d.next_attempt_at),
                when(Some(d.created_at)),
                short(d.last_error.as_deref().unwrap_or("-"), 60),
            ]
        },
    );
    Ok(())
}
