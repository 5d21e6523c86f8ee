//! `pulse gateway`: the Discord gateway alone, until SIGTERM or Ctrl-C.
//!
//! On AWS this is the long-running forwarder beside the Lambda functions (an ECS Fargate
//! task, or any small machine: it is one outbound connection): each message an agent
//! should answer goes onto the sessions FIFO queue (the message group is the agent's
//! session, the deduplication id the signal id derived from the message id), and the
//! conversation worker answers it. It keeps no state but its lease and the resume point
//! saved with it. `pulse serve` runs the same gateway beside its sweeper.

use std::sync::Arc;

use pulse_gateway::{Gateway, GatewaySettings, LEASE};
use pulse_shared::app::Connected;
use pulse_shared::config::Config;
use pulse_shared::discord::DiscordClient;
use pulse_shared::ports::Clock;
use tokio::sync::watch;

use super::Ctx;
use crate::Failure;

/// The gateway of the configured bot, or `None` without `DISCORD_BOT_TOKEN`.
pub(crate) fn gateway(config: &Config, b: &Connected, clock: Arc<dyn Clock>) -> Option<Gateway> {
    let discord = &config.discord;
    let token = discord.bot_token.clone()?;
    Some(Gateway::new(
        b.store.clone(),
        b.queue.clone(),
        clock,
        DiscordClient::new(discord.clone()),
        GatewaySettings {
            token,
            url: discord.gateway_url.clone(),
            default_agent: config.inbound.default_agent.clone(),
            lease: LEASE,
        },
    ))
}

/// `pulse serve`'s gateway: open when a bot token is set and `PULSE_DISCORD_GATEWAY` is
/// not `off`, until `stop`. One that fails for good (a refused token) is logged, and
/// `pulse serve` goes on serving.
pub(crate) async fn beside_serve(
    config: &Config,
    b: &Connected,
    clock: Arc<dyn Clock>,
    stop: watch::Receiver<bool>,
) {
    let Some(gateway) = gateway(config, b, clock) else {
        return;
    };
    if !config.discord.gateway {
        tracing::info!("PULSE_DISCORD_GATEWAY=off: direct and channel messages are not read here");
        return;
    }
    // The error is logged where it happens.
    let _ = gateway.run(stop).await;
}

pub(crate) async fn execute(cx: &Ctx<'_>) -> Result<(), Failure> {
    let Some(gateway) = gateway(cx.config, cx.b, cx.clock.clone()) else {
        return Err(Failure::Input(
            "DISCORD_BOT_TOKEN is not set: the gateway connects as the bot (Developer Portal, your application, Bot, Reset Token)".into(),
        ));
    };
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        super::shutdown::shutdown_signal().await;
        tracing::info!("stopping: giving the Discord gateway's lease up");
        let _ = stop_tx.send(true);
    });
    gateway
        .run(stop)
        .await
        .map_err(|e| Failure::Runtime(anyhow::anyhow!(e)))
}
