//! The hook sender: signed POSTs through the SSRF-guarded egress client
//! (`pulse-egress`), or PutEvents to an EventBridge bus.
//!
//! Every POST carries the Standard Webhooks headers (`webhook-id` = the delivery id,
//! stable across retries; `webhook-timestamp`; `webhook-signature: v1,<base64 HMAC-SHA256
//! of id.timestamp.body>` with the hook's `whsec_` secret), `X-Pulse-Hook-Type`,
//! `X-Pulse-Agent-Id` and the hook's Authorization header if it has one. Redirects are
//! never followed.

use std::sync::Arc;

use async_trait::async_trait;
use http::{HeaderMap, HeaderName, HeaderValue};
use pulse_egress::{Egress, EgressError};

use crate::domain::{ATTEMPT_BODY_LIMIT, AttemptStatus, Hook, HookDelivery, HookTarget};
use crate::ports::{EventBus, HookSender, SendResult, Unsendable};

/// The headers of one signed attempt. `Err` only for a secret that cannot sign (a hook
/// written by hand with a malformed `whsec_` value).
pub fn signed_headers(
    hook: &Hook,
    delivery: &HookDelivery,
    timestamp: i64,
) -> Result<HeaderMap, String> {
    let signature = pulse_signatures::inbound::standard_signature(
        hook.secret.expose(),
        delivery.id.as_str(),
        timestamp,
        delivery.body.as_bytes(),
    )
    .map_err(|e| format!("the hook's signing secret cannot sign: {e}"))?;
    let mut h = HeaderMap::new();
    let mut put = |name: &'static str, value: &str| -> Result<(), String> {
        let v = HeaderValue::from_str(value)
            .map_err(|_| format!("the {name} header value is not valid in HTTP"))?;
        h.insert(HeaderName::from_static(name), v);
        Ok(())
    };
    put("content-type", "application/json")?;
    put("webhook-id", delivery.id.as_str())?;
    put("webhook-timestamp", &timestamp.to_string())?;
    put("webhook-signature", &signature)?;
    put("x-pulse-hook-type", delivery.hook_type.as_str())?;
    put("x-pulse-agent-id", delivery.agent_id.as_str())?;
    if let Some(auth) = &hook.auth_header {
        let mut v = HeaderValue::from_str(auth.expose())
            .map_err(|_| "the hook's auth header is not a valid HTTP header value".to_owned())?;
        v.set_sensitive(true);
        h.insert(http::header::AUTHORIZATION, v);
    }
    Ok(h)
}

/// Sends hook attempts.
#[derive(Clone)]
pub struct HookClient {
    egress: Egress,
    bus: Option<Arc<dyn EventBus>>,
}

impl HookClient {
    /// A sender over `egress`; hooks with an `eventbridge://` target need `bus`.
    pub fn new(egress: Egress, bus: Option<Arc<dyn EventBus>>) -> Self {
        Self { egress, bus }
    }
}

fn failed(status: AttemptStatus, error: String) -> SendResult {
    SendResult {
        status,
        http_status: None,
        body: None,
        error: Some(error),
        retry_after: None,
    }
}

#[async_trait]
impl HookSender for HookClient {
    async fn can_send(&self, hook: &Hook) -> Result<(), Unsendable> {
        match &hook.target {
            HookTarget::EventBridge { .. } if self.bus.is_none() => Err(Unsendable::NoBus),
            HookTarget::EventBridge { .. } => Ok(()),
            HookTarget::Url(url) => match self.egress.check(url).await {
                Err(e @ EgressError::Refused(_)) => Err(Unsendable::Refused(e.to_string())),
                // Anything else (a name that does not resolve now) is the attempt's to
                // report.
                _ => Ok(()),
            },
        }
    }

    async fn send(&self, hook: &Hook, delivery: &HookDelivery, timestamp: i64) -> SendResult {
        let url = match &hook.target {
            HookTarget::EventBridge { bus } => {
                let Some(client) = &self.bus else {
                    return failed(
                        AttemptStatus::Failed,
                        "eventbridge:// targets are delivered by the AWS backend; this process has no EventBridge client".into(),
                    );
                };
                return match client
                    .put_event(bus, delivery.hook_type.as_str(), &delivery.body)
                    .await
                {
                    Ok(()) => SendResult {
                        status: AttemptStatus::Success,
                        http_status: None,
                        body: None,
                        error: None,
                        retry_after: None,
                    },
                    Err(why) => failed(AttemptStatus::Failed, why.to_string()),
                };
            }
            HookTarget::Url(url) => url,
        };
        let headers = match signed_headers(hook, delivery, timestamp) {
            Ok(h) => h,
            Err(why) => return failed(AttemptStatus::Failed, why),
        };
        let sent = self
            .egress
            .post(
                url,
                headers,
                bytes::Bytes::from(delivery.body.clone()),
                hook.timeout.unsigned_abs(),
                ATTEMPT_BODY_LIMIT,
            )
            .await;
        match sent {
            Ok(resp) => {
                let ok = resp.status.is_success();
                let retry_after = resp
                    .headers
                    .get(http::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(crate::llm::parse_retry_after);
                let body = String::from_utf8_lossy(&resp.body).into_owned();
                SendResult {
                    status: if ok {
                        AttemptStatus::Success
                    } else {
                        AttemptStatus::Failed
                    },
                    http_status: Some(resp.status.as_u16()),
                    error: (!ok).then(|| {
                        if resp.status.is_redirection() {
                            format!(
                                "the receiver answered {} (redirects are not followed; give the final URL)",
                                resp.status
                            )
                        } else {
                            format!("the receiver answered {}", resp.status)
                        }
                    }),
                    body: (!body.is_empty()).then_some(body),
                    retry_after,
                }
            }
            Err(e) => {
                let status = match &e {
                    EgressError::Refused(_) => AttemptStatus::RejectedSsrf,
                    EgressError::Timeout(_) => AttemptStatus::Timeout,
                    _ => AttemptStatus::Failed,
                };
                failed(status, e.to_string())
            }
        }
    }
}
