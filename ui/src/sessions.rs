//! Dashboard sessions when it is reached with a token (a listener beyond loopback).
//!
//! Each login opens a session of its own: a random id in an `HttpOnly`, `SameSite=Strict`
//! cookie (`Secure` when the page was served over https), and a random CSRF token that
//! only that session's pages carry. A session ends [`LIFETIME`] after the login, at
//! logout, or when the process stops (sessions are kept in memory only): a stolen cookie
//! is good for one session, never for the next login.
//!
//! Logins are throttled by address (an IPv6 client by its /64), never for everyone: an
//! address that gave a wrong token [`PER_ADDRESS`] times within [`WINDOW`] waits for the
//! window to end, and the owner's right token from any other address always gets in (a
//! crowd of wrong tokens from elsewhere once locked everyone out). A token of 16 or more
//! random characters is not guessed at that rate, from however many addresses.

use std::collections::HashMap;
use std::sync::Mutex;

use hmac::{Hmac, KeyInit, Mac};
use jiff::{SignedDuration, Timestamp};
use sha2::Sha256;

/// How long a session lasts after its login.
pub(crate) const LIFETIME: SignedDuration = SignedDuration::from_hours(12);
/// Most sessions open at once; a new login past it ends the oldest.
const MAX_SESSIONS: usize = 256;
/// The window wrong tokens are counted in.
pub(crate) const WINDOW: SignedDuration = SignedDuration::from_mins(15);
/// Wrong tokens one address may give within [`WINDOW`].
pub(crate) const PER_ADDRESS: u32 = 5;
/// Addresses whose wrong tokens are remembered at once; past it the oldest are forgotten.
const ADDRESSES_KEPT: usize = 10_000;

/// The key an address's wrong tokens are counted under.
fn counted_as(address: &str) -> String {
    match address.parse::<std::net::IpAddr>() {
        Ok(ip) => pulse_shared::http::counted_as(ip).to_string(),
        Err(_) => address.to_owned(),
    }
}

/// An open session: what its pages carry, and when it ends.
#[derive(Clone)]
struct Session {
    csrf: String,
    opened: Timestamp,
}

/// Wrong tokens counted since `since`.
#[derive(Clone, Copy)]
struct Failures {
    since: Timestamp,
    count: u32,
}

impl Failures {
    /// The count at `now` (a window that has ended counts nothing).
    fn at(self, now: Timestamp) -> u32 {
        if now.duration_since(self.since) >= WINDOW {
            0
        } else {
            self.count
        }
    }

    fn add(self, now: Timestamp) -> Self {
        match self.at(now) {
            0 => Self {
                since: now,
                count: 1,
            },
            n => Self {
                since: self.since,
                count: n + 1,
            },
        }
    }
}

#[derive(Default)]
struct State {
    /// By the MAC of the session id: a lookup's timing says nothing of the ids.
    open: HashMap<[u8; 32], Session>,
    by_address: HashMap<String, Failures>,
}

/// The sessions of one dashboard process.
pub(crate) struct Sessions {
    key: [u8; 32],
    state: Mutex<State>,
}

/// A session just opened.
pub(crate) struct Opened {
    /// The cookie's value.
    pub(crate) id: String,
    /// Its pages' CSRF token.
    pub(crate) csrf: String,
}

pub(crate) fn random_hex() -> String {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).expect("the OS random source works");
    hex::encode(b)
}

impl Sessions {
    pub(crate) fn new() -> Self {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).expect("the OS random source works");
        Self {
            key,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot(&self, id: &str) -> [u8; 32] {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key).expect("any key length");
        m.update(id.as_bytes());
        m.finalize().into_bytes().into()
    }

    /// Opens a session at `now`.
    pub(crate) fn open(&self, now: Timestamp) -> Opened {
        let opened = Opened {
            id: random_hex(),
            csrf: random_hex(),
        };
        let mut s = self.state();
        s.open
            .retain(|_, session| now.duration_since(session.opened) < LIFETIME);
        if s.open.len() >= MAX_SESSIONS
            && let Some(oldest) = s
                .open
                .iter()
                .min_by_key(|(_, session)| session.opened)
                .map(|(slot, _)| *slot)
        {
            s.open.remove(&oldest);
        }
        s.open.insert(
            self.slot(&opened.id),
            Session {
                csrf: opened.csrf.clone(),
                opened: now,
            },
        );
        opened
    }

