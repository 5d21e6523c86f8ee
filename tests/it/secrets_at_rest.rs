//! Secrets at rest (hardening finding 8): the SQLite file and its -wal/-shm were created
//! 0644 and held webhook secrets, hook secrets and hook Authorization headers in plain
//! text, as did the DynamoDB table. Now files are 0600 and those values are sealed
//! (AES-256-GCM) on both backends, with key rotation and migration of plain values.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use pulse_shared::adapters::aws::{AwsClients, DynamoStore};
use pulse_shared::adapters::sqlite::{Db, SqliteStore};
use pulse_shared::domain::{Hook, HookTarget, HookType, Secret, Webhook, WebhookScheme};
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
    let err = store_with(&b, new_only.clone())
        .get_webhook(&webhook.id)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("PULSE_ENCRYPTION_OLD_KEYS") && err.contains(&old_id),
        "{err}"
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
