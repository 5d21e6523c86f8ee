//! The AWS side from a person's terminal: `pulse init` (the table and queues as
//! `infra/template.yaml` declares them, reused after their shape is checked), the check a
//! command makes before it writes anything, a deployed stack's outputs (`PULSE_STACK`),
//! and errors that say what to do.

use std::collections::BTreeMap;
use std::fmt::Debug;

use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::QueueAttributeName;

use super::AwsClients;
use crate::config::AwsSettings;

/// Something on the AWS side stops a command, said as one line with the fix.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The SDK found no region.
    #[error(
        "no AWS region: set AWS_REGION (against an emulator any region does, e.g. us-east-1) or AWS_PROFILE naming a profile with a region"
    )]
    NoRegion,
    /// The SDK's credential chain found nothing.
    #[error(
        "no AWS credentials: looked in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, the profile files (AWS_PROFILE, AWS_CONFIG_FILE), SSO, web identity, the container and the instance metadata service; against an emulator any static keys do: export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test"
    )]
    NoCredentials,
    /// The credentials were found but AWS does not know them.
    #[error(
        "AWS rejected the credentials ({message}): check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, and that they belong to this account and region"
    )]
    Rejected {
        /// AWS's message.
        message: String,
    },
    /// A table or queue is not there.
    #[error(
        "{what} does not exist at {endpoint}: run `pulse init` to create it, or deploy the stack and set PULSE_STACK"
    )]
    Missing {
        /// E.g. "DynamoDB table `pulse`".
        what: String,
        /// Where it was looked for.
        endpoint: String,
    },
    /// No answer from the endpoint.
    #[error(
        "cannot reach {service} at {endpoint} ({detail}): is the emulator running, or AWS_ENDPOINT_URL right?"
    )]
    Unreachable {
        /// "DynamoDB", "SQS", "CloudFormation".
        service: &'static str,
        /// The URL tried.
        endpoint: String,
        /// The connection error.
        detail: String,
    },
    /// The credentials' identity may not do this.
    #[error(
        "AWS denied {service} {operation}: {message}; grant it to the identity your credentials name"
    )]
    Denied {
        /// The service.
        service: &'static str,
        /// What was asked.
        operation: &'static str,
        /// AWS's message, which names the action and the resource.
        message: String,
    },
    /// A table or queue exists with another shape than Pulse needs.
    #[error(
        "{what} exists but {differences}: Pulse cannot use it; delete it or choose another name (pulse init --name)"
    )]
    Shape {
        /// What.
        what: String,
        /// What differs.
        differences: String,
    },
    /// `PULSE_STACK` names no stack.
    #[error(
        "no CloudFormation stack `{name}` in {region}: check PULSE_STACK (or --stack) and AWS_REGION, or deploy it (see docs/src/aws.md, Deploying to AWS)"
    )]
    NoStack {
        /// The stack name.
        name: String,
        /// The region looked in.
        region: String,
    },
    /// Anything else, with AWS's own words.
    #[error("{service} {operation} failed: {detail}")]
    Other {
        /// The service.
        service: &'static str,
        /// What was asked.
        operation: &'static str,
        /// The error's whole chain.
        detail: String,
    },
}

/// What an error should be called, from its code and chain.
pub(super) fn classify<E, R>(
    service: &'static str,
    operation: &'static str,
    endpoint: &str,
    e: &SdkError<E, R>,
) -> SetupError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: Debug + Send + Sync + 'static,
{
    let detail = DisplayErrorContext(e).to_string();
    let code = e.code().unwrap_or_default();
    if matches!(
        code,
        "UnrecognizedClientException" | "InvalidClientTokenId" | "InvalidSignatureException"
    ) {
        return SetupError::Rejected {
            message: e.message().unwrap_or(code).to_owned(),
        };
    }
    if code.contains("AccessDenied") {
        return SetupError::Denied {
            service,
            operation,
            message: e.message().unwrap_or(code).to_owned(),
        };
    }
    if let SdkError::DispatchFailure(f) = e {
        if detail.contains("credentials") {
            return SetupError::NoCredentials;
        }
        if f.is_io() || f.is_timeout() {
            return SetupError::Unreachable {
                service,
                endpoint: endpoint.to_owned(),
                detail: last_words(e),
            };
        }
    }
    if matches!(e, SdkError::TimeoutError(_)) {
        return SetupError::Unreachable {
            service,
            endpoint: endpoint.to_owned(),
            detail: "timed out".into(),
        };
    }
    SetupError::Other {
        service,
        operation,
        detail,
    }
}

