//! Changing a hook: its settings (`hooks update`) and its signing secret (`hooks rotate`).

use pulse_shared::app::Connected;
use pulse_shared::domain::{HookId, Secret};
use pulse_shared::error::StoreError;
use pulse_signatures::inbound::generate_secret;

use super::{HookChanges, check_target, require_hook};
use crate::Failure;
use crate::output::{Out, outln};

/// Applies `c` over the version read, reading again if another writer got there first.
pub(super) async fn update(
    b: &Connected,
    out: &Out,
    id: &HookId,
    c: &HookChanges,
) -> Result<(), Failure> {
    if let Some(t) = &c.target {
        check_target(b, t)?;
    }
    for _ in 0..5 {
        let mut hook = require_hook(b, id).await?;
        if let Some(t) = &c.target {
            hook.target = t.clone();
        }
        if let Some(a) = &c.auth_header {
            hook.auth_header = a.clone();
        }
        if let Some(t) = c.timeout {
            hook.timeout = t;
        }
        if let Some(r) = &c.retry {
            hook.retry = r.clone();
        }
        if let Some(d) = c.disable_after {
            hook.disable_after = d;
        }
        hook.version += 1;
        match b.store.update_hook(&hook).await {
            Ok(()) => {
                out.created(&hook.summary(), id.as_str(), &format!("updated hook {id}"));
                return Ok(());
            }
            Err(StoreError::Conflict(_)) => continue,
            Err(e) => return Err(crate::commands::store(e)),
        }
    }
    Err(Failure::Runtime(anyhow::anyhow!(
        "hook {id} kept changing while it was updated; try again"
    )))
}

/// Gives a hook a new signing secret (and, with `auth`, a new Authorization header or
/// none), and prints the secret once. A hook whose secrets no configured key opens can
/// be sent to again afterwards.
pub(super) async fn rotate(
    b: &Connected,
    out: &Out,
    id: &HookId,
    auth: Option<Option<Secret>>,
) -> Result<(), Failure> {
    let secret = generate_secret();
    for _ in 0..5 {
        let mut hook = require_hook(b, id).await?;
        let was_unreadable = hook.unreadable.clone();
        hook.rotate(&secret, auth.clone())
            .map_err(crate::commands::input)?;
        hook.version += 1;
        match b.store.update_hook(&hook).await {
            Ok(()) => {
                if out.json {
                    out.json_value(&serde_json::json!({
                        "hook": hook.summary(),
                        "secret": secret,
                    }));
                } else {
                    outln!("{secret}");
                    eprintln!(
                        "hook {id} has a new signing secret (shown once, above): give it to the receiver; deliveries are signed with it from now on{}",
                        if was_unreadable.is_some() {
                            " (`pulse hooks recover --hook ID --since ...` sends again those that failed meanwhile)"
                        } else {
                            ""
                        }
                    );
                }
                return Ok(());
            }
            Err(StoreError::Conflict(_)) => continue,
            Err(e) => return Err(crate::commands::store(e)),
        }
    }
    Err(Failure::Runtime(anyhow::anyhow!(
        "hook {id} kept changing while its secret was rotated; try again"
    )))
}
