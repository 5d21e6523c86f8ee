//! Usage: the model tokens an agent's heartbeats (the heartbeat agent's runs) and
//! conversation turns used, per day in the agent's time zone, by provider and model,
//! and the AWS requests they made, with an estimated cost from a price table. Read from
//! the records themselves (the heartbeat agent's actions, the heartbeats and the
//! turns), so the totals are the sum of what was recorded.

use std::collections::BTreeMap;

use jiff::Timestamp;
use jiff::civil::Date;
use serde::{Deserialize, Serialize};

use crate::domain::{Agent, HEARTBEAT_AGENT, Requests};
use crate::error::StoreError;
use crate::ports::Store;

/// Most actions and turns read per agent.
pub const USAGE_SCAN: usize = 10_000;

/// A model's list price, in US dollars per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelPrice {
    /// Per million input (prompt) tokens.
    pub input: f64,
    /// Per million output (completion) tokens.
    pub output: f64,
    /// Per million prompt tokens read from the provider's cache; the input price when
    /// not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
    /// Per million prompt tokens written to the provider's cache (Anthropic's
    /// five-minute writes cost 1.25 times the input); the input price when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
    /// Per million prompt tokens written to the provider's cache for an hour
    /// (Anthropic: twice the input); the five-minute write price when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_long: Option<f64>,
}

impl ModelPrice {
    /// What `usage` cost at this price, in US dollars: the prompt by the tokens not
    /// cached, read from the cache and written to it, then the output.
    pub fn cost(&self, usage: &crate::domain::Usage) -> f64 {
        let (read, written) = (usage.cache_read_tokens, usage.cache_write_tokens);
        let long = usage.cache_write_long_tokens.min(written);
        let plain = usage.input_tokens.saturating_sub(read + written);
        (plain as f64 * self.input
            + read as f64 * self.read()
            + (written - long) as f64 * self.write()
            + long as f64 * self.write_long()
            + usage.output_tokens as f64 * self.output)
            / 1_000_000.0
    }

    fn read(&self) -> f64 {
        self.cached_input.unwrap_or(self.input)
    }
    fn write(&self) -> f64 {
        self.cache_write.unwrap_or(self.input)
    }
    fn write_long(&self) -> f64 {
        self.cache_write_long.unwrap_or_else(|| self.write())
    }

    /// Whether an hour's cache pays at these prices for calls that come more than five
    /// minutes and less than an hour apart: an hour's write costs more than five
    /// minutes' by `write_long − write`, and each call that reads it rather than
    /// writing the prefix again saves `write − read`; so one read in the hour pays
    /// for it when the first is smaller (Anthropic: 0.75 against 1.15 times the input).
    pub fn hour_cache_pays(&self) -> bool {
        self.write_long() - self.write() < self.write() - self.read()
    }

    /// What the cache saved on `usage`, in US dollars: its reads at the input price less
    /// what they cost, less the premium its writes paid (negative when writes cost
    /// more than reads saved).
    pub fn saved(&self, usage: &crate::domain::Usage) -> f64 {
        let read =
            usage.cache_read_tokens as f64 * (self.input - self.cached_input.unwrap_or(self.input));
        let long = usage.cache_write_long_tokens.min(usage.cache_write_tokens);
        let premium = (usage.cache_write_tokens - long) as f64 * (self.write() - self.input)
            + long as f64 * (self.write_long() - self.input);
        (read - premium) / 1_000_000.0
    }
}

/// When the built-in model prices were copied from the providers' price pages.
pub const PRICES_AS_OF: &str = "2025-11-01";

/// Prices by model name, and AWS's. A model is priced by the longest name in the table
/// it starts with (`gpt-4o-mini-2024-07-18` by `gpt-4o-mini`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    /// Model name → price.
    #[serde(default)]
    pub models: BTreeMap<String, ModelPrice>,
    /// AWS's prices.
    #[serde(default)]
    pub aws: AwsPrices,
}

/// AWS's on-demand list prices in US dollars, as published for us-east-1 when this table
/// was written (2025). Regions differ: `PULSE_PRICES` overrides.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AwsPrices {
    /// DynamoDB, per million write request units.
    pub dynamodb_write_units: f64,
    /// DynamoDB, per million read request units.
    pub dynamodb_read_units: f64,
    /// SQS, per million requests: the FIFO price, which the sessions queue pays (the
    /// hooks queue's standard price is lower, $0.40).
    pub sqs_requests: f64,
    /// EventBridge, per million events put (hooks that target a bus).
    pub eventbridge_events: f64,
    /// Lambda on arm64, per GB-second.
    pub lambda_gb_seconds: f64,
    /// Lambda, per million invocations.
    pub lambda_invocations: f64,
    /// EventBridge Scheduler, per million scheduled invocations (the sweeper's minute).
    pub scheduler_invocations: f64,
}

