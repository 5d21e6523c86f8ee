//! The pictures a turn's messages carry, as the agent's model takes them.

use base64::Engine as _;
use jiff::Timestamp;
use tracing::{info, warn};

use super::*;
use crate::domain::{Agent, ContentBlock, ImageInput, Signal, SignalKind};

/// How long before an expiring attachment URL's end the provider is no longer trusted
/// to fetch it in time.
const URL_MARGIN: jiff::SignedDuration = jiff::SignedDuration::from_mins(10);

/// Whether a model provider can fetch `url` itself: HTTPS on a public name, and for a
/// Discord attachment (signed, expiring: `ex=` is its end, in hex seconds) not within
/// [`URL_MARGIN`] of expiring. Otherwise Pulse fetches it and sends the bytes.
pub(super) fn provider_reaches(url: &str, now: Timestamp) -> bool {
    let Ok(u) = url::Url::parse(url) else {
        return false;
    };
    let Some(url::Host::Domain(host)) = u.host() else {
        return false;
    };
    let private = host == "localhost"
        || [".localhost", ".local", ".internal", ".lan", ".home.arpa"]
            .iter()
            .any(|s| host.ends_with(s))
        || !host.contains('.');
    if u.scheme() != "https" || private {
        return false;
    }
    let discord = ["cdn.discordapp.com", "media.discordapp.net"].contains(&host);
    if !discord {
        return true;
    }
    let expires = u
        .query_pairs()
        .find(|(k, _)| k == "ex")
        .and_then(|(_, v)| i64::from_str_radix(&v, 16).ok())
        .and_then(|s| Timestamp::from_second(s).ok());
    expires.is_none_or(|end| now + URL_MARGIN < end)
}

impl Conversation {
    /// The images of `signals` as the agent's model takes them: none when the model is
    /// not sent images (`--vision`) or the URL is not on the image hosts, a URL the
    /// provider can reach, or the bytes fetched (an expiring Discord attachment). One
    /// that cannot be fetched stays the `[image: URL]` text the message already carries.
    pub(super) async fn images_for(
        &self,
        agent: &Agent,
        signals: &[Signal],
        now: Timestamp,
    ) -> Vec<ImageInput> {
        let blocks: Vec<&str> = signals
            .iter()
            .filter(|s| s.kind != SignalKind::Heartbeat)
            .flat_map(|s| &s.content)
            .filter_map(|b| match b {
                ContentBlock::Image { url, .. } => Some(url.as_str()),
                ContentBlock::Text { .. } => None,
            })
            .collect();
        if blocks.is_empty() {
            return Vec::new();
        }
        let model = match self.llm.select(agent) {
            Ok(llm) => llm.model().to_owned(),
            Err(_) => return Vec::new(),
        };
        if !agent.llm.sees_images(&model) {
            info!(model = %model, images = blocks.len(), "the model is not sent images (--vision): they reach it as text");
            return Vec::new();
        }
        let Some(fetcher) = &self.images else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for url in blocks {
            // Only pictures from where users' pictures come from: any other URL in a
            // message is text, neither fetched nor handed to the provider to fetch.
            if !fetcher.allows(url) {
                info!(url = %url, "an image not on PULSE_IMAGE_HOSTS: the model reads its URL as text");
                continue;
            }
            if provider_reaches(url, now) {
                out.push(ImageInput::Url {
                    url: url.to_owned(),
                });
                continue;
            }
            match fetcher.fetch_image(url).await {
                Ok(image) => out.push(ImageInput::Inline {
                    media_type: image.media_type,
                    data: base64::engine::general_purpose::STANDARD.encode(image.bytes),
                }),
                Err(why) => {
                    warn!(url = %url, error = %why, "an image could not be fetched; the model reads its URL as text");
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_fetches_public_https_urls_and_discord_attachments_before_they_expire() {
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let discord = |ex: i64| {
            format!("https://cdn.discordapp.com/attachments/1/2/cat.png?ex={ex:x}&is=0&hm=ab")
        };
        assert!(provider_reaches("https://example.com/cat.png", now));
        assert!(provider_reaches(&discord(1_700_000_000 + 86_400), now));
        assert!(
            !provider_reaches(&discord(1_700_000_000 + 60), now),
            "expires within the margin"
        );
        assert!(!provider_reaches(&discord(1_600_000_000), now), "expired");
        for private in [
            "http://example.com/cat.png",
            "https://127.0.0.1/cat.png",
            "https://[::1]/cat.png",
            "https://localhost/cat.png",
            "https://printer.local/scan.png",
            "https://intranet/cat.png",
            "not a url",
        ] {
            assert!(!provider_reaches(private, now), "{private}");
        }
    }
}
