//! Secrets at rest: the SQLite file and its -wal/-shm were created
//! 0644 and held webhook secrets, hook secrets and hook Authorization headers in plain
//! text, as did the DynamoDB table. Now files are 0600 and those values are sealed
//! (AES-256-GCM) on both backends, with key rotation and migration of plain values.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use pulse_shared::adapters::aws::{AwsClients, DynamoStore};
use pulse_shared::adapters::sqlite::{Db, SqliteStore};
use pulse_shared::domain::{
    Hook, HookTarget, HookType, Secret, Unreadable, Webhook, WebhookScheme,
};
use pulse_shared::ports::Store;
use pulse_shared::sealing::{EncryptionKeys, SEALED_PREFIX};
use pulse_tests::{Backend, Kind, moto_url, on_both_backends, test_keys};

const WEBHOOK_SECRET: &str = "whsec_d2ViaG9vay1zZWNyZXQtdGhhdC1tdXN0LW5vdC1sZWFr";
const HOOK_SECRET: &str = "whsec_aG9vay1zZWNyZXQtdGhhdC1tdXN0LW5vdC1sZWFrIQ==";
const AUTH: &str = "Bearer hook-authorization-that-must-not-leak";

/// Everything stored, as bytes: the SQLite file and its WAL, or a scan of the table.
async fn raw(b: &Backend) -> String {
    match b.kind {
        Kind::Sqlite => {
            let path = b.sqlite_file().unwrap();
            let mut all = std::fs::read(path).unwrap();
            let mut wal = path.as_os_str().to_owned();
            wal.push("-wal");
            all.extend(std::fs::read(wal).unwrap_or_default());
            String::from_utf8_lossy(&all).into_owned()
        }
        Kind::Aws => {
            let out = b
                .aws
                .as_ref()
                .unwrap()
                .dynamodb
                .scan()
                .table_name(b.table_name().unwrap())
                .send()
                .await
                .unwrap();
            format!("{:?}", out.items())
        }
    }
}

async fn records(b: &Backend) -> (Webhook, Hook) {
    let (agent, _) = b.agent("keeper", "1h").await;
    let webhook = Webhook::new(
        agent.id.clone(),
        WebhookScheme::Standard,
        WEBHOOK_SECRET,
        b.now(),
    )
    .unwrap();
    b.store.create_webhook(&webhook).await.unwrap();
    let mut hook = Hook::new(
        agent.id.clone(),
        HookType::parse("AFTER_HEARTBEAT").unwrap(),
        HookTarget::parse("https://example.com/hook").unwrap(),
        HOOK_SECRET,
        b.now(),
    );
    hook.auth_header = Some(Secret::new(AUTH));
    b.store.create_hook(&hook).await.unwrap();
    (webhook, hook)
}

async fn no_secret_is_stored_in_plain_text(kind: Kind) {
    let b = Backend::new(kind).await;
    let (webhook, hook) = records(&b).await;
    let stored = raw(&b).await;
    for secret in [WEBHOOK_SECRET, HOOK_SECRET, AUTH] {
        assert!(!stored.contains(secret), "{secret} is stored in plain text");
    }
    assert!(stored.contains(SEALED_PREFIX));
    // The engine reads them plain.
    let w = b.store.get_webhook(&webhook.id).await.unwrap().unwrap();
    assert_eq!(w.secrets_at(b.now()), [WEBHOOK_SECRET]);
    let listed = b.store.list_webhooks().await.unwrap();
    assert_eq!(listed[0].secrets_at(b.now()), [WEBHOOK_SECRET]);
    let h = b.store.get_hook(&hook.id).await.unwrap().unwrap();
    assert_eq!(h.secret.expose(), HOOK_SECRET);
    assert_eq!(h.auth_header.unwrap().expose(), AUTH);
    let h = &b.store.list_hooks(&hook.agent_id).await.unwrap()[0];
    assert_eq!(h.secret.expose(), HOOK_SECRET);
}
on_both_backends!(
    no_secret_is_stored_in_plain_text,
    no_secret_is_stored_in_plain_text
);

