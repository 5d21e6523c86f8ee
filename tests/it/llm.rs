//! Where the model and Discord clients send credentials: the
//! deployment's key goes only to the base URLs it was configured for, an agent's own base
//! URL needs its own key and goes through the egress guard, and no client follows a
//! redirect. Every server here is a real HTTP server on loopback.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router as Http;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::any;
use pulse_shared::discord::{DiscordClient, DiscordConfig};
use pulse_shared::domain::{
    Agent, AgentLlm, ChatMessage, LlmRequest, NewAgent, ProviderKind, Secret,
};
use pulse_shared::llm::{KeyLookup, LlmConfig, Router};
use pulse_shared::ports::{DiscordApi, LlmSelector};
use pulse_tests::fake_llm::FakeLlm;

const DEPLOYMENT_KEY: &str = "sk-deployment-key";
const AGENT_KEY: &str = "sk-agent-own-key";

fn agent(llm: AgentLlm) -> Agent {
    let mut new = NewAgent::named("keys");
    new.llm = llm;
    new.create(jiff::Timestamp::now()).unwrap().0
}

fn request() -> LlmRequest {
    LlmRequest {
        model: None,
        messages: vec![ChatMessage::user("hello")],
        tools: Vec::new(),
        max_tokens: 16,
        ..LlmRequest::default()
    }
}

/// The deployment: Anthropic at `home` with its key; agents' keys from a fixed map.
fn config(home: &str, trusted: &[&str]) -> LlmConfig {
    LlmConfig {
        provider: ProviderKind::Anthropic,
        base_url: Some(home.parse().unwrap()),
        anthropic_key: Some(Secret::new(DEPLOYMENT_KEY)),
        trusted_base_urls: trusted.iter().map(|u| u.parse().unwrap()).collect(),
        agent_keys: KeyLookup::new(|var| match var {
            "PULSE_LLM_KEY_OTHER" => Some(AGENT_KEY.to_owned()),
            // Were the prefix not enforced, an agent could name these.
            "ANTHROPIC_API_KEY" => Some(DEPLOYMENT_KEY.to_owned()),
            _ => None,
        }),
        max_attempts: 1,
        timeout: Duration::from_secs(10),
        ..LlmConfig::offline()
    }
}