impl Default for AwsPrices {
    fn default() -> Self {
        Self {
            dynamodb_write_units: 0.625,
            dynamodb_read_units: 0.125,
            sqs_requests: 0.50,
            eventbridge_events: 1.00,
            lambda_gb_seconds: 0.000_013_333_4,
            lambda_invocations: 0.20,
            scheduler_invocations: 1.00,
        }
    }
}

impl AwsPrices {
    /// What `requests` cost: DynamoDB by the capacity they consumed, SQS and
    /// EventBridge by the request.
    pub fn of(&self, requests: &Requests) -> f64 {
        (requests.wru * self.dynamodb_write_units
            + requests.rru * self.dynamodb_read_units
            + requests.of_service("SQS") as f64 * self.sqs_requests
            + requests.of_service("EventBridge") as f64 * self.eventbridge_events)
            / 1_000_000.0
    }
}

/// The built-in list prices (USD per million tokens: input, output, and the cached
/// input's share of the input price), as the providers published them on
/// [`PRICES_AS_OF`]. Anthropic bills cache reads at 0.1 times the input, five-minute
/// cache writes at 1.25 times and one-hour writes at 2 times; OpenAI's automatic caching bills reads at its models'
/// cached-input price and writes at the input price. Prices change: `PULSE_PRICES`
/// overrides.
const LIST_PRICES: [(&str, f64, f64, f64); 16] = [
    ("claude-opus-4-1", 15.0, 75.0, 0.1),
    ("claude-opus-4", 15.0, 75.0, 0.1),
    ("claude-sonnet-4-5", 3.0, 15.0, 0.1),
    ("claude-sonnet-4", 3.0, 15.0, 0.1),
    ("claude-haiku-4-5", 1.0, 5.0, 0.1),
    ("claude-3-5-haiku", 0.8, 4.0, 0.1),
    ("gpt-5", 1.25, 10.0, 0.1),
    ("gpt-5-mini", 0.25, 2.0, 0.1),
    ("gpt-5-nano", 0.05, 0.4, 0.1),
    ("gpt-4.1", 2.0, 8.0, 0.25),
    ("gpt-4.1-mini", 0.4, 1.6, 0.25),
    ("gpt-4.1-nano", 0.1, 0.4, 0.25),
    ("gpt-4o", 2.5, 10.0, 0.5),
    ("gpt-4o-mini", 0.15, 0.6, 0.5),
    ("o4-mini", 1.1, 4.4, 0.25),
    ("offline", 0.0, 0.0, 1.0),
];

/// Anthropic's five-minute cache writes: 1.25 times the input price.
const ANTHROPIC_CACHE_WRITE: f64 = 1.25;
/// Anthropic's one-hour cache writes: twice the input price.
const ANTHROPIC_CACHE_WRITE_HOUR: f64 = 2.0;

impl Default for Prices {
    fn default() -> Self {
        Self {
            aws: AwsPrices::default(),
            models: LIST_PRICES
                .iter()
                .map(|(m, i, o, cached)| {
                    let (write, long) = if m.starts_with("claude") {
                        (ANTHROPIC_CACHE_WRITE, ANTHROPIC_CACHE_WRITE_HOUR)
                    } else {
                        (1.0, 1.0)
                    };
                    (
                        (*m).to_owned(),
                        ModelPrice {
                            input: *i,
                            output: *o,
                            cached_input: Some(i * cached),
                            cache_write: Some(i * write),
                            cache_write_long: Some(i * long),
                        },
                    )
                })
                .collect(),
        }
    }
}

/// A price table that does not read.
#[derive(Debug, thiserror::Error)]
#[error(
    "{0}; expected {{\"models\": {{\"MODEL\": {{\"input\": USD_PER_MILLION, \"output\": USD_PER_MILLION}}}}, \"aws\": {{\"dynamodb_write_units\": USD_PER_MILLION, …}}}}"
)]
pub struct PriceTableError(#[source] serde_json::Error);

impl Prices {
    /// The built-in prices with those of a JSON document over them:
    /// `{"models": {"my-model": {"input": 0.5, "output": 1.5}}, "aws":
    /// {"dynamodb_write_units": 0.7}}`; what it does not name keeps its built-in price.
    pub fn with_overrides(json: &str) -> Result<Self, PriceTableError> {
        let given: Prices = serde_json::from_str(json).map_err(PriceTableError)?;
        let mut prices = Self::default();
        prices.models.extend(given.models);
        prices.aws = given.aws;
        Ok(prices)
    }

    /// The built-in table, built once.
    pub fn builtin() -> &'static Prices {
        static BUILTIN: std::sync::LazyLock<Prices> = std::sync::LazyLock::new(Prices::default);
        &BUILTIN
    }

    /// The price of `model`, if the table knows it.
    pub fn of(&self, model: &str) -> Option<ModelPrice> {
        self.models
            .iter()
            .filter(|(name, _)| model.starts_with(name.as_str()))
            .max_by_key(|(name, _)| name.len())
            .map(|(_, p)| *p)
    }
}