/// The innermost error of a chain ("Connection refused (os error 111)").
fn last_words(e: &(dyn std::error::Error + 'static)) -> String {
    let mut inner = e;
    while let Some(next) = inner.source() {
        inner = next;
    }
    inner.to_string()
}

pub(super) fn queue_missing(code: &str) -> bool {
    code.contains("NonExistentQueue") || code.contains("QueueDoesNotExist")
}

/// Where a service is reached: the emulator, or AWS's endpoint in the region.
pub(super) fn endpoint_of(settings_endpoint: Option<&str>, service: &str, region: &str) -> String {
    match settings_endpoint {
        Some(url) => url.to_owned(),
        None => format!("https://{service}.{region}.amazonaws.com"),
    }
}

/// The region the SDK configuration found, or [`SetupError::NoRegion`].
pub async fn region(endpoint_url: Option<&str>) -> Result<String, SetupError> {
    super::sdk_config(endpoint_url)
        .await
        .region()
        .map(|r| r.to_string())
        .ok_or(SetupError::NoRegion)
}

/// What a command needs is there: a region, credentials that work, the table and the
/// queues. One DescribeTable and one GetQueueAttributes per queue; made before a
/// command writes anything, so a missing queue does not leave half a change. An
/// identity that may not describe (a narrow operator policy) is let through: the
/// command itself says what it may not do.
pub async fn check(clients: &AwsClients, settings: &AwsSettings) -> Result<(), SetupError> {
    let region = region(settings.endpoint_url.as_deref()).await?;
    let at = |service: &str| endpoint_of(settings.endpoint_url.as_deref(), service, &region);
    match clients
        .dynamodb
        .describe_table()
        .table_name(&settings.table)
        .send()
        .await
    {
        Ok(_) => {}
        Err(e) if e.code() == Some("ResourceNotFoundException") => {
            return Err(SetupError::Missing {
                what: format!("DynamoDB table `{}`", settings.table),
                endpoint: at("dynamodb"),
            });
        }
        Err(e) => match classify("DynamoDB", "DescribeTable", &at("dynamodb"), &e) {
            SetupError::Denied { .. } => {}
            other => return Err(other),
        },
    }
    let queues = [
        Some(("sessions queue", &settings.sessions_queue_url)),
        settings
            .hooks_queue_url
            .as_ref()
            .map(|u| ("hooks queue", u)),
        settings
            .hooks_dlq_url
            .as_ref()
            .map(|u| ("hooks dead-letter queue", u)),
    ];
    for (what, url) in queues.into_iter().flatten() {
        match clients
            .sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
        {
            Ok(_) => {}
            Err(e) if queue_missing(e.code().unwrap_or_default()) => {
                return Err(SetupError::Missing {
                    what: format!("SQS {what} {url}"),
                    endpoint: at("sqs"),
                });
            }
            Err(e) => match classify("SQS", "GetQueueAttributes", &at("sqs"), &e) {
                SetupError::Denied { .. } => {}
                other => return Err(other),
            },
        }
    }
    Ok(())
}

/// A deployed stack's outputs by name (`TableName`, `SessionsQueueUrl`, …).
pub async fn stack_outputs(
    endpoint_url: Option<&str>,
    name: &str,
) -> Result<BTreeMap<String, String>, SetupError> {
    let sdk = super::sdk_config(endpoint_url).await;
    let region = sdk
        .region()
        .map(|r| r.to_string())
        .ok_or(SetupError::NoRegion)?;
    let client = aws_sdk_cloudformation::Client::new(&sdk);
    let endpoint = endpoint_of(endpoint_url, "cloudformation", &region);
    let out = match client.describe_stacks().stack_name(name).send().await {
        Ok(out) => out,
        Err(e) if e.code() == Some("ValidationError") => {
            return Err(SetupError::NoStack {
                name: name.to_owned(),
                region,
            });
        }
        Err(e) => return Err(classify("CloudFormation", "DescribeStacks", &endpoint, &e)),
    };
    let Some(stack) = out.stacks().first() else {
        return Err(SetupError::NoStack {
            name: name.to_owned(),
            region,
        });
    };
    Ok(stack
        .outputs()
        .iter()
        .filter_map(|o| Some((o.output_key()?.to_owned(), o.output_value()?.to_owned())))
        .collect())
}

/// Which variable each stack output fills (`infra/template.yaml`'s output names).
pub const STACK_VARIABLES: [(&str, &str); 5] = [
    ("TableName", "PULSE_TABLE"),
    ("SessionsQueueUrl", "PULSE_SESSIONS_QUEUE_URL"),
    ("HooksQueueUrl", "PULSE_HOOKS_QUEUE_URL"),
    ("HooksDeadLetterQueueUrl", "PULSE_HOOKS_DLQ_URL"),
    ("ReceiverUrl", "PULSE_PUBLIC_URL"),
];

/// One line with the fix for an AWS error met in the middle of a command, from its
/// chain of messages; `None` when there is nothing better to say than the error.
pub fn explain(chain: &str) -> Option<String> {
    if chain.contains("AccessDenied") || chain.contains("not authorized to perform") {
        return Some(
            "AWS denied the request (the error names the action and resource): grant it to the identity your credentials name".into(),
        );
    }
    if chain.contains("ResourceNotFoundException") {
        return Some("the DynamoDB table was not found: check PULSE_TABLE and AWS_REGION, run `pulse init`, or set PULSE_STACK".into());
    }
    if queue_missing(chain) {
        return Some("the SQS queue was not found: check the queue URLs and AWS_REGION, run `pulse init`, or set PULSE_STACK".into());
    }
    if chain.contains("loading credentials") || chain.contains("no credentials") {
        return Some("no AWS credentials: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE (against an emulator any static keys do)".into());
    }
    if chain.contains("dispatch failure")
        && (chain.contains("onnection refused") || chain.contains("dns error"))
    {
        return Some(
            "the AWS endpoint did not answer: check AWS_ENDPOINT_URL and the network".into(),
        );
    }
    None
}

#[cfg(test)]
mod tests {

    use aws_sdk_dynamodb::operation::describe_table::DescribeTableError;
    use aws_smithy_runtime_api::http::Response as HttpResponse;

    use super::*;

    fn service_error(code: &str, message: &str) -> SdkError<DescribeTableError, HttpResponse> {
        let meta = aws_sdk_dynamodb::error::ErrorMetadata::builder()
            .code(code)
            .message(message)
            .build();
        SdkError::service_error(
            DescribeTableError::generic(meta),
            HttpResponse::new(
                aws_smithy_runtime_api::http::StatusCode::try_from(400).unwrap(),
                aws_smithy_types::body::SdkBody::empty(),
            ),
        )
    }

    #[test]
    fn aws_errors_are_named_with_their_fix() {
        let denied = service_error(
            "AccessDeniedException",
            "User: arn:aws:iam::1:user/ops is not authorized to perform: dynamodb:DescribeTable on resource: arn:aws:dynamodb:us-east-1:1:table/pulse",
        );
        let said = |e| classify("DynamoDB", "DescribeTable", "https://x", e);
        let e = said(&denied).to_string();
        assert!(
            e.starts_with("AWS denied DynamoDB DescribeTable: User: arn:aws:iam::1:user/ops is not authorized to perform: dynamodb:DescribeTable on resource: arn:aws:dynamodb:us-east-1:1:table/pulse; grant it"),
            "{e}"
        );
        let bad_keys = service_error(
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        );
        let e = said(&bad_keys).to_string();
        assert!(
            e.starts_with("AWS rejected the credentials (The security token"),
            "{e}"
        );
        let other = service_error("ThrottlingException", "slow down");
        assert!(matches!(said(&other), SetupError::Other { .. }));
    }

    #[test]
    fn mid_command_errors_get_a_fix() {
        let denied = "dynamodb put agent failed: service error: AccessDeniedException: User: arn:aws:iam::1:user/x is not authorized to perform: dynamodb:PutItem on resource: arn:aws:dynamodb:us-east-1:1:table/pulse";
        assert!(explain(denied).unwrap().contains("grant it"));
        assert!(
            explain("sqs send failed: service error: AWS.SimpleQueueService.NonExistentQueue")
                .unwrap()
                .contains("pulse init")
        );
        assert!(explain("dynamodb list agents failed: dispatch failure: io error: client error (Connect): tcp connect error: Connection refused (os error 111)").unwrap().contains("AWS_ENDPOINT_URL"));
        assert_eq!(explain("a tool failed"), None);
    }
}
