//! Stored secrets that no configured key opens.

use std::fmt;

use serde::Serialize;

/// A record's secrets that no configured key opens: the key they were sealed with was
/// lost, or not given to this process. The record is still read (listed, disabled,
/// deleted, rotated); its secrets are kept as stored, sealed, and never used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Unreadable {
    /// The id of the key they are sealed with (8 hex digits).
    pub key_id: String,
    /// That key is configured but does not open them (damaged, or moved from another
    /// record), rather than not configured.
    pub damaged: bool,
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.damaged {
            write!(
                f,
                "its secret does not decrypt with key {}: damaged, or copied from another record",
                self.key_id
            )
        } else {
            write!(
                f,
                "its secret is encrypted with key {}, which is not configured",
                self.key_id
            )
        }
    }
}
