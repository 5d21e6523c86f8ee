//! The images users send, fetched through the SSRF-guarded egress client for a model
//! that cannot reach their URL itself (see [`crate::engine`]'s conversation).

use std::time::Duration;

use async_trait::async_trait;
use http::HeaderMap;
use pulse_egress::Egress;
use url::Url;

use crate::domain::{IMAGE_TYPES, MAX_IMAGE_BYTES};
use crate::ports::{FetchedImage, ImageError, ImageFetcher};

/// Fetches images over `pulse-egress`: at most [`MAX_IMAGE_BYTES`], one of
/// [`IMAGE_TYPES`] by the answer's `Content-Type`, within a timeout.
#[derive(Clone, Debug)]
pub struct EgressImages {
    egress: Egress,
    timeout: Duration,
}

impl EgressImages {
    /// Fetches through `egress`, each image within `timeout`.
    pub fn new(egress: Egress, timeout: Duration) -> Self {
        Self { egress, timeout }
    }
}

#[async_trait]
impl ImageFetcher for EgressImages {
    async fn fetch_image(&self, url: &str) -> Result<FetchedImage, ImageError> {
        let parsed = Url::parse(url).map_err(|e| ImageError::BadUrl(e.to_string()))?;
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
