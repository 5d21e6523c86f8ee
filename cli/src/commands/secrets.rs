//! `pulse secrets …`: the key stored secrets are encrypted with. `new-key` prints a key
//! for `PULSE_ENCRYPTION_KEY`; `reseal` reads every webhook and hook, which encrypts
//! again with the current key whatever is stored in plain text or under an old key, and
//! writes every MCP server back (its headers sealed with the current key), so that an
//! old key can be dropped after a rotation.

use clap::Subcommand;
use pulse_shared::app::Connected;
use pulse_shared::sealing::EncryptionKeys;

use crate::Failure;
use crate::output::{Out, outln};

#[derive(Subcommand, Debug)]
pub(crate) enum SecretsCmd {
    /// Print a new random key (the base64 of 32 bytes) for PULSE_ENCRYPTION_KEY.
    NewKey,
    /// Encrypt every stored secret with the current key (PULSE_ENCRYPTION_KEY), reading
    /// the old ones with PULSE_ENCRYPTION_OLD_KEYS; afterwards the old keys can go.
    Reseal,
}

/// `pulse secrets new-key`: needs no configuration.
pub(crate) fn new_key(out: &Out) {
    let key = EncryptionKeys::new_key();
    if out.json {
        out.json_value(&serde_json::json!({ "key": key }));
    } else {
        outln!("{key}");
        eprintln!(
            "set it as PULSE_ENCRYPTION_KEY where Pulse runs (in AWS, as a SecureString under the secrets path); keep a copy: without it stored secrets cannot be read"
        );
    }
}

/// `pulse secrets reseal`. Records no configured key opens are left as they are and
/// listed, with the fix; the command then fails, since the old keys are still needed.
pub(crate) async fn reseal(b: &Connected, out: &Out) -> Result<(), Failure> {
    let mut webhooks = 0;
    let mut unreadable = Vec::new();
    for w in b.store.list_webhooks().await? {
        // Reading one by its key seals it again if it was stale.
        let Some(w) = b.store.get_webhook(&w.id).await? else {
            continue;
        };
        match &w.unreadable {
            Some(why) => unreadable.push(format!(
                "webhook {}: {why} (restore that key, or `pulse webhooks rotate {}`)",
                w.id, w.id
            )),
            None => webhooks += 1,
        }
    }
    let mut hooks = 0;
    for agent in b.store.list_agents().await? {
        for h in b.store.list_hooks(&agent.id).await? {
            let Some(h) = b.store.get_hook(&h.id).await? else {
                continue;
            };
            match &h.unreadable {
                Some(why) => unreadable.push(format!(
                    "hook {}: {why} (restore that key, or `pulse hooks rotate {}`)",
                    h.id, h.id
                )),
                None => hooks += 1,
            }
        }
    }
    // An MCP server's headers are sealed again by writing the server back.
    let mut servers = 0;
    for t in b.store.load_registry().await?.tools {
        let Some(m) = t.mcp_server() else {
            continue;
        };
        match &m.unreadable {
            Some(why) => unreadable.push(format!(
                "MCP server {}: {why} (restore that key, or `pulse tools remove {}` and add it again with its headers)",
                t.name, t.name
            )),
            None => {
                if !m.headers.is_empty() {
                    b.store.update_tool(&t).await?;
                }
                servers += 1;
            }
        }
    }
    if out.json {
        out.json_value(&serde_json::json!({
            "webhooks": webhooks,
            "hooks": hooks,
            "mcp_servers": servers,
            "unreadable": unreadable,
        }));
    } else if unreadable.is_empty() {
        eprintln!(
            "{webhooks} webhooks, {hooks} hooks and {servers} MCP servers are encrypted with the current key; the old keys are no longer needed for them"
        );
    } else {
        eprintln!(
            "{webhooks} webhooks, {hooks} hooks and {servers} MCP servers are encrypted with the current key; {} cannot be read with any configured key:",
            unreadable.len()
        );
        for line in &unreadable {
            eprintln!("  {line}");
        }
    }
    if unreadable.is_empty() {
        Ok(())
    } else {
        Err(Failure::Attention(format!(
            "{} stored secrets are not encrypted with the current key; keep the old keys until they are",
            unreadable.len()
        )))
    }
}