/// Another connection to the backend's storage, sealing with `keys`.
fn store_with(b: &Backend, keys: EncryptionKeys) -> Arc<dyn Store> {
    match b.kind {
        Kind::Sqlite => {
            Arc::new(SqliteStore::new(Db::open(b.sqlite_file().unwrap()).unwrap()).with_keys(keys))
        }
        Kind::Aws => Arc::new(
            DynamoStore::new(
                AwsClients::for_emulator(&moto_url()).dynamodb,
                b.table_name().unwrap(),
                Duration::from_secs(20),
            )
            .with_keys(keys),
        ),
    }
}

async fn a_rotated_key_still_reads_and_what_it_reads_is_sealed_again(kind: Kind) {
    let b = Backend::new(kind).await;
    let (webhook, hook) = records(&b).await;
    let old_id = test_keys().current_id().unwrap().to_owned();
    let new_key = EncryptionKeys::new_key();
    let new_only = EncryptionKeys::parse(&new_key, None).unwrap();
    let unread = store_with(&b, new_only.clone())
        .get_webhook(&webhook.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        unread.unreadable,
        Some(Unreadable {
            key_id: old_id.clone(),
            damaged: false
        })
    );
    assert!(
        unread.secrets_at(b.now()).is_empty(),
        "nothing to check with"
    );

    // The new key seals; the old one still opens, and what it opens is sealed anew.
    let rotating = EncryptionKeys::parse(
        &new_key,
        Some("cHVsc2UtdGVzdHMtZml4ZWQta2V5LTMyLWJ5dGVzISE="),
    )
    .unwrap();
    let store = store_with(&b, rotating);
    let w = store.get_webhook(&webhook.id).await.unwrap().unwrap();
    assert_eq!(w.secrets_at(b.now()), [WEBHOOK_SECRET]);
    let h = store.get_hook(&hook.id).await.unwrap().unwrap();
    assert_eq!(h.auth_header.unwrap().expose(), AUTH);
    // Now the new key alone reads both.
    let after = store_with(&b, new_only);
    assert!(after.get_webhook(&webhook.id).await.is_ok());
    assert_eq!(
        after
            .get_hook(&hook.id)
            .await
            .unwrap()
            .unwrap()
            .secret
            .expose(),
        HOOK_SECRET
    );
}
on_both_backends!(
    a_rotated_key_still_reads_and_what_it_reads_is_sealed_again,
    a_rotated_key_still_reads_and_what_it_reads_is_sealed_again
);

/// A value stored in plain text by an earlier release is sealed the first time it is read.
async fn a_plain_value_from_an_earlier_release_is_sealed_on_first_read(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("old", "1h").await;
    let webhook = Webhook::new(
        agent.id.clone(),
        WebhookScheme::Pulse,
        WEBHOOK_SECRET,
        b.now(),
    )
    .unwrap();
    let plain = serde_json::to_string(&webhook).unwrap();
    assert!(plain.contains(WEBHOOK_SECRET));
    match kind {
        Kind::Sqlite => {
            let conn = rusqlite_connection(&b);
            conn.execute(
                "INSERT INTO webhooks (id, agent_id, doc) VALUES (?1, ?2, ?3)",
                [webhook.id.as_str(), agent.id.as_str(), &plain],
            )
            .unwrap();
        }
        Kind::Aws => {
            b.aws
                .as_ref()
                .unwrap()
                .dynamodb
                .put_item()
                .table_name(b.table_name().unwrap())
                .item("pk", AttributeValue::S(format!("WH#{}", webhook.id)))
                .item("sk", AttributeValue::S("WH".into()))
                .item("doc", AttributeValue::S(plain))
                .send()
                .await
                .unwrap();
        }
    }
    assert!(raw(&b).await.contains(WEBHOOK_SECRET));
    let read = b.store.get_webhook(&webhook.id).await.unwrap().unwrap();
    assert_eq!(read.secrets_at(b.now()), [WEBHOOK_SECRET]);
    if kind == Kind::Sqlite {
        // The old page images stay in the WAL until a checkpoint: check the table itself.
        let conn = rusqlite_connection(&b);
        let doc: String = conn
            .query_row(
                "SELECT doc FROM webhooks WHERE id = ?1",
                [webhook.id.as_str()],
                |r| r.get(0),
            )
            .unwrap();
        assert!(
            !doc.contains(WEBHOOK_SECRET) && doc.contains(SEALED_PREFIX),
            "{doc}"
        );
    } else {
        assert!(!raw(&b).await.contains(WEBHOOK_SECRET));
    }
    assert_eq!(
        b.store
            .get_webhook(&webhook.id)
            .await
            .unwrap()
            .unwrap()
            .secrets_at(b.now()),
        [WEBHOOK_SECRET]
    );
}
on_both_backends!(
    a_plain_value_from_an_earlier_release_is_sealed_on_first_read,
    a_plain_value_from_an_earlier_release_is_sealed_on_first_read
);

