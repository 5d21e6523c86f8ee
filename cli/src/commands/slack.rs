//! `pulse slack …`: the Slack app's set-up. Needs no database.

use clap::Subcommand;
use serde_json::{Value, json};

use crate::Failure;
use crate::output::{Out, outln};

#[derive(Subcommand, Debug)]
pub(crate) enum SlackCmd {
    /// Print the Slack app's manifest, with the receiver's request URLs filled in: paste it
    /// at api.slack.com/apps (Create New App, From a manifest), install the app, and set
    /// SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET from its pages.
    Manifest {
        /// The receiver's public address (HTTPS), as Slack reaches it: the function URL
        /// on AWS, or where `pulse serve` is exposed.
        public_url: String,
        /// The app's name, as people see it in Slack.
        #[arg(long, default_value = "Pulse")]
        name: String,
    },
}

/// Runs a Slack command.
pub(crate) fn run(cmd: SlackCmd, out: &Out) -> Result<(), Failure> {
    match cmd {
        SlackCmd::Manifest { public_url, name } => {
            let manifest = manifest(&public_url, &name)?;
            if out.json {
                out.json_value(&manifest);
            } else {
                outln!(
                    "{}",
                    serde_json::to_string_pretty(&manifest).unwrap_or_default()
                );
            }
            Ok(())
        }
    }
}

/// The app's manifest: a bot user, the scopes replies and reading need, the events
/// Pulse acts on, and interactivity for approvals' buttons, at `public_url`.
fn manifest(public_url: &str, name: &str) -> Result<Value, Failure> {
    let base = public_url.trim().trim_end_matches('/');
    let url = url::Url::parse(base).map_err(|e| {
        Failure::Input(format!(
            "invalid PUBLIC_URL {public_url:?}: {e}; give the receiver's address, e.g. https://pulse.example.com"
        ))
    })?;
    if url.scheme() != "https" {
        return Err(Failure::Input(format!(
            "invalid PUBLIC_URL {public_url:?}: Slack sends requests to HTTPS addresses only"
        )));
    }
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 35 {
        return Err(Failure::Input(
            "invalid --name: Slack takes 1 to 35 characters".into(),
        ));
    }
    Ok(json!({
        "display_information": { "name": name, "description": "An agent with a heartbeat, by Pulse" },
        "features": {
            "app_home": { "messages_tab_enabled": true, "messages_tab_read_only_enabled": false },
            "bot_user": { "display_name": name, "always_online": true },
        },
        "oauth_config": { "scopes": { "bot": [
            "app_mentions:read", "channels:history", "chat:write", "im:history", "im:read", "im:write",
        ]}},
        "settings": {
            "event_subscriptions": {
                "request_url": format!("{base}/slack/events"),
                "bot_events": ["app_mention", "message.channels", "message.im"],
            },
            "interactivity": { "is_enabled": true, "request_url": format!("{base}/slack/interactions") },
            "org_deploy_enabled": false,
            "socket_mode_enabled": false,
            "token_rotation_enabled": false,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_names_the_receiver_s_routes_and_only_https() {
        let m = manifest("https://pulse.example.com/", "Wren").unwrap();
        assert_eq!(
            m["settings"]["event_subscriptions"]["request_url"],
            "https://pulse.example.com/slack/events"
        );
        assert_eq!(
            m["settings"]["interactivity"]["request_url"],
            "https://pulse.example.com/slack/interactions"
        );
        assert_eq!(m["features"]["bot_user"]["display_name"], "Wren");
        assert!(manifest("http://pulse.example.com", "Wren").is_err());
        assert!(manifest("https://pulse.example.com", "").is_err());
    }
}
