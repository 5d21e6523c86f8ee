//! Randomness: the one place Pulse draws random bits (id suffixes, jitter, the sweep's
//! starting shard, queue receipts) and the wall time stamped into ids that carry no
//! record time (agents, webhooks, hooks).
//!
//! By default both come from the operating system. The simulator installs a seeded
//! source on its thread with [`seed`], so a run draws the same bits, in the same order,
//! from the same seed, and its ids carry virtual time: a run replays from one number.
//! A thread-local, not a parameter, because ids are made deep inside the domain; the
//! simulator runs everything on one thread, and an unseeded thread is never affected.

use std::cell::RefCell;

/// The few most recent milliseconds whose last monotonic value is kept.
const RECENT: usize = 16;

struct Seeded {
    rng: fastrand::Rng,
    now_ms: Box<dyn Fn() -> u64>,
    last: Vec<(u64, u128)>,
}

thread_local! {
    static SEEDED: RefCell<Option<Seeded>> = const { RefCell::new(None) };
}

/// Uninstalls the seeded source when dropped.
#[must_use = "the seeded source is uninstalled when the guard is dropped"]
pub struct SeedGuard(());

impl Drop for SeedGuard {
    fn drop(&mut self) {
        SEEDED.with(|s| s.borrow_mut().take());
    }
}

/// Draws this thread's random bits from `seed`, and the wall time of new ids from
/// `now_ms`, until the guard is dropped.
pub fn seed(seed: u64, now_ms: impl Fn() -> u64 + 'static) -> SeedGuard {
    SEEDED.with(|s| {
        *s.borrow_mut() = Some(Seeded {
            rng: fastrand::Rng::with_seed(seed),
            now_ms: Box::new(now_ms),
            last: Vec::new(),
        })
    });
    SeedGuard(())
}

/// 128 random bits.
pub fn bits() -> u128 {
    SEEDED
        .with(|s| s.borrow_mut().as_mut().map(|s| s.rng.u128(..)))
        .unwrap_or_else(|| ulid::Ulid::new().random() | (u128::from(fastrand::u64(..)) << 80))
}

/// A uniform number in [0, 1).
pub fn unit() -> f64 {
    (bits() as u64 >> 11) as f64 / (1u64 << 53) as f64
}

/// A uniform number in `0..n` (`n` > 0).
pub fn below(n: u64) -> u64 {
    (bits() % u128::from(n.max(1))) as u64
}

/// Milliseconds since the Unix epoch, for ids that carry the time they were made.
pub fn now_ms() -> u64 {
    SEEDED
        .with(|s| s.borrow().as_ref().map(|s| (s.now_ms)()))
        .unwrap_or_else(|| jiff::Timestamp::now().as_millisecond().max(0) as u64)
}

/// A new ULID stamped now.
pub fn ulid() -> ulid::Ulid {
    ulid::Ulid::from_parts(now_ms(), bits())
}

/// Random bits for a ULID stamped `ms` that are greater than the last ones this thread's
/// source (or, unseeded, this process) made in the same millisecond, so ids made one
/// after another sort in that order. The last value is kept for the few most recent
/// milliseconds, not just the latest: ids stamped with different times (a record's own
/// time, a clock that was set) may be made in between without breaking the order within
/// each.
pub fn monotonic(ms: u64) -> u128 {
    static LAST: std::sync::Mutex<Vec<(u64, u128)>> = std::sync::Mutex::new(Vec::new());
    let seeded = SEEDED.with(|s| {
        s.borrow_mut().as_mut().map(|s| {
            let fresh = s.rng.u128(..);
            next_in(&mut s.last, ms, fresh)
        })
    });
    seeded.unwrap_or_else(|| {
        let fresh = bits();
        let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
        next_in(&mut last, ms, fresh)
    })
}

fn next_in(last: &mut Vec<(u64, u128)>, ms: u64, fresh: u128) -> u128 {
    // 80 random bits; keep headroom so increments never carry into the timestamp.
    let found = last.iter().position(|(m, _)| *m == ms);
    let random = match found.map(|i| last.remove(i)) {
        Some((_, r)) if r < (1u128 << 80) - (1u128 << 20) => r + 1,
        _ => (fresh & ((1u128 << 80) - 1)) >> 1,
    };
    if last.len() == RECENT {
        last.remove(0);
    }
    last.push((ms, random));
    random
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_draws_the_same_bits_and_stamps_ids_with_its_clock() {
        let draw = || {
            let _g = seed(7, || 1_000);
            (
                bits(),
                unit(),
                below(10),
                ulid(),
                monotonic(5),
                monotonic(5),
            )
        };
        let (a, b) = (draw(), draw());
        assert_eq!(a, b);
        assert_eq!(a.3.timestamp_ms(), 1_000);
        assert_eq!(a.5, a.4 + 1, "the same millisecond counts up");
        let other = {
            let _g = seed(8, || 1_000);
            bits()
        };
        assert_ne!(a.0, other);
        // Unseeded again: two draws differ.
        assert_ne!(bits(), bits());
    }
}
