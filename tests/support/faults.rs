//! Fault injection on real storage: [`FaultyStore`] wraps any backend's [`Store`] and fails
//! a port call, named as the trait method is (`"start_action"`, `"claim"`, ...), while a
//! test says so. How the tests provoke an engine failure (storage failing mid-run) without
//! a fake backend.
//!
//! ```ignore
//! let faulty = Arc::new(faults::faulty(backend.store.clone()));
//! faulty.policy().fail("start_action");          // every call fails until healed
//! faulty.policy().fail_times("finish", 2);       // the next two calls fail
//! faulty.policy().heal("start_action");
//! ```
//!
//! The wrapper itself is the simulator's ([`pulse_sim::FaultyStore`]); this file is the
//! tests' policy for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use pulse_shared::error::StoreError;

pub use pulse_shared::ports::Store;

/// Which calls fail, and for how long.
#[derive(Default)]
pub struct Faults {
    /// Operation → calls left to fail (`None`: until healed).
    failing: Mutex<HashMap<&'static str, Option<u32>>>,
    /// Operation → calls that were failed.
    failed: Mutex<HashMap<&'static str, u32>>,
}

impl Faults {
    /// Every call of `op` fails until [`heal`](Self::heal).
    pub fn fail(&self, op: &'static str) {
        lock(&self.failing).insert(op, None);
    }

    /// The next `n` calls of `op` fail.
    pub fn fail_times(&self, op: &'static str, n: u32) {
        lock(&self.failing).insert(op, Some(n));
    }

    /// Calls of `op` succeed again.
    pub fn heal(&self, op: &'static str) {
        lock(&self.failing).remove(op);
    }

    /// How many calls of `op` were made to fail.
    pub fn failed(&self, op: &str) -> u32 {
        lock(&self.failed).get(op).copied().unwrap_or(0)
    }

    /// `Err` (a backend failure, as if the database were down) when `op` is to fail.
    pub fn check(&self, op: &'static str) -> Result<(), StoreError> {
        let mut failing = lock(&self.failing);
        let fail = match failing.get_mut(op) {
            None => false,
            Some(None) => true,
            Some(Some(0)) => false,
            Some(Some(n)) => {
                *n -= 1;
                true
            }
        };
        drop(failing);
        if !fail {
            return Ok(());
        }
        *lock(&self.failed).entry(op).or_default() += 1;
        Err(StoreError::backend("test", op, "injected backend failure"))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A store that delegates every call to a real backend, failing those [`Faults`] names.
pub type FaultyStore = pulse_sim::FaultyStore<Faults>;

/// Wraps `inner`; nothing fails until told.
pub fn faulty(inner: Arc<dyn Store>) -> FaultyStore {
    pulse_sim::FaultyStore::new(inner, Arc::default())
}

#[async_trait]
impl pulse_sim::StorePolicy for Faults {
    async fn before(&self, op: &'static str) -> Result<(), StoreError> {
        self.check(op)
    }
}