/// One row: what one agent's heartbeats or turns used with one model on one day.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UsageRow {
    /// The day, in the agent's time zone.
    pub day: Date,
    /// The agent.
    pub agent_id: String,
    /// Its name.
    pub agent_name: String,
    /// `heartbeats` or `turns`.
    pub source: &'static str,
    /// The provider.
    pub provider: String,
    /// The model.
    pub model: String,
    /// Model calls.
    pub calls: u64,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Of the input tokens, those read from the provider's cache.
    pub cache_read_tokens: u64,
    /// Of the input tokens, those written to the provider's cache.
    pub cache_write_tokens: u64,
    /// Of the cache writes, those kept for an hour.
    pub cache_write_long_tokens: u64,
    /// Estimated cost in US dollars; `None` for a model the price table does not know.
    pub cost_usd: Option<f64>,
    /// What the cache saved, in US dollars (see [`ModelPrice::saved`]).
    pub saved_usd: Option<f64>,
}

/// One row: the AWS requests one agent's heartbeats or turns made on one day.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AwsRow {
    /// The day, in the agent's time zone.
    pub day: Date,
    /// The agent.
    pub agent_id: String,
    /// Its name.
    pub agent_name: String,
    /// `heartbeats` or `turns`.
    pub source: &'static str,
    /// How many heartbeats or turns recorded requests.
    pub records: u64,
    /// Their requests, summed.
    pub requests: Requests,
    /// Estimated cost in US dollars.
    pub cost_usd: f64,
}

/// What `pulse usage` reports: model tokens, and the AWS requests recorded (none on the
/// embedded store).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct UsageReport {
    /// Model tokens by day, source and model.
    pub models: Vec<UsageRow>,
    /// AWS requests by day and source.
    pub aws: Vec<AwsRow>,
}

type Key = (Date, &'static str, String, String);

/// One row's sums: its calls, all its tokens, those recorded without a cost (priced
/// now), and the costs recorded with the rest.
#[derive(Default)]
struct Summed {
    calls: u64,
    usage: crate::domain::Usage,
    unpriced: crate::domain::Usage,
    stored: f64,
}

/// One heartbeat agent run's or one turn's model calls, as `pulse usage --by action`
/// lists them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CallRecord {
    /// When it started.
    pub at: Timestamp,
    /// `heartbeats` or `turns`.
    pub source: &'static str,
    /// The action's or the turn's id.
    pub id: String,
    /// The provider.
    pub provider: String,
    /// The model.
    pub model: String,
    /// Model calls.
    pub calls: u64,
    /// Their tokens, by kind.
    pub usage: crate::domain::Usage,
    /// What they cost at the prices of the day they were made; `None` when that was
    /// not recorded (made before costs were kept, or a model the table did not know).
    pub cost_usd: Option<crate::domain::Usd>,
}

/// What [`records`] read.
pub struct Records {
    /// Each run's and turn's model calls, newest first.
    pub calls: Vec<CallRecord>,
    /// The turns read, for their AWS requests.
    turns: Vec<crate::domain::Turn>,
}

