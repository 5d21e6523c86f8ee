//! `pulse discord …`: the Discord application's set-up. Needs no database.

use clap::Subcommand;
use pulse_shared::config::Config;
use serde_json::Value;

use crate::Failure;
use crate::output::{Out, outln};

#[derive(Subcommand, Debug)]
pub(crate) enum DiscordCmd {
    /// Register Pulse's commands with Discord (bulk overwrite of the application's global
    /// commands): `/ask` and a message context-menu command. Needs DISCORD_BOT_TOKEN and
    /// DISCORD_APPLICATION_ID.
    RegisterCommands {
        /// The context-menu command's name, shown on every message (at most 32 characters).
        #[arg(long, default_value = "Ask Pulse")]
        menu_name: String,
    },
}

/// Runs a Discord command.
pub(crate) async fn run(cmd: DiscordCmd, config: &Config, out: &Out) -> Result<(), Failure> {
    match cmd {
        DiscordCmd::RegisterCommands { menu_name } => {
            let menu_name = menu_name.trim().to_owned();
            if menu_name.is_empty() || menu_name.chars().count() > 32 {
                return Err(Failure::Input(
                    "invalid --menu-name: Discord takes 1 to 32 characters".into(),
                ));
            }
            register_commands(config, &menu_name, out).await
        }
    }
}

/// Registers the Discord commands; needs no database.
async fn register_commands(config: &Config, menu_name: &str, out: &Out) -> Result<(), Failure> {
    if config.discord.bot_token.is_none() || config.discord.application_id.is_none() {
        return Err(Failure::Input(
                    "set DISCORD_BOT_TOKEN and DISCORD_APPLICATION_ID (Developer Portal: Bot, and General Information) to register commands".into(),
                ));
    }
    let client = pulse_shared::discord::DiscordClient::new(config.discord.clone());
    let registered = client
        .overwrite_commands(&pulse_shared::discord::command_definitions(menu_name))
        .await
        .map_err(|e| anyhow::anyhow!("Discord refused the commands: {e}"))?;
    if out.json {
        out.json_value(&registered);
    } else {
        for c in &registered {
            outln!(
                "{}  {}",
                c.get("id").and_then(Value::as_str).unwrap_or("?"),
                c.get("name").and_then(Value::as_str).unwrap_or("?")
            );
        }
        eprintln!(
            "registered {} commands; global commands can take a few minutes to show up in Discord",
            registered.len()
        );
    }
    Ok(())
}
