//! The cloud requests one unit of work makes — a heartbeat's run, a conversation turn —
//! counted as they are sent, so each record can carry what it cost.
//!
//! [`scope`] runs a future with a tally of its own (a task-local: the futures a worker
//! runs side by side in one task each keep their own). The AWS adapters' request
//! counter adds every request it sees to the tally of the future that sent it
//! ([`count`], [`count_read`]); outside a scope, nothing is kept. The engine moves what
//! was counted onto the record it is about to write ([`stamp`]); the adapter writing it
//! adds that write itself, which only it can size, on the stored copy (the next stamp
//! takes the counted one).

use std::cell::RefCell;
use std::future::Future;

use crate::domain::Requests;

tokio::task_local! {
    static TALLY: RefCell<Requests>;
}

/// Runs `f` with a fresh tally.
pub async fn scope<F: Future>(f: F) -> F::Output {
    TALLY.scope(RefCell::new(Requests::default()), f).await
}

/// One `op` request, consuming `wru` DynamoDB write units, sent by the current task's
/// unit of work.
pub fn count(op: &str, wru: f64) {
    let _ = TALLY.try_with(|t| t.borrow_mut().count(op, wru));
}

/// Read units a response of the current unit of work consumed.
pub fn count_read(rru: f64) {
    let _ = TALLY.try_with(|t| t.borrow_mut().rru += rru);
}

/// What was counted since the last take (empty outside a scope), leaving the tally at
/// zero.
pub fn take() -> Requests {
    TALLY
        .try_with(|t| std::mem::take(&mut *t.borrow_mut()))
        .unwrap_or_default()
}

/// Adds what was counted since the last take to a record's requests.
pub fn stamp(on: &mut Option<Requests>) {
    let counted = take();
    if !counted.is_empty() {
        on.get_or_insert_with(Requests::default).add(&counted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_scope_keeps_its_own_count_and_nothing_is_kept_outside_one() {
        count("DynamoDB.Query", 0.0);
        assert!(take().is_empty());
        let one = scope(async {
            count("DynamoDB.Query", 0.0);
            tokio::task::yield_now().await;
            count_read(0.5);
            let mut record = None;
            stamp(&mut record);
            count("DynamoDB.PutItem", 1.0);
            stamp(&mut record);
            record.unwrap()
        });
        let two = scope(async {
            tokio::task::yield_now().await;
            count("SQS.SendMessage", 0.0);
            take()
        });
        let (one, two) = tokio::join!(one, two);
        assert_eq!(one.total(), 2);
        assert_eq!((one.wru, one.rru), (1.0, 0.5));
        assert_eq!(two.total(), 1);
        assert_eq!(two.ops["SQS.SendMessage"], 1);
    }
}