/// `agent`'s heartbeat agent runs and turns since `since` that called a model, newest
/// first. Reads at most [`USAGE_SCAN`] actions and turns.
pub async fn records(
    store: &dyn Store,
    agent: &Agent,
    since: Timestamp,
) -> Result<Records, StoreError> {
    let mut calls = Vec::new();
    for a in store.list_actions(&agent.id, USAGE_SCAN).await? {
        if a.tool.as_str() != HEARTBEAT_AGENT || a.started_at < since {
            continue;
        }
        let Some(response) = &a.response else {
            continue;
        };
        let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        let usage = &response["usage"];
        let count = n(&usage["llm_calls"]);
        if count == 0 {
            continue;
        }
        let text = |k: &str| response["output"][k].as_str().unwrap_or("").to_owned();
        calls.push(CallRecord {
            at: a.started_at,
            source: "heartbeats",
            id: a.id.to_string(),
            provider: text("provider"),
            model: text("model"),
            calls: count,
            usage: crate::domain::Usage {
                input_tokens: n(&usage["input_tokens"]),
                output_tokens: n(&usage["output_tokens"]),
                cache_read_tokens: n(&usage["cache_read_tokens"]),
                cache_write_tokens: n(&usage["cache_write_tokens"]),
                cache_write_long_tokens: n(&usage["cache_write_long_tokens"]),
            },
            cost_usd: serde_json::from_value(usage["cost_usd"].clone()).ok(),
        });
    }
    let turns = store.list_turns(&agent.id, USAGE_SCAN).await?;
    for t in &turns {
        if t.created_at < since || t.model.is_empty() || t.usage.total() == 0 {
            continue;
        }
        calls.push(CallRecord {
            at: t.created_at,
            source: "turns",
            id: t.id.to_string(),
            provider: t.provider.clone(),
            model: t.model.clone(),
            calls: t.steps.iter().filter(|s| s["kind"] == "llm").count().max(1) as u64,
            usage: t.usage,
            cost_usd: t.cost_usd,
        });
    }
    calls.sort_by(|a, b| b.at.cmp(&a.at).then_with(|| b.id.cmp(&a.id)));
    Ok(Records { calls, turns })
}