    /// The CSRF token of the session `id`, if it is open at `now`.
    pub(crate) fn find(&self, id: &str, now: Timestamp) -> Option<String> {
        let slot = self.slot(id);
        let mut s = self.state();
        match s.open.get(&slot) {
            Some(session) if now.duration_since(session.opened) < LIFETIME => {
                Some(session.csrf.clone())
            }
            Some(_) => {
                s.open.remove(&slot);
                None
            }
            None => None,
        }
    }

    /// Ends the session `id`.
    pub(crate) fn close(&self, id: &str) {
        let slot = self.slot(id);
        self.state().open.remove(&slot);
    }

    /// How long a login from `address` must wait at `now`, if it must.
    pub(crate) fn throttled(&self, address: &str, now: Timestamp) -> Option<SignedDuration> {
        let s = self.state();
        s.by_address
            .get(&counted_as(address))
            .filter(|f| f.at(now) >= PER_ADDRESS)
            .map(|f| WINDOW - now.duration_since(f.since))
    }

    /// Counts a wrong token from `address` at `now`.
    pub(crate) fn failed(&self, address: &str, now: Timestamp) {
        let mut s = self.state();
        let key = counted_as(address);
        s.by_address
            .retain(|_, f| now.duration_since(f.since) < WINDOW);
        if s.by_address.len() >= ADDRESSES_KEPT && !s.by_address.contains_key(&key) {
            let oldest = s
                .by_address
                .iter()
                .min_by_key(|(_, f)| f.since)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                s.by_address.remove(&oldest);
            }
        }
        let f = s.by_address.get(&key).copied().map_or(
            Failures {
                since: now,
                count: 1,
            },
            |f| f.add(now),
        );
        s.by_address.insert(key, f);
    }

    /// Forgets `address`'s wrong tokens after a right one.
    pub(crate) fn succeeded(&self, address: &str) {
        self.state().by_address.remove(&counted_as(address));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_its_own_until_it_ends_and_wrong_tokens_make_an_address_wait() {
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let s = Sessions::new();
        let a = s.open(t0);
        let b = s.open(t0);
        assert_ne!(a.id, b.id);
        assert_ne!(a.csrf, b.csrf);
        assert_eq!(s.find(&a.id, t0).as_deref(), Some(a.csrf.as_str()));
        assert_eq!(s.find("0123", t0), None);
        s.close(&a.id);
        assert_eq!(s.find(&a.id, t0), None, "logged out");
        assert!(
            s.find(&b.id, t0 + LIFETIME - SignedDuration::from_secs(1))
                .is_some()
        );
        assert_eq!(s.find(&b.id, t0 + LIFETIME), None, "expired");

        for _ in 0..PER_ADDRESS {
            assert_eq!(s.throttled("10.0.0.1", t0), None);
            s.failed("10.0.0.1", t0);
        }
        assert_eq!(s.throttled("10.0.0.1", t0), Some(WINDOW));
        assert_eq!(s.throttled("10.0.0.2", t0), None, "another address");
        assert_eq!(
            s.throttled("10.0.0.1", t0 + WINDOW),
            None,
            "the window ended"
        );
        // A crowd of wrong tokens from elsewhere makes nobody else wait.
        for i in 0..1_000 {
            s.failed(&format!("10.1.{}.{}", i / 200, i % 200), t0);
        }
        assert_eq!(s.throttled("10.0.0.3", t0), None, "the owner gets in");
        // An IPv6 client is counted by its /64.
        for i in 0..PER_ADDRESS {
            s.failed(&format!("2001:db8:1:2::{i}"), t0);
        }
        assert_eq!(s.throttled("2001:db8:1:2::ff", t0), Some(WINDOW));
        assert_eq!(s.throttled("2001:db8:1:3::1", t0), None);
    }
}