fn rusqlite_connection(b: &Backend) -> rusqlite::Connection {
    rusqlite::Connection::open(b.sqlite_file().unwrap()).unwrap()
}

#[cfg(unix)]
#[tokio::test]
async fn the_database_and_its_key_file_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pulse.db");
    let mut config = pulse_shared::config::Config::defaults();
    config.backend = pulse_shared::config::Backend::Sqlite { path: path.clone() };
    let clock = pulse_tests::test_clock();
    let b = pulse_shared::app::connect(&config, clock.clone())
        .await
        .unwrap();
    let (agent, first) = pulse_shared::domain::NewAgent::named("x")
        .create(jiff::Timestamp::now())
        .unwrap();
    b.store.create_agent(&agent, &first).await.unwrap();
    let webhook = Webhook::new(
        agent.id.clone(),
        WebhookScheme::Pulse,
        WEBHOOK_SECRET,
        jiff::Timestamp::now(),
    )
    .unwrap();
    b.store.create_webhook(&webhook).await.unwrap();
    for suffix in ["", "-wal", "-shm", ".key"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let p = std::path::PathBuf::from(p);
        assert_eq!(mode(&p), 0o600, "{}", p.display());
    }
    // A second process finds the same key in the file.
    let again = pulse_shared::app::connect(&config, clock).await.unwrap();
    let w = again.store.get_webhook(&webhook.id).await.unwrap().unwrap();
    assert_eq!(w.secrets_at(jiff::Timestamp::now()), [WEBHOOK_SECRET]);

    // A database an earlier release left readable by others is narrowed when opened.
    let old = dir.path().join("old.db");
    std::fs::write(&old, b"").unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
    Db::open(&old).unwrap();
    assert_eq!(mode(&old), 0o600);
}

