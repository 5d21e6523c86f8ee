//! API tokens: what a program shows to talk to one agent over the messages API.
//!
//! A token reads `pt_<ULID>.<secret>`: the part before the dot is its id (how the record
//! is found, shown in listings), the part after is 32 random bytes in base64url, shown
//! once when the token is made. Only the SHA-256 of the secret is stored: a copy of the
//! database does not hold a usable token, and the secret's 256 random bits make a slow
//! hash unnecessary. The comparison is in constant time.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::ids::{AgentId, TokenId};
use crate::error::ValidationError;

/// The longest a token may live: a year; `--expires never` makes one that does not
/// expire.
pub const MAX_TOKEN_LIFE: SignedDuration = SignedDuration::from_hours(366 * 24);

/// A stored API token (its secret's digest, never the secret).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiToken {
    /// Its id (`pt_` + ULID), the token's public half.
    pub id: TokenId,
    /// The one agent it speaks to.
    pub agent_id: AgentId,
    /// What it is for, as its maker wrote it.
    #[serde(default)]
    pub label: String,
    /// Hex SHA-256 of its secret.
    pub digest: String,
    /// When it was made.
    pub created_at: Timestamp,
    /// When it stops working, if ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
    /// When it was revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<Timestamp>,
}

/// Why a token was refused. Each says what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    /// No `Authorization: Bearer` header.
    #[error(
        "no token: send `Authorization: Bearer <token>`; make one with `pulse tokens create --agent AGENT`"
    )]
    Missing,
    /// Not a token, unknown, or the wrong secret (not told apart: a guesser learns nothing).
    #[error(
        "the token is not valid; check it was copied whole, or make a new one with `pulse tokens create --agent AGENT`"
    )]
    Invalid,
    /// Past its expiry.
    #[error("the token expired at {0}; make a new one with `pulse tokens create --agent AGENT`")]
    Expired(Timestamp),
    /// Revoked.
    #[error(
        "the token was revoked at {0}; make a new one with `pulse tokens create --agent AGENT`"
    )]
    Revoked(Timestamp),
}

impl ApiToken {
    /// A new token for `agent`, living `life` (or forever), with the secret to hand out
    /// once.
    pub fn issue(
        agent: &AgentId,
        label: &str,
        life: Option<SignedDuration>,
        now: Timestamp,
    ) -> Result<(Self, String), ValidationError> {
        if let Some(life) = life
            && (life <= SignedDuration::ZERO || life > MAX_TOKEN_LIFE)
        {
            return Err(ValidationError::new(
                "expiry",
                "a token lives from a minute to a year (e.g. 30d), or `never`",
            ));
        }
        let label = label.trim();
        if label.chars().count() > 100 || label.chars().any(char::is_control) {
            return Err(ValidationError::new(
                "label",
                "a label is at most 100 characters, without control characters",
            ));
        }
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).expect("the operating system's random number generator failed");
        let secret = URL_SAFE_NO_PAD.encode(bytes);
        let id = TokenId::generate();
        let token = Self {
            digest: digest(&secret),
            id: id.clone(),
            agent_id: agent.clone(),
            label: label.to_owned(),
            created_at: now,
            expires_at: life.map(|l| now + l),
            revoked_at: None,
        };
        Ok((token, format!("{id}.{secret}")))
    }

    /// Splits a presented token into its id and secret; `Invalid` if it is not one.
    pub fn split(presented: &str) -> Result<(TokenId, &str), TokenRefusal> {
        let (id, secret) = presented
            .trim()
            .split_once('.')
            .ok_or(TokenRefusal::Invalid)?;
        let id = TokenId::parse(id).map_err(|_| TokenRefusal::Invalid)?;
        if secret.is_empty() || secret.len() > 64 {
            return Err(TokenRefusal::Invalid);
        }
        Ok((id, secret))
    }

    /// Whether `secret` is this token's and it may be used at `now`.
    pub fn admit(&self, secret: &str, now: Timestamp) -> Result<(), TokenRefusal> {
        if !constant_time_eq(digest(secret).as_bytes(), self.digest.as_bytes()) {
            return Err(TokenRefusal::Invalid);
        }
        if let Some(at) = self.revoked_at {
            return Err(TokenRefusal::Revoked(at));
        }
        match self.expires_at {
            Some(at) if at <= now => Err(TokenRefusal::Expired(at)),
            _ => Ok(()),
        }
    }

    /// `active`, `expired` or `revoked` at `now`.
    pub fn state(&self, now: Timestamp) -> &'static str {
        if self.revoked_at.is_some() {
            "revoked"
        } else if self.expires_at.is_some_and(|at| at <= now) {
            "expired"
        } else {
            "active"
        }
    }
}

fn digest(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_admitted_by_its_secret_until_it_expires_or_is_revoked() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let agent = AgentId::generate();
        let (mut token, presented) =
            ApiToken::issue(&agent, "ci", Some(SignedDuration::from_hours(24)), now).unwrap();
        assert!(
            !presented.contains(&token.digest),
            "the digest is not the secret"
        );
        let (id, secret) = ApiToken::split(&presented).unwrap();
        assert_eq!(id, token.id);
        assert_eq!(token.admit(secret, now), Ok(()));
        assert_eq!(token.admit("guess", now), Err(TokenRefusal::Invalid));
        let later = now + SignedDuration::from_hours(25);
        assert!(matches!(
            token.admit(secret, later),
            Err(TokenRefusal::Expired(_))
        ));
        assert_eq!(token.state(later), "expired");
        token.revoked_at = Some(now);
        assert!(matches!(
            token.admit(secret, now),
            Err(TokenRefusal::Revoked(_))
        ));
        assert_eq!(ApiToken::split("pt_nonsense"), Err(TokenRefusal::Invalid));
        assert!(ApiToken::issue(&agent, "", Some(SignedDuration::from_hours(9000)), now).is_err());
        assert!(ApiToken::issue(&agent, "", Some(SignedDuration::ZERO), now).is_err());
    }
}
