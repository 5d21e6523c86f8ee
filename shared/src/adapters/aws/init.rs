//! `pulse init` on AWS: the table and queues as `infra/template.yaml` declares them,
//! created, or reused after their shape is checked.

use std::fmt::Debug;
use std::time::Duration;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    KeyType, ProjectionType, ScalarAttributeType, TableDescription, TableStatus,
    TimeToLiveSpecification, TimeToLiveStatus,
};
use aws_sdk_sqs::types::QueueAttributeName;

use super::AwsClients;
use super::keys::DUE_INDEX;
use super::setup::{SetupError, classify, endpoint_of, queue_missing, region};

/// The attribute DynamoDB's TTL reads (request logs, delivery ids, counters).
pub const TTL_ATTRIBUTE: &str = "expires_at";

/// The names `pulse init` gives, from one prefix, as `infra/template.yaml` names a
/// stack's queues.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    /// The table.
    pub table: String,
    /// The sessions FIFO queue.
    pub sessions: String,
    /// Its dead-letter queue.
    pub sessions_dlq: String,
    /// The hooks queue.
    pub hooks: String,
    /// Its dead-letter queue.
    pub hooks_dlq: String,
}

impl Names {
    /// `NAME` (the table), `NAME-sessions.fifo`, `NAME-sessions-dlq.fifo`, `NAME-hooks`,
    /// `NAME-hooks-dlq`.
    pub fn new(prefix: &str) -> Self {
        Self {
            table: prefix.to_owned(),
            sessions: format!("{prefix}-sessions.fifo"),
            sessions_dlq: format!("{prefix}-sessions-dlq.fifo"),
            hooks: format!("{prefix}-hooks"),
            hooks_dlq: format!("{prefix}-hooks-dlq"),
        }
    }
}

/// What `pulse init` made or found.
#[derive(Clone, Debug, Default)]
pub struct Provisioned {
    /// The table's name.
    pub table: String,
    /// The sessions queue's URL.
    pub sessions_queue_url: String,
    /// The hooks queue's URL.
    pub hooks_queue_url: String,
    /// The hooks dead-letter queue's URL.
    pub hooks_dlq_url: String,
    /// One line per resource: created, or reused.
    pub report: Vec<String>,
}

/// A queue's attributes, as SQS takes them.
type Attributes = Vec<(QueueAttributeName, String)>;

/// How long `pulse init` waits for a new table to become ACTIVE.
const TABLE_WAIT: Duration = Duration::from_secs(300);