/// A past defect: with one webhook and one hook sealed under a key that is not
/// configured, `webhooks list`, `hooks list|disable|delete` and `pulse status` failed
/// outright, and the receiver answered 500 with the internal message. Now the records are
/// read marked unreadable; they can be listed, disabled, deleted and given new secrets
/// without their key (what was sealed stays as it was); status says what to do; the
/// receiver answers 503 without saying why; and no hook delivery is signed with them.
async fn a_lost_key_never_locks_the_operator_out(kind: Kind) {
    let b = Backend::new(kind).await;
    let (webhook, hook) = records(&b).await;
    let old_id = test_keys().current_id().unwrap().to_owned();
    let other = store_with(
        &b,
        EncryptionKeys::parse(&EncryptionKeys::new_key(), None).unwrap(),
    );

    // Listed, each marked with the key it needs.
    let listed = other.list_webhooks().await.unwrap();
    assert_eq!(listed.len(), 1);
    let why = listed[0].unreadable.clone().unwrap();
    assert_eq!(why.key_id, old_id);
    assert!(listed[0].summary(b.now()).unreadable.is_some());
    let hooks = other.list_hooks(&hook.agent_id).await.unwrap();
    assert_eq!(hooks[0].unreadable.as_ref().unwrap().key_id, old_id);

    // Status: one finding each, with the fix.
    let status = pulse_shared::engine::status(
        other.as_ref(),
        b.queue.as_ref(),
        None,
        b.now(),
        jiff::SignedDuration::from_secs(60),
        "",
    )
    .await
    .unwrap();
    let findings: Vec<String> = status
        .findings
        .iter()
        .map(|f| format!("{} | {}", f.what, f.look))
        .collect();
    assert!(
        findings
            .iter()
            .any(|f| f.contains(&format!("webhook {}", webhook.id))
                && f.contains(&old_id)
                && f.contains(&format!("pulse webhooks rotate {}", webhook.id))),
        "{findings:?}"
    );
    assert!(
        findings
            .iter()
            .any(|f| f.contains(&format!("hook {}", hook.id))
                && f.contains(&format!("pulse hooks rotate {}", hook.id))),
        "{findings:?}"
    );

    // Disabled without the key; the original key still opens what is stored.
    let mut w = other.get_webhook(&webhook.id).await.unwrap().unwrap();
    w.active = false;
    other.update_webhook(&w).await.unwrap();
    let back = b.store.get_webhook(&webhook.id).await.unwrap().unwrap();
    assert!(!back.active);
    assert_eq!(
        back.secrets_at(b.now()),
        [WEBHOOK_SECRET],
        "not sealed twice"
    );
    assert_eq!(
        pulse_shared::engine::set_hook_active(other.as_ref(), &hook.id, false)
            .await
            .unwrap(),
        pulse_shared::engine::Switched::Done
    );
    let back = b.store.get_hook(&hook.id).await.unwrap().unwrap();
    assert!(!back.active);
    assert_eq!(back.secret.expose(), HOOK_SECRET);

    // A new secret in place of the unreadable ones: readable with the new key alone.
    let mut w = other.get_webhook(&webhook.id).await.unwrap().unwrap();
    w.rotate(
        "whsec_bmV3LXNlY3JldC1hZnRlci10aGUta2V5LXdhcy1sb3N0",
        jiff::SignedDuration::from_hours(24),
        b.now(),
    )
    .unwrap();
    other.update_webhook(&w).await.unwrap();
    let w = other.get_webhook(&webhook.id).await.unwrap().unwrap();
    assert!(w.unreadable.is_none());
    assert_eq!(
        w.secrets_at(b.now()),
        ["whsec_bmV3LXNlY3JldC1hZnRlci10aGUta2V5LXdhcy1sb3N0"],
        "the unreadable secret is gone, grace or not"
    );
    let mut h = other.get_hook(&hook.id).await.unwrap().unwrap();
    let refused = h.rotate("whsec_bmV3LWhvb2stc2VjcmV0", None).unwrap_err();
    assert!(refused.to_string().contains("--auth-header"), "{refused}");
    h.rotate("whsec_bmV3LWhvb2stc2VjcmV0", Some(None)).unwrap();
    h.version += 1;
    other.update_hook(&h).await.unwrap();
    let h = other.get_hook(&hook.id).await.unwrap().unwrap();
    assert!(h.unreadable.is_none() && h.auth_header.is_none());
    assert_eq!(h.secret.expose(), "whsec_bmV3LWhvb2stc2VjcmV0");

    // Deleted without the key.
    let (agent, _) = b.agent("second", "1h").await;
    let mut second = Hook::new(
        agent.id.clone(),
        HookType::parse("AFTER_HEARTBEAT").unwrap(),
        HookTarget::parse("https://example.com/other").unwrap(),
        HOOK_SECRET,
        b.now(),
    );
    second.auth_header = Some(Secret::new(AUTH));
    b.store.create_hook(&second).await.unwrap();
    other.delete_hook(&second.id).await.unwrap();
    assert!(b.store.get_hook(&second.id).await.unwrap().is_none());
}
on_both_backends!(
    a_lost_key_never_locks_the_operator_out,
    a_lost_key_never_locks_the_operator_out
);

