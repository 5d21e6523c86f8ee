//! The Discord client against the fake Discord on loopback: which endpoint each reply
//! goes to and with which credential, the nonce that makes a retried post one message,
//! mentions switched off, 429 waited out within its bound, 5xx retried, other errors
//! returned at once, and content Discord would refuse never sent.

use std::time::Duration;

use pulse_shared::discord::{DiscordClient, DiscordConfig, MESSAGE_LIMIT};
use pulse_shared::domain::Secret;
use pulse_shared::error::DiscordError;
use pulse_shared::ports::DiscordApi;
use pulse_tests::fake_discord::FakeDiscord;

const BOT: &str = "bot-token-for-tests";

fn client(fake: &FakeDiscord, edit: impl FnOnce(&mut DiscordConfig)) -> DiscordClient {
    let mut config = DiscordConfig {
        api_base: fake.api_base().parse().unwrap(),
        bot_token: Some(Secret::new(BOT)),
        application_id: Some("1200000000000000000".into()),
        max_retry_wait: Duration::from_secs(1),
        ..DiscordConfig::unconfigured()
    };
    edit(&mut config);
    DiscordClient::new(config)
}

#[tokio::test]
async fn channel_posts_carry_the_bot_token_a_nonce_and_no_mentions() {
    let fake = FakeDiscord::start().await;
    let c = client(&fake, |_| {});
    c.create_message("1300000000000000001", "hello @everyone", "n-1", None)
        .await
        .unwrap();
    // The same nonce again is the same message (Discord enforces it).
    c.create_message("1300000000000000001", "hello @everyone", "n-1", None)
        .await
        .unwrap();
    assert_eq!(fake.messages().len(), 1);
    let r = &fake.requests()[0];
    assert_eq!(r.path, "/api/v10/channels/1300000000000000001/messages");
    assert_eq!(r.headers["authorization"], format!("Bot {BOT}"));
    assert_eq!(r.body["nonce"], "n-1");
    assert_eq!(r.body["enforce_nonce"], true);
    assert_eq!(r.body["allowed_mentions"]["parse"], serde_json::json!([]));
}

#[tokio::test]
async fn interaction_replies_use_the_interaction_token_and_no_bot_token() {
    let fake = FakeDiscord::start().await;
    let c = client(&fake, |_| {});
    c.edit_original("itoken", "part one").await.unwrap();
    c.follow_up("itoken", "part two").await.unwrap();
    let requests = fake.requests();
    assert_eq!(
        requests[0].path,
        "/api/v10/webhooks/1200000000000000000/itoken/messages/@original"
    );
    assert_eq!(
        requests[1].path,
        "/api/v10/webhooks/1200000000000000000/itoken?wait=true"
    );
    for r in &requests {
        assert!(
            r.headers.get("authorization").is_none(),
            "the interaction token is the credential: {r:?}"
        );
    }
    let posted: Vec<String> = fake.messages().into_iter().map(|m| m.content).collect();
    assert_eq!(posted, ["part one", "part two"]);
}

#[tokio::test]
async fn a_rate_limit_is_waited_out_and_a_server_error_retried() {
    let fake = FakeDiscord::start().await;
    let c = client(&fake, |c| c.max_attempts = 3);
    fake.fail_next([429, 502]);
    c.create_message("1", "eventually", "n-2", None)
        .await
        .unwrap();
    assert_eq!(fake.requests().len(), 3);
    assert_eq!(fake.messages().len(), 1);
    // Out of attempts: the last error is returned.
    fake.fail_next([503, 503, 503]);
    let err = c
        .create_message("1", "never", "n-3", None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, DiscordError::Status { status: 503, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn a_refusal_is_returned_at_once_and_a_long_wait_is_not_waited() {
    let fake = FakeDiscord::start().await;
    let c = client(&fake, |c| {
        c.max_attempts = 3;
        c.max_retry_wait = Duration::ZERO;
    });
    fake.fail_next([403]);
    let err = c.create_message("1", "no", "n-4", None).await.unwrap_err();
    assert!(
        matches!(err, DiscordError::Status { status: 403, .. }),
        "{err}"
    );
    assert_eq!(fake.requests().len(), 1, "a 4xx is not retried");
    fake.fail_next([429]);
    let err = c
        .create_message("1", "later", "n-5", None)
        .await
        .unwrap_err();
    assert!(matches!(err, DiscordError::RateLimited { .. }), "{err}");
    assert_eq!(fake.requests().len(), 2, "a wait beyond the bound gives up");
}

#[tokio::test]
async fn what_discord_would_refuse_is_never_sent() {
    let fake = FakeDiscord::start().await;
    let too_long = "x".repeat(MESSAGE_LIMIT + 1);
    let err = client(&fake, |_| {})
        .create_message("1", &too_long, "n-6", None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("split"), "{err}");
    let err = client(&fake, |c| c.bot_token = None)
        .create_message("1", "hi", "n-7", None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("DISCORD_BOT_TOKEN"), "{err}");
    let err = client(&fake, |c| c.application_id = None)
        .edit_original("t", "hi")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("DISCORD_APPLICATION_ID"), "{err}");
    assert!(fake.requests().is_empty());
}
