//! Whether DynamoDB answers: what `/healthz` says on AWS. Every request the store's
//! client sends is watched after each attempt: one that got no answer (the connection
//! failed, or timed out) or a 5xx marks the store unreachable, with why; the next
//! attempt that gets any other answer clears it. No request is sent for this.

use std::sync::{Arc, Mutex};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::FinalizerInterceptorContextRef;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

/// The interceptor, and what it last found (`None`: answered).
#[derive(Clone, Debug, Default)]
pub(crate) struct Reachability(Arc<Mutex<Option<String>>>);

impl Reachability {
    /// Why the service is not answering now, if it is not.
    pub(crate) fn trouble(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, trouble: Option<String>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = trouble;
    }
}

impl Intercept for Reachability {
    fn name(&self) -> &'static str {
        "PulseReachability"
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let op = cfg.load::<Metadata>().map_or_else(
            || "a request".to_owned(),
            |m| format!("{} {}", m.service(), m.name()),
        );
        match (context.response(), context.output_or_error()) {
            (Some(r), _) if r.status().is_server_error() => self.set(Some(format!(
                "{op} was answered {} by the service",
                r.status().as_u16()
            ))),
            (Some(_), _) => self.set(None),
            (None, Some(Err(e))) if e.is_timeout_error() || e.is_connector_error() => {
                self.set(Some(format!(
                    "{op} got no answer: {}",
                    crate::error::chain(e)
                )));
            }
            // Refused before it was sent (a limit, a signing failure): says nothing of
            // the service.
            (None, _) => {}
        }
        Ok(())
    }
}