/// Creates, or checks and reuses, the table and the four queues. Idempotent: run twice,
/// the second run creates nothing. `progress` is told what happens as it happens.
pub async fn init(
    clients: &AwsClients,
    endpoint_url: Option<&str>,
    names: &Names,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<Provisioned, SetupError> {
    let region = region(endpoint_url).await?;
    let at = |service: &str| endpoint_of(endpoint_url, service, &region);
    let mut done = Provisioned {
        table: names.table.clone(),
        ..Provisioned::default()
    };
    let line = table(clients, &names.table, &at("dynamodb"), progress).await?;
    progress(&line);
    done.report.push(line);

    // The four queues as the template declares them; a main queue redrives to the
    // dead-letter queue made before it.
    let day = |d: u32| (d * 86_400).to_string();
    let fifo = || (QueueAttributeName::FifoQueue, "true".to_owned());
    let specs: [(&str, Attributes, Option<usize>); 4] = [
        (
            &names.sessions_dlq,
            vec![
                fifo(),
                (QueueAttributeName::MessageRetentionPeriod, day(14)),
            ],
            None,
        ),
        (
            &names.sessions,
            vec![
                fifo(),
                (
                    QueueAttributeName::ContentBasedDeduplication,
                    "false".into(),
                ),
                (
                    QueueAttributeName::DeduplicationScope,
                    "messageGroup".into(),
                ),
                (
                    QueueAttributeName::FifoThroughputLimit,
                    "perMessageGroupId".into(),
                ),
                (QueueAttributeName::VisibilityTimeout, "720".into()),
                (QueueAttributeName::MessageRetentionPeriod, day(4)),
            ],
            Some(0),
        ),
        (
            &names.hooks_dlq,
            vec![(QueueAttributeName::MessageRetentionPeriod, day(14))],
            None,
        ),
        (
            &names.hooks,
            vec![
                (QueueAttributeName::VisibilityTimeout, "540".into()),
                (QueueAttributeName::MessageRetentionPeriod, day(4)),
            ],
            Some(2),
        ),
    ];
    let sqs_at = at("sqs");
    let mut urls: Vec<String> = Vec::with_capacity(specs.len());
    for (name, attributes, dead_letter) in &specs {
        let dead_letter = dead_letter.map(|i| urls[i].clone());
        let (url, line) = queue(clients, &sqs_at, name, attributes, dead_letter.as_deref()).await?;
        progress(&line);
        done.report.push(line);
        urls.push(url);
    }
    let [_, sessions, hooks_dlq, hooks]: [String; 4] = urls.try_into().expect("one URL per queue");
    done.sessions_queue_url = sessions;
    done.hooks_queue_url = hooks;
    done.hooks_dlq_url = hooks_dlq;
    Ok(done)
}

/// What differs between a table and the one Pulse needs: `pk`/`sk` string keys, and the
/// `due` index on `due_shard` (string) and `due_at` (number), keys only.
pub fn table_differences(t: &TableDescription) -> Vec<String> {
    let type_of = |name: &str| {
        t.attribute_definitions()
            .iter()
            .find(|a| a.attribute_name() == name)
            .map(|a| a.attribute_type().clone())
    };
    let keys = |schema: &[aws_sdk_dynamodb::types::KeySchemaElement]| {
        let of = |k: KeyType| {
            schema
                .iter()
                .find(|e| *e.key_type() == k)
                .map(|e| e.attribute_name().to_owned())
        };
        (of(KeyType::Hash), of(KeyType::Range))
    };
    let shown = |k: &(Option<String>, Option<String>)| {
        format!(
            "{}/{}",
            k.0.as_deref().unwrap_or("-"),
            k.1.as_deref().unwrap_or("-")
        )
    };
    let mut diffs = Vec::new();
    let want = (Some("pk".to_owned()), Some("sk".to_owned()));
    let have = keys(t.key_schema());
    if have != want {
        diffs.push(format!("its keys are {} (Pulse needs pk/sk)", shown(&have)));
    }
    for (name, ty) in [
        ("pk", ScalarAttributeType::S),
        ("sk", ScalarAttributeType::S),
    ] {
        if let Some(found) = type_of(name).filter(|found| *found != ty) {
            diffs.push(format!("{name} is of type {found} (Pulse needs {ty})"));
        }
    }
    match t
        .global_secondary_indexes()
        .iter()
        .find(|i| i.index_name() == Some(DUE_INDEX))
    {
        None => diffs.push(format!(
            "it has no `{DUE_INDEX}` index (due_shard/due_at, keys only)"
        )),
        Some(i) => {
            let want = (Some("due_shard".to_owned()), Some("due_at".to_owned()));
            let have = keys(i.key_schema());
            if have != want {
                diffs.push(format!(
                    "its `{DUE_INDEX}` index's keys are {} (Pulse needs due_shard/due_at)",
                    shown(&have)
                ));
            }
            if type_of("due_at").is_some_and(|t| t != ScalarAttributeType::N) {
                diffs.push("due_at is not a number".into());
            }
            let projection = i
                .projection()
                .and_then(|p| p.projection_type())
                .cloned()
                .unwrap_or(ProjectionType::All);
            if projection != ProjectionType::KeysOnly {
                diffs.push(format!(
                    "its `{DUE_INDEX}` index projects {projection} (Pulse needs KEYS_ONLY)"
                ));
            }
        }
    }
    diffs
}

async fn table(
    clients: &AwsClients,
    name: &str,
    endpoint: &str,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<String, SetupError> {
    let db = &clients.dynamodb;
    let what = format!("DynamoDB table `{name}`");
    let described = db.describe_table().table_name(name).send().await;
    let created = match described {
        Ok(out) => {
            let t = out
                .table
                .unwrap_or_else(|| TableDescription::builder().build());
            let diffs = table_differences(&t);
            if !diffs.is_empty() {
                return Err(SetupError::Shape {
                    what,
                    differences: diffs.join("; "),
                });
            }
            false
        }
        Err(e) if e.code() == Some("ResourceNotFoundException") => {
            progress(&format!("creating {what}…"));
            super::provision::create_table(db, name)
                .await
                .map_err(|e| SetupError::Other {
                    service: "DynamoDB",
                    operation: "CreateTable",
                    detail: format!("{e:#}"),
                })?;
            true
        }
        Err(e) => return Err(classify("DynamoDB", "DescribeTable", endpoint, &e)),
    };
    // A new table is CREATING for a while on AWS; TTL can be set once it is ACTIVE.
    let start = tokio::time::Instant::now();
    loop {
        let status = db
            .describe_table()
            .table_name(name)
            .send()
            .await
            .map_err(|e| classify("DynamoDB", "DescribeTable", endpoint, &e))?
            .table
            .and_then(|t| t.table_status)
            .unwrap_or(TableStatus::Active);
        if status == TableStatus::Active {
            break;
        }
        if start.elapsed() > TABLE_WAIT {
            return Err(SetupError::Other {
                service: "DynamoDB",
                operation: "CreateTable",
                detail: format!(
                    "{what} is still {status} after 5 minutes; run `pulse init` again later"
                ),
            });
        }
        progress(&format!("{what} is {status}; waiting…"));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let ttl = db
        .describe_time_to_live()
        .table_name(name)
        .send()
        .await
        .map_err(|e| classify("DynamoDB", "DescribeTimeToLive", endpoint, &e))?
        .time_to_live_description;
    let status = ttl.as_ref().and_then(|t| t.time_to_live_status().cloned());
    let attribute = ttl.as_ref().and_then(|t| t.attribute_name()).unwrap_or("");
    let on = matches!(
        status,
        Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
    );
    let ttl_note = if on && attribute != TTL_ATTRIBUTE {
        return Err(SetupError::Shape {
            what,
            differences: format!(
                "its TTL reads `{attribute}` (Pulse writes expiry times to `{TTL_ATTRIBUTE}`)"
            ),
        });
    } else if on {
        "TTL on expires_at"
    } else {
        let spec = TimeToLiveSpecification::builder()
            .attribute_name(TTL_ATTRIBUTE)
            .enabled(true)
            .build()
            .map_err(|e| SetupError::Other {
                service: "DynamoDB",
                operation: "UpdateTimeToLive",
                detail: e.to_string(),
            })?;
        db.update_time_to_live()
            .table_name(name)
            .time_to_live_specification(spec)
            .send()
            .await
            .map_err(|e| classify("DynamoDB", "UpdateTimeToLive", endpoint, &e))?;
        "TTL on expires_at turned on"
    };
    Ok(format!(
        "{what}: {} (pk/sk, the `{DUE_INDEX}` index, {ttl_note})",
        if created { "created" } else { "exists, reused" }
    ))
}

/// Creates a queue with `attributes` and, given a dead-letter queue's URL, a redrive
/// to it after five receives; or checks and reuses an existing one. Returns its URL
/// and a line for the report.
async fn queue(
    clients: &AwsClients,
    endpoint: &str,
    name: &str,
    attributes: &[(QueueAttributeName, String)],
    dead_letter: Option<&str>,
) -> Result<(String, String), SetupError> {
    let sqs = &clients.sqs;
    let what = format!("SQS queue `{name}`");
    let redrive = match dead_letter {
        None => None,
        Some(dlq) => {
            let arn = sqs
                .get_queue_attributes()
                .queue_url(dlq)
                .attribute_names(QueueAttributeName::QueueArn)
                .send()
                .await
                .map_err(|e| classify("SQS", "GetQueueAttributes", endpoint, &e))?
                .attributes
                .and_then(|mut a| a.remove(&QueueAttributeName::QueueArn))
                .unwrap_or_default();
            Some(format!(
                r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":5}}"#
            ))
        }
    };
    match sqs.get_queue_url().queue_name(name).send().await {
        Ok(found) => {
            let url = found.queue_url.unwrap_or_default();
            let have = sqs
                .get_queue_attributes()
                .queue_url(&url)
                .attribute_names(QueueAttributeName::All)
                .send()
                .await
                .map_err(|e| classify("SQS", "GetQueueAttributes", endpoint, &e))?
                .attributes
                .unwrap_or_default();
            let fifo = have
                .get(&QueueAttributeName::FifoQueue)
                .is_some_and(|v| v == "true");
            let wants_fifo = name.ends_with(".fifo");
            if fifo != wants_fifo {
                return Err(SetupError::Shape {
                    what,
                    differences: format!("it is {}a FIFO queue", if fifo { "" } else { "not " }),
                });
            }
            let mut note = "exists, reused".to_owned();
            if let Some(redrive) = redrive
                && !have.contains_key(&QueueAttributeName::RedrivePolicy)
            {
                sqs.set_queue_attributes()
                    .queue_url(&url)
                    .attributes(QueueAttributeName::RedrivePolicy, redrive)
                    .send()
                    .await
                    .map_err(|e| classify("SQS", "SetQueueAttributes", endpoint, &e))?;
                note.push_str("; its redrive to the dead-letter queue was added");
            }
            Ok((url, format!("{what}: {note}")))
        }
        Err(e) if queue_missing(e.code().unwrap_or_default()) => {
            let mut req = sqs.create_queue().queue_name(name);
            for (k, v) in attributes {
                req = req.attributes(k.clone(), v);
            }
            if let Some(redrive) = redrive {
                req = req.attributes(QueueAttributeName::RedrivePolicy, redrive);
            }
            let url = req
                .send()
                .await
                .map_err(|e| classify("SQS", "CreateQueue", endpoint, &e))?
                .queue_url
                .unwrap_or_default();
            let with = if dead_letter.is_some() {
                ", redrive to its dead-letter queue after 5 receives"
            } else {
                ""
            };
            Ok((url, format!("{what}: created{with}")))
        }
        Err(e) => Err(classify("SQS", "GetQueueUrl", endpoint, &e)),
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, GlobalSecondaryIndexDescription, KeySchemaElement, Projection,
    };

    use super::*;

    fn key(name: &str, t: KeyType) -> KeySchemaElement {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(t)
            .build()
            .unwrap()
    }

    fn attr(name: &str, t: ScalarAttributeType) -> AttributeDefinition {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(t)
            .build()
            .unwrap()
    }

    fn due(projection: ProjectionType) -> GlobalSecondaryIndexDescription {
        GlobalSecondaryIndexDescription::builder()
            .index_name(DUE_INDEX)
            .key_schema(key("due_shard", KeyType::Hash))
            .key_schema(key("due_at", KeyType::Range))
            .projection(Projection::builder().projection_type(projection).build())
            .build()
    }

    #[test]
    fn the_template_s_table_has_no_differences_and_others_are_named() {
        let good = TableDescription::builder()
            .key_schema(key("pk", KeyType::Hash))
            .key_schema(key("sk", KeyType::Range))
            .attribute_definitions(attr("pk", ScalarAttributeType::S))
            .attribute_definitions(attr("sk", ScalarAttributeType::S))
            .attribute_definitions(attr("due_at", ScalarAttributeType::N))
            .global_secondary_indexes(due(ProjectionType::KeysOnly))
            .build();
        assert!(table_differences(&good).is_empty());

        let other = TableDescription::builder()
            .key_schema(key("id", KeyType::Hash))
            .attribute_definitions(attr("id", ScalarAttributeType::S))
            .build();
        let diffs = table_differences(&other);
        assert_eq!(diffs.len(), 2, "{diffs:?}");
        assert!(diffs[0].contains("its keys are id/-"), "{diffs:?}");
        assert!(diffs[1].contains("no `due` index"), "{diffs:?}");

        let all = TableDescription::builder()
            .key_schema(key("pk", KeyType::Hash))
            .key_schema(key("sk", KeyType::Range))
            .attribute_definitions(attr("sk", ScalarAttributeType::N))
            .global_secondary_indexes(due(ProjectionType::All))
            .build();
        let diffs = table_differences(&all);
        assert!(
            diffs.iter().any(|d| d.contains("sk is of type N")),
            "{diffs:?}"
        );
        assert!(
            diffs.iter().any(|d| d.contains("projects ALL")),
            "{diffs:?}"
        );
    }

    #[test]
    fn names_follow_the_template() {
        let n = Names::new("pulse");
        assert_eq!(n.sessions, "pulse-sessions.fifo");
        assert_eq!(n.sessions_dlq, "pulse-sessions-dlq.fifo");
        assert_eq!(n.hooks, "pulse-hooks");
        assert_eq!(n.hooks_dlq, "pulse-hooks-dlq");
    }
}
