//! The images users send, fetched through the SSRF-guarded egress client for a model
//! that cannot reach their URL itself (see [`crate::engine`]'s conversation).
//!
//! Only images on the hosts users' pictures come from ([`ImageHosts`]: Discord's CDN,
//! `PULSE_IMAGE_HOSTS`) are passed to a model or fetched; any other URL a message
//! carries stays text. The fetch has an allow-list of its own — public addresses, and
//! an address named in `PULSE_IMAGE_HOSTS` itself — so `PULSE_HOOKS_ALLOW`, which
//! opens private ranges to hooks and tools, never opens them to a URL a user sent.

use std::time::Duration;

use async_trait::async_trait;
use http::HeaderMap;
use pulse_egress::Egress;
use url::Url;

use crate::domain::{IMAGE_TYPES, MAX_IMAGE_BYTES};
use crate::ports::{FetchedImage, ImageError, ImageFetcher};

/// The hosts images users send may come from (`PULSE_IMAGE_HOSTS`, comma separated):
/// Discord's CDN by default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageHosts(Vec<String>);

impl Default for ImageHosts {
    fn default() -> Self {
        Self(vec![
            "cdn.discordapp.com".to_owned(),
            "media.discordapp.net".to_owned(),
        ])
    }
}

impl std::str::FromStr for ImageHosts {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let hosts: Vec<String> = s
            .split(',')
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty())
            .collect();
        for h in &hosts {
            if url::Host::parse(h).is_err() || h.contains(['/', ':']) && !h.starts_with('[') {
                return Err(format!(
                    "{h:?} is not a host name; give names like cdn.discordapp.com, comma separated"
                ));
            }
        }
        if hosts.is_empty() {
            return Err("give at least one host, e.g. cdn.discordapp.com".to_owned());
        }
        Ok(Self(hosts))
    }
}

impl ImageHosts {
    /// Whether `url` is on one of the hosts.
    pub fn allows(&self, url: &Url) -> bool {
        url.host_str().is_some_and(|h| {
            self.0
                .iter()
                .any(|allowed| allowed == &h.to_ascii_lowercase())
        })
    }

    /// What the fetch may reach: public addresses, and the addresses named as hosts.
    fn allow_list(&self) -> pulse_egress::AllowList {
        let ranges: Vec<String> = self
            .0
            .iter()
            .filter_map(|h| h.trim_matches(['[', ']']).parse::<std::net::IpAddr>().ok())
            .map(|ip| match ip {
                std::net::IpAddr::V4(v4) => format!("{v4}/32"),
                std::net::IpAddr::V6(v6) => format!("{v6}/128"),
            })
            .collect();
        ranges.join(",").parse().unwrap_or_default()
    }
}

/// Fetches images on [`ImageHosts`] over `pulse-egress`: at most [`MAX_IMAGE_BYTES`],
/// one of [`IMAGE_TYPES`] by the answer's `Content-Type`, within a timeout, no redirect
/// followed.
#[derive(Clone, Debug)]
pub struct EgressImages {
    hosts: ImageHosts,
    egress: Egress,
    timeout: Duration,
}

impl EgressImages {
    /// Fetches from `hosts`, each image within `timeout`.
    pub fn new(hosts: ImageHosts, timeout: Duration) -> Self {
        Self {
            egress: Egress::new(hosts.allow_list()),
            hosts,
            timeout,
        }
    }
}

#[async_trait]
impl ImageFetcher for EgressImages {
    fn allows(&self, url: &str) -> bool {
        Url::parse(url).is_ok_and(|u| self.hosts.allows(&u))
    }

    async fn fetch_image(&self, url: &str) -> Result<FetchedImage, ImageError> {
        let parsed = Url::parse(url).map_err(|e| ImageError::BadUrl(e.to_string()))?;
        if !self.hosts.allows(&parsed) {
            return Err(ImageError::NotAllowed(
                parsed.host_str().unwrap_or_default().to_owned(),
            ));
        }
        let resp = self
            .egress
            .get(&parsed, HeaderMap::new(), self.timeout, MAX_IMAGE_BYTES + 1)
            .await
            .map_err(|e| ImageError::Unreachable(e.to_string()))?;
        if !resp.status.is_success() {
            return Err(ImageError::Status(resp.status.as_u16()));
        }
        if resp.truncated || resp.body.len() > MAX_IMAGE_BYTES {
            return Err(ImageError::TooLarge(MAX_IMAGE_BYTES / (1024 * 1024)));
        }
        let media_type = resp
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| v.trim().to_ascii_lowercase())
            .unwrap_or_default();
        if !IMAGE_TYPES.contains(&media_type.as_str()) {
            return Err(ImageError::NotAnImage {
                found: media_type,
                takes: IMAGE_TYPES.join(", "),
            });
        }
        Ok(FetchedImage {
            media_type,
            bytes: resp.body.to_vec(),
        })
    }
}
