//! `pulse telegram …`: the Telegram bot's set-up. Needs no database.

use clap::Subcommand;
use pulse_shared::config::Config;

use crate::Failure;
use crate::output::{Out, outln};

/// Where the receiver takes Telegram's updates.
const ROUTE: &str = "/telegram/webhook";

#[derive(Subcommand, Debug)]
pub(crate) enum TelegramCmd {
    /// Register the receiver with Telegram (`setWebhook`) so the bot's messages, their
    /// edits and button presses are pushed to PUBLIC_URL/telegram/webhook with the secret
    /// token TELEGRAM_WEBHOOK_SECRET (made, and printed to set, when it is unset). Needs
    /// TELEGRAM_BOT_TOKEN.
    SetWebhook {
        /// The receiver's public address (HTTPS), as Telegram reaches it: the function
        /// URL on AWS, or where `pulse serve` is exposed.
        public_url: String,
    },
}

/// Runs a Telegram command.
pub(crate) async fn run(cmd: TelegramCmd, config: &Config, out: &Out) -> Result<(), Failure> {
    match cmd {
        TelegramCmd::SetWebhook { public_url } => set_webhook(config, &public_url, out).await,
    }
}

/// The address Telegram is given: `public_url` with the route, unless it has it.
fn webhook_url(public_url: &str) -> Result<String, Failure> {
    let base = public_url.trim().trim_end_matches('/');
    let base = base.strip_suffix(ROUTE).unwrap_or(base);
    let url = url::Url::parse(base).map_err(|e| {
        Failure::Input(format!(
            "invalid PUBLIC_URL {public_url:?}: {e}; give the receiver's address, e.g. https://pulse.example.com"
        ))
    })?;
    let loopback = url
        .host_str()
        .is_some_and(|h| h == "localhost" || h == "127.0.0.1" || h == "[::1]");
    if url.scheme() != "https" && !loopback {
        return Err(Failure::Input(format!(
            "invalid PUBLIC_URL {public_url:?}: Telegram sends updates to HTTPS addresses only"
        )));
    }
    Ok(format!("{base}{ROUTE}"))
}

async fn set_webhook(config: &Config, public_url: &str, out: &Out) -> Result<(), Failure> {
    if !config.telegram.is_configured() {
        return Err(Failure::Input(
            "set TELEGRAM_BOT_TOKEN (from @BotFather) to register the webhook".into(),
        ));
    }
    let url = webhook_url(public_url)?;
    let (secret, made) = match &config.inbound.telegram_secret {
        Some(s) => (s.expose().to_owned(), false),
        None => (pulse_shared::telegram::new_webhook_secret(), true),
    };
    pulse_shared::telegram::TelegramClient::new(config.telegram.clone())
        .set_webhook(&url, &secret)
        .await
        .map_err(|e| anyhow::anyhow!("Telegram refused the webhook: {e}"))?;
    if out.json {
        out.json_value(&serde_json::json!({
            "url": url,
            "secret_made": made,
            "secret": made.then_some(&secret),
        }));
    } else {
        outln!("Telegram pushes the bot's updates to {url}");
        if made {
            outln!(
                "set TELEGRAM_WEBHOOK_SECRET={secret} where the receiver runs (pulse serve, or the secrets on AWS): until then it refuses every update"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_is_added_once_and_only_https_leaves_the_machine() {
        assert_eq!(
            webhook_url("https://pulse.example.com/").unwrap(),
            "https://pulse.example.com/telegram/webhook"
        );
        assert_eq!(
            webhook_url("https://pulse.example.com/telegram/webhook").unwrap(),
            "https://pulse.example.com/telegram/webhook"
        );
        assert!(webhook_url("http://pulse.example.com").is_err());
        assert!(webhook_url("http://127.0.0.1:8080").is_ok());
        assert!(webhook_url("not a url").is_err());
    }
}