fn keys_seen(fake: &FakeLlm) -> Vec<String> {
    fake.requests()
        .iter()
        .map(|r| r.headers["x-api-key"].to_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn the_deployment_key_goes_only_to_the_base_urls_it_was_configured_for() {
    let home = FakeLlm::start().await;
    let other = FakeLlm::start().await;
    let router = Router::new(config(&home.url(), &[]), pulse_tests::test_egress());

    // The configured base URL gets the deployment's key.
    router
        .select(&agent(AgentLlm::default()))
        .unwrap()
        .complete(&request())
        .await
        .unwrap();
    assert_eq!(keys_seen(&home), [DEPLOYMENT_KEY]);

    // An agent's own base URL with no key of its own: refused before any request.
    let err = router
        .select(&agent(AgentLlm {
            base_url: Some(other.url().parse().unwrap()),
            ..AgentLlm::default()
        }))
        .err()
        .expect("the deployment's key is not sent to an agent's URL");
    let message = err.to_string();
    assert!(message.contains("PULSE_LLM_BASE_URLS"), "{message}");
    assert!(message.contains("--llm-api-key-env"), "{message}");

    // With its own key, that key goes there, never the deployment's.
    router
        .select(&agent(AgentLlm {
            base_url: Some(other.url().parse().unwrap()),
            api_key_env: Some("PULSE_LLM_KEY_OTHER".into()),
            ..AgentLlm::default()
        }))
        .unwrap()
        .complete(&request())
        .await
        .unwrap();
    assert_eq!(keys_seen(&other), [AGENT_KEY]);

    // An operator may trust a URL with the deployment's key.
    let trusting = Router::new(
        config(&home.url(), &[&other.url()]),
        pulse_tests::test_egress(),
    );
    trusting
        .select(&agent(AgentLlm {
            base_url: Some(other.url().parse().unwrap()),
            ..AgentLlm::default()
        }))
        .unwrap()
        .complete(&request())
        .await
        .unwrap();
    assert_eq!(keys_seen(&other), [AGENT_KEY, DEPLOYMENT_KEY]);
}

#[test]
fn an_agent_can_name_only_a_pulse_llm_key_variable() {
    for var in [
        "ANTHROPIC_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "DISCORD_BOT_TOKEN",
        "PULSE_LLM_KEY_",
        "pulse_llm_key_x",
    ] {
        let mut new = NewAgent::named("x");
        new.llm.api_key_env = Some(var.into());
        let err = new.create(jiff::Timestamp::now()).unwrap_err();
        assert!(err.to_string().contains("PULSE_LLM_KEY_"), "{var}: {err}");
    }
    let mut new = NewAgent::named("x");
    new.llm.api_key_env = Some("PULSE_LLM_KEY_GROQ_2".into());
    assert!(new.create(jiff::Timestamp::now()).is_ok());
}

#[tokio::test]
async fn an_agents_own_base_url_goes_through_the_egress_guard() {
    let home = FakeLlm::start().await;
    let other = FakeLlm::start().await;
    // Production's guard: nothing non-public allowed.
    let router = Router::new(
        config(&home.url(), &[]),
        pulse_egress::Egress::new(Default::default()),
    );
    let own = |url: String| {
        agent(AgentLlm {
            base_url: Some(url.parse().unwrap()),
            api_key_env: Some("PULSE_LLM_KEY_OTHER".into()),
            ..AgentLlm::default()
        })
    };
    // An address literal is refused when the client is chosen.
    let err = router.select(&own(other.url())).err().unwrap();
    assert!(err.to_string().contains("loopback"), "{err}");
    // A name is refused when it resolves, before any connection.
    let port = other.url().rsplit(':').next().unwrap().to_owned();
    let llm = router
        .select(&own(format!("http://localhost:{port}")))
        .unwrap();
    let err = llm.complete(&request()).await.unwrap_err();
    assert!(err.to_string().contains("not a public address"), "{err}");
    assert!(
        other.requests().is_empty(),
        "nothing reached the agent's URL"
    );
    // The operator's own URL (a local model server, say) is not guarded.
    router
        .select(&agent(AgentLlm::default()))
        .unwrap()
        .complete(&request())
        .await
        .unwrap();
    assert_eq!(home.requests().len(), 1);
}

/// A server that answers everything with a 307 to `to`, and one that records whoever
/// reaches it.
async fn redirect_to(to: String) -> String {
    let app = Http::new().fallback(any(move || {
        let to = to.clone();
        async move { (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, to)]).into_response() }
    }));
    serve(app).await
}

async fn recorder(seen: Arc<Mutex<Vec<HeaderMap>>>) -> String {
    let app = Http::new().fallback(any(move |headers: HeaderMap| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(headers);
            "{}"
        }
    }));
    serve(app).await
}

async fn serve(app: Http) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test]
async fn model_and_discord_clients_never_follow_a_redirect_with_credentials() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let elsewhere = recorder(seen.clone()).await;

    let llm_home = redirect_to(format!("{elsewhere}/v1/messages")).await;
    let router = Router::new(config(&llm_home, &[]), pulse_tests::test_egress());
    let err = router
        .select(&agent(AgentLlm::default()))
        .unwrap()
        .complete(&request())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("307"), "{err}");

    let discord_home = redirect_to(format!("{elsewhere}/api/v10/channels/1/messages")).await;
    let discord = DiscordClient::new(DiscordConfig {
        api_base: format!("{discord_home}/api/v10").parse().unwrap(),
        bot_token: Some(Secret::new("bot-token-secret")),
        application_id: Some("1".into()),
        max_attempts: 1,
        ..DiscordConfig::unconfigured()
    });
    assert!(discord.create_message("1", "hi", "n1", None).await.is_err());

    assert!(
        seen.lock().unwrap().is_empty(),
        "a credential followed a redirect: {:?}",
        seen.lock().unwrap()
    );
}
