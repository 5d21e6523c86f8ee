//! What every outbound call Pulse makes to a URL a user gave it is checked for on the
//! way in: the URL (HTTP tools, MCP servers) and the call's timeout.

use std::time::Duration;

use url::Url;

use crate::error::ValidationError;

/// `s` as an `http`/`https` URL with a host. Credentials in it are refused first, with
/// `credentials` (where they go instead), so the error never repeats them.
pub(crate) fn web_url(
    what: &'static str,
    s: &str,
    credentials: &'static str,
) -> Result<Url, ValidationError> {
    let url = Url::parse(s)
        .map_err(|e| ValidationError::new(what, format!("{s:?} is not a URL: {e}")))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ValidationError::new(what, credentials));
    }
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(ValidationError::new(
            what,
            format!("{url} must be an http:// or https:// URL with a host"),
        ));
    }
    Ok(url)
}

/// A call's timeout: from 1 ms to 15 minutes.
pub(crate) fn check_timeout(what: &'static str, timeout: Duration) -> Result<(), ValidationError> {
    if timeout.is_zero() || timeout > Duration::from_secs(900) {
        return Err(ValidationError::new(
            what,
            "use a timeout between 1ms and 15m",
        ));
    }
    Ok(())
}