/// The receiver, over a store without the key the webhook's secret is sealed with:
/// 503 with a body that says nothing of keys, never 500 with the internal message.
#[tokio::test]
async fn a_webhook_whose_secret_cannot_be_read_is_answered_503_without_the_reason() {
    use pulse_shared::http::{self, Inbound};
    let b = Backend::new(Kind::Sqlite).await;
    let (webhook, _) = records(&b).await;
    let other = store_with(
        &b,
        EncryptionKeys::parse(&EncryptionKeys::new_key(), None).unwrap(),
    );
    let inbound = Arc::new(Inbound::new(
        other,
        b.queue.clone(),
        b.clock.clone(),
        pulse_shared::config::InboundConfig {
            discord_public_key: None,
            default_agent: None,
            telegram_secret: None,
            slack_signing_secret: None,
            delivery_memory: pulse_shared::config::InboundConfig::DEFAULT_DELIVERY_MEMORY,
            api_rate: Default::default(),
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/webhooks/{}",
        listener.local_addr().unwrap(),
        webhook.id
    );
    tokio::spawn(http::serve(
        listener,
        inbound,
        http::ServeLimits::default(),
        std::future::pending(),
    ));
    let body = br#"{"event_type":"NOTE","payload":{}}"#;
    let r = reqwest::Client::new()
        .post(&url)
        .headers(crate::inbound::signed(
            WebhookScheme::Standard,
            WEBHOOK_SECRET,
            b.now().as_second(),
            "msg_1",
            body,
        ))
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "60");
    let text = r.text().await.unwrap();
    assert!(
        !text.contains("key") && !text.contains("encrypt") && !text.contains("PULSE_"),
        "{text}"
    );
    assert!(
        b.store
            .list_events(&webhook.agent_id, 10)
            .await
            .unwrap()
            .is_empty(),
        "nothing was taken in"
    );
}

/// An MCP server's headers under a rotated key: unreadable with the new key alone (the
/// server is not called, and `pulse status` says so), readable with the old key beside
/// it, and written back (what `pulse secrets reseal` does) readable with the new alone.
async fn an_mcp_servers_headers_follow_a_key_rotation(kind: Kind) {
    use pulse_shared::domain::{McpHeader, McpServer, Tool, ToolName};
    let b = Backend::new(kind).await;
    let name = ToolName::parse("cal").unwrap();
    let server = McpServer::new(
        "https://mcp.example.com/mcp",
        vec![McpHeader::parse(&format!("Authorization: {AUTH}")).unwrap()],
        Vec::new(),
        Duration::from_secs(5),
    )
    .unwrap();
    b.store
        .add_tool(&Tool::mcp(name.clone(), server, b.now()))
        .await
        .unwrap();
    assert!(!raw(&b).await.contains(AUTH), "sealed at rest");
    let header_of = |store: Arc<dyn Store>| {
        let name = name.clone();
        async move {
            let registry = store.load_registry().await.unwrap();
            let tool = registry.tools.into_iter().find(|t| t.name == name).unwrap();
            let server = tool.mcp_server().unwrap().clone();
            (tool, server)
        }
    };
    let new_key = EncryptionKeys::new_key();
    let new_only = EncryptionKeys::parse(&new_key, None).unwrap();
    let (_, unread) = header_of(store_with(&b, new_only.clone())).await;
    assert!(unread.unreadable.is_some(), "{unread:?}");
    let status = pulse_shared::engine::status(
        store_with(&b, new_only.clone()).as_ref(),
        b.queue.as_ref(),
        None,
        b.now(),
        jiff::SignedDuration::from_secs(60),
        "run the sweeper",
    )
    .await
    .unwrap();
    assert!(
        status
            .findings
            .iter()
            .any(|f| f.what.contains("MCP server cal") && f.look.contains("tools add-mcp")),
        "{:?}",
        status.findings
    );
    let rotating = EncryptionKeys::parse(
        &new_key,
        Some("cHVsc2UtdGVzdHMtZml4ZWQta2V5LTMyLWJ5dGVzISE="),
    )
    .unwrap();
    let store = store_with(&b, rotating);
    let (tool, read) = header_of(store.clone()).await;
    assert_eq!(read.headers[0].value.expose(), AUTH);
    store.update_tool(&tool).await.unwrap();
    let (_, after) = header_of(store_with(&b, new_only)).await;
    assert_eq!(after.unreadable, None);
    assert_eq!(after.headers[0].value.expose(), AUTH);
}
on_both_backends!(
    an_mcp_servers_headers_follow_a_key_rotation,
    an_mcp_servers_headers_follow_a_key_rotation
);