/// `agent`'s usage since `since`, by day (its time zone), source and model; oldest day
/// first. Reads at most [`USAGE_SCAN`] actions, turns and heartbeats.
pub async fn usage(
    store: &dyn Store,
    agent: &Agent,
    since: Timestamp,
    prices: &Prices,
) -> Result<UsageReport, StoreError> {
    let zone = agent.timezone.zone();
    let day = |t: Timestamp| t.to_zoned(zone.clone()).date();
    let mut rows: BTreeMap<Key, Summed> = BTreeMap::new();
    let records = records(store, agent, since).await?;
    for r in &records.calls {
        let row = rows
            .entry((day(r.at), r.source, r.provider.clone(), r.model.clone()))
            .or_default();
        row.calls += r.calls;
        row.usage.add(r.usage);
        match r.cost_usd {
            Some(c) => row.stored += c.dollars(),
            None => row.unpriced.add(r.usage),
        }
    }
    let mut aws: BTreeMap<(Date, &'static str), (u64, Requests)> = BTreeMap::new();
    let mut add_requests = |key: (Date, &'static str), r: &Option<Requests>| {
        if let Some(r) = r.as_ref().filter(|r| !r.is_empty()) {
            let row = aws.entry(key).or_default();
            row.0 += 1;
            row.1.add(r);
        }
    };
    for hb in store.heartbeats_page(&agent.id, None, USAGE_SCAN).await? {
        let at = hb.started_at.unwrap_or(hb.scheduled_at);
        if at >= since {
            add_requests((day(at), "heartbeats"), &hb.requests);
        }
    }
    for t in &records.turns {
        if t.created_at >= since {
            add_requests((day(t.created_at), "turns"), &t.requests);
        }
    }
    let models = rows
        .into_iter()
        .map(|((day, source, provider, model), summed)| {
            let Summed {
                calls,
                usage,
                unpriced,
                stored,
            } = summed;
            let price = prices.of(&model);
            // What was priced when it was made stays at that price; the rest is priced
            // now, and is unknown for a model the table does not know.
            let cost = match price {
                Some(p) => Some(stored + p.cost(&unpriced)),
                None if unpriced.total() == 0 => Some(stored),
                None => None,
            };
            UsageRow {
                cost_usd: cost,
                saved_usd: price.map(|p| p.saved(&usage)),
                day,
                agent_id: agent.id.to_string(),
                agent_name: agent.name.clone(),
                source,
                provider,
                model,
                calls,
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                cache_read_tokens: usage.cache_read_tokens,
                cache_write_tokens: usage.cache_write_tokens,
                cache_write_long_tokens: usage.cache_write_long_tokens,
            }
        })
        .collect();
    let aws = aws
        .into_iter()
        .map(|((day, source), (records, requests))| AwsRow {
            day,
            agent_id: agent.id.to_string(),
            agent_name: agent.name.clone(),
            source,
            records,
            cost_usd: prices.aws.of(&requests),
            requests,
        })
        .collect();
    Ok(UsageReport { models, aws })
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_cached_prompt_is_priced_by_its_parts_and_the_saving_said() {
        let prices = Prices::default();
        let sonnet = prices.of("claude-sonnet-4-5-20250929").unwrap();
        let usage = crate::domain::Usage {
            input_tokens: 1_000_000,
            output_tokens: 0,
            cache_read_tokens: 800_000,
            cache_write_tokens: 100_000,
            cache_write_long_tokens: 0,
        };
        // 100k plain at $3, 800k read at $0.30, 100k written at $3.75.
        let cost = sonnet.cost(&usage);
        assert!((cost - (0.3 + 0.24 + 0.375)).abs() < 1e-9, "{cost}");
        // Saved: 800k at $2.70 less the writes' premium of 100k at $0.75.
        let saved = sonnet.saved(&usage);
        assert!((saved - (2.16 - 0.075)).abs() < 1e-9, "{saved}");
        let plain = crate::domain::Usage {
            input_tokens: 1_000_000,
            output_tokens: 1_000_000,
            ..Default::default()
        };
        assert!((sonnet.cost(&plain) - 18.0).abs() < 1e-9);
        assert_eq!(sonnet.saved(&plain), 0.0);
        // OpenAI: reads at the model's cached price, writes at the input price.
        let mini = prices.of("gpt-4o-mini").unwrap();
        assert_eq!(mini.cached_input, Some(0.075));
        assert_eq!(mini.cache_write, Some(0.15));
        // A table given without cache prices bills cached tokens as plain input.
        let given =
            Prices::with_overrides(r#"{"models": {"my-model": {"input": 1, "output": 2}}}"#)
                .unwrap()
                .of("my-model")
                .unwrap();
        assert!((given.cost(&usage) - 1.0).abs() < 1e-9);
        // An hour's writes at twice the input: 100k at $6 instead of $3.75.
        let long = crate::domain::Usage {
            cache_write_long_tokens: 100_000,
            ..usage
        };
        assert!((sonnet.cost(&long) - (0.3 + 0.24 + 0.6)).abs() < 1e-9);
        assert!((sonnet.saved(&long) - (2.16 - 0.3)).abs() < 1e-9);
        // One read in the hour pays for an hour's cache at Anthropic's prices, not at
        // prices where the hour's write costs as much as the rewrite it saves.
        assert!(sonnet.hour_cache_pays());
        let dear = ModelPrice {
            cache_write_long: Some(3.0 * 3.0),
            ..sonnet
        };
        assert!(!dear.hour_cache_pays());
    }
    use super::*;

    #[test]
    fn models_are_priced_by_their_longest_known_prefix_and_overrides_win() {
        let p = Prices::default();
        assert_eq!(p.of("gpt-4o-mini-2024-07-18").unwrap().input, 0.15);
        assert_eq!(p.of("gpt-4o-2024-08-06").unwrap().input, 2.5);
        assert_eq!(p.of("claude-sonnet-4-5-20250929").unwrap().output, 15.0);
        assert_eq!(p.of("llama-3-70b"), None);
        let mine = Prices::with_overrides(
            r#"{"models": {"llama-3": {"input": 0.5, "output": 0.7}, "gpt-4o-mini": {"input": 1, "output": 2}}}"#,
        )
        .unwrap();
        assert_eq!(mine.of("llama-3-70b").unwrap().output, 0.7);
        assert_eq!(mine.of("gpt-4o-mini").unwrap().input, 1.0);
        assert_eq!(mine.of("gpt-4o").unwrap().input, 2.5, "the rest stay");
        assert!(Prices::with_overrides("{\"gpt\": 1}").is_err());
    }

    #[test]
    fn aws_requests_are_priced_by_capacity_and_by_request_and_can_be_overridden() {
        let mut r = Requests::default();
        r.count("DynamoDB.UpdateItem", 1.0);
        r.count("DynamoDB.TransactWriteItems", 4.0);
        r.count("DynamoDB.Query", 0.0);
        r.rru += 1.0;
        r.count("SQS.SendMessage", 0.0);
        r.count("EventBridge.PutEvents", 0.0);
        let p = Prices::default().aws;
        let expected = (5.0 * 0.625 + 1.0 * 0.125 + 0.50 + 1.00) / 1e6;
        assert!((p.of(&r) - expected).abs() < 1e-15, "{}", p.of(&r));
        let mine = Prices::with_overrides(r#"{"aws": {"dynamodb_write_units": 1.0}}"#).unwrap();
        assert_eq!(mine.aws.dynamodb_write_units, 1.0);
        assert_eq!(mine.aws.sqs_requests, 0.50, "the rest stay");
        assert!(mine.of("gpt-4o").is_some(), "the models stay");
        let typo = Prices::with_overrides(r#"{"aws": {"dynamo_wru": 1.0}}"#)
            .unwrap_err()
            .to_string();
        assert!(typo.contains("dynamo_wru"), "{typo}");
    }
}
