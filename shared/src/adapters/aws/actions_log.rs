//! What this process asked of AWS, as IAM sees it: each distinct (action, resource)
//! pair its requests needed, appended to `$PULSE_AWS_ACTIONS_DIR/<function>.actions`
//! when that variable is set (the test suite sets it; a deployment never does).
//!
//! The test suite's runs of the functions leave one such file per function, and
//! `scripts/roles.py check-actions` holds them against each function's role in
//! `infra/template.yaml`, both ways: every action sent is allowed, every action allowed
//! was sent by some run. The function is named by `AWS_LAMBDA_FUNCTION_NAME` (Lambda,
//! and the test's runtime stand-in, set it) or `PULSE_AWS_ACTIONS_AS` (for `pulse
//! gateway`, which runs in ECS).
//!
//! Actions are named as IAM names them: a DynamoDB transaction needs its items' own
//! actions (`PutItem`, `UpdateItem`, `DeleteItem`, `ConditionCheckItem`) on their table,
//! and has no IAM action of its own; a query on an index needs `Query` on the index.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use serde_json::Value;

/// The interceptor: records each request's actions when the log is on.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ActionsLog;

struct Log {
    path: std::path::PathBuf,
    seen: Mutex<BTreeSet<(String, String)>>,
}

fn log() -> Option<&'static Log> {
    static LOG: OnceLock<Option<Log>> = OnceLock::new();
    LOG.get_or_init(|| {
        let dir = std::env::var_os("PULSE_AWS_ACTIONS_DIR")?;
        let function = std::env::var("PULSE_AWS_ACTIONS_AS")
            .or_else(|_| std::env::var("AWS_LAMBDA_FUNCTION_NAME"))
            .unwrap_or_else(|_| "pulse".to_owned());
        Some(Log {
            path: std::path::Path::new(&dir).join(format!("{function}.actions")),
            seen: Mutex::default(),
        })
    })
    .as_ref()
}

impl Intercept for ActionsLog {
    fn name(&self) -> &'static str {
        "PulseActionsLog"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(log) = log() else { return Ok(()) };
        let Some(meta) = cfg.load::<Metadata>() else {
            return Ok(());
        };
        let body = context
            .request()
            .body()
            .bytes()
            .and_then(|b| serde_json::from_slice::<Value>(b).ok())
            .unwrap_or(Value::Null);
        let mut seen = log.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut new = String::new();
        for pair in iam_actions(meta.service(), meta.name(), &body) {
            if seen.insert(pair.clone()) {
                new.push_str(&format!("{}\t{}\n", pair.0, pair.1));
            }
        }
        if !new.is_empty() {
            // A test aid: a failure to write is said, never a failed request.
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log.path)
                .and_then(|mut f| f.write_all(new.as_bytes()));
            if let Err(e) = written {
                tracing::warn!(path = %log.path.display(), error = %e, "cannot record AWS actions");
            }
        }
        Ok(())
    }
}

/// The IAM (action, resource) pairs one request needs: the resource as the request
/// names it (a table, `table/index/name`, a queue's name, a parameter path, a bus).
pub(crate) fn iam_actions(service: &str, op: &str, body: &Value) -> Vec<(String, String)> {
    let str_of = |v: &Value| v.as_str().unwrap_or("*").to_owned();
    match service {
        "DynamoDB" => {
            let action = |a: &str| format!("dynamodb:{a}");
            match op {
                "BatchGetItem" | "BatchWriteItem" => body["RequestItems"]
                    .as_object()
                    .map(|m| m.keys().map(|t| (action(op), t.clone())).collect())
                    .unwrap_or_default(),
                "TransactWriteItems" | "TransactGetItems" => body["TransactItems"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_object)
                    .flat_map(|item| item.iter())
                    .map(|(kind, inner)| {
                        let a = match kind.as_str() {
                            "Put" => "PutItem",
                            "Update" => "UpdateItem",
                            "Delete" => "DeleteItem",
                            "ConditionCheck" => "ConditionCheckItem",
                            _ => "GetItem",
                        };
                        (action(a), str_of(&inner["TableName"]))
                    })
                    .collect(),
                _ => {
                    let mut resource = str_of(&body["TableName"]);
                    if let Some(index) = body["IndexName"].as_str() {
                        resource = format!("{resource}/index/{index}");
                    }
                    vec![(action(op), resource)]
                }
            }
        }
        "SQS" => {
            let queue = body["QueueUrl"]
                .as_str()
                .and_then(|u| u.rsplit('/').next())
                .unwrap_or(body["QueueName"].as_str().unwrap_or("*"));
            let op = op.trim_end_matches("Batch");
            vec![(format!("sqs:{op}"), queue.to_owned())]
        }
        "SSM" => vec![(
            format!("ssm:{op}"),
            str_of(if body["Path"].is_null() {
                &body["Name"]
            } else {
                &body["Path"]
            }),
        )],
        "EventBridge" => {
            let buses: BTreeSet<String> = body["Entries"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| e["EventBusName"].as_str().unwrap_or("default").to_owned())
                .collect();
            buses
                .into_iter()
                .map(|b| (format!("events:{op}"), b))
                .collect()
        }
        other => vec![(format!("{}:{op}", other.to_ascii_lowercase()), "*".into())],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pairs(service: &str, op: &str, body: Value) -> Vec<(String, String)> {
        iam_actions(service, op, &body)
    }

    #[test]
    fn a_transaction_needs_its_items_actions_and_a_query_on_an_index_names_it() {
        assert_eq!(
            pairs(
                "DynamoDB",
                "TransactWriteItems",
                json!({"TransactItems": [
                    {"Put": {"TableName": "t"}},
                    {"ConditionCheck": {"TableName": "t"}},
                    {"Delete": {"TableName": "u"}}
                ]})
            ),
            [
                ("dynamodb:PutItem".into(), "t".into()),
                ("dynamodb:ConditionCheckItem".into(), "t".into()),
                ("dynamodb:DeleteItem".into(), "u".into())
            ]
        );
        assert_eq!(
            pairs(
                "DynamoDB",
                "Query",
                json!({"TableName": "t", "IndexName": "due"})
            ),
            [("dynamodb:Query".into(), "t/index/due".into())]
        );
        assert_eq!(
            pairs(
                "DynamoDB",
                "BatchWriteItem",
                json!({"RequestItems": {"t": []}})
            ),
            [("dynamodb:BatchWriteItem".into(), "t".into())]
        );
    }

    #[test]
    fn queues_are_named_by_their_url_and_batches_by_the_single_action_iam_checks() {
        assert_eq!(
            pairs(
                "SQS",
                "SendMessageBatch",
                json!({"QueueUrl": "http://h/123/pulse-sessions.fifo"})
            ),
            [("sqs:SendMessage".into(), "pulse-sessions.fifo".into())]
        );
        assert_eq!(
            pairs("SSM", "GetParametersByPath", json!({"Path": "/pulse"})),
            [("ssm:GetParametersByPath".into(), "/pulse".into())]
        );
        assert_eq!(
            pairs(
                "EventBridge",
                "PutEvents",
                json!({"Entries": [{"EventBusName": "b"}, {}]})
            ),
            [
                ("events:PutEvents".into(), "b".into()),
                ("events:PutEvents".into(), "default".into())
            ]
        );
    }
}
