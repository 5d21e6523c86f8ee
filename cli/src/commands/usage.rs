//! `pulse usage`: the model tokens each agent's heartbeats and turns used, per day (the
//! agent's time zone), by model, and the AWS requests they made, with an estimated cost
//! from a price table (built in, or `PULSE_PRICES=FILE` over it).

use clap::Args;
use pulse_shared::config::Env;
use pulse_shared::engine::{Prices, UsageReport, UsageRow, records, usage};

use super::events::Since;
use super::{AgentRef, Ctx, agent_ref};
use crate::Failure;
use crate::output::outln;

#[derive(Args, Debug)]
pub(crate) struct UsageArgs {
    /// Only this agent (default: every agent).
    #[arg(long)]
    agent: Option<String>,
    /// From when: a duration back from now (7d, 24h) or a time.
    #[arg(long, default_value = "7d")]
    since: String,
    /// `day`: a row per day, source and model; `action`: a row per heartbeat agent run
    /// and per turn, newest first, with what it cost when it was made.
    #[arg(long, default_value = "day", value_parser = ["day", "action"])]
    by: String,
}

/// A validated `pulse usage`.
pub(crate) struct UsagePlan {
    agent: Option<AgentRef>,
    since: Since,
    prices: Prices,
    by_action: bool,
}

pub(crate) fn plan(a: UsageArgs) -> Result<UsagePlan, Failure> {
    let prices = match Env::process().var("PULSE_PRICES") {
        None => Prices::default(),
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| Failure::Input(format!("PULSE_PRICES: cannot read {path}: {e}")))?;
            Prices::with_overrides(&text)
                .map_err(|e| Failure::Input(format!("PULSE_PRICES: {path}: {e}")))?
        }
    };
    Ok(UsagePlan {
        agent: a.agent.as_deref().map(agent_ref).transpose()?,
        since: Since::parse(&a.since)?,
        prices,
        by_action: a.by == "action",
    })
}

fn tokens(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Dollars to the hundredth of a cent, or to six places for a sum below a cent (a day
/// of an idle agent's AWS requests is a few millionths).
fn dollars(c: Option<f64>) -> String {
    // A sum of nothing is -0.0 in floating point: shown as $0.
    match c.map(|c| c + 0.0) {
        None => "?".to_owned(),
        Some(c) if c > 0.0 && c < 0.01 => format!("${c:.6}"),
        Some(c) => format!("${c:.4}"),
    }
}

pub(crate) async fn execute(plan: UsagePlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let store = cx.b.store.as_ref();
    let agents = match &plan.agent {
        Some(agent) => vec![agent.find(cx.b).await?],
        None => store.list_agents().await?,
    };
    let since = plan.since.at(cx.clock.now());
    if plan.by_action {
        return by_action(&plan, &agents, since, cx).await;
    }
    let mut report = UsageReport::default();
    for agent in &agents {
        let one = usage(store, agent, since, &plan.prices).await?;
        report.models.extend(one.models);
        report.aws.extend(one.aws);
    }
    report
        .models
        .sort_by(|a, b| (a.day, &a.agent_name).cmp(&(b.day, &b.agent_name)));
    report
        .aws
        .sort_by(|a, b| (a.day, &a.agent_name).cmp(&(b.day, &b.agent_name)));
    if cx.out.json {
        cx.out.json_value(&report);
        return Ok(());
    }
    let rows = &report.models;
    if rows.is_empty() && !report.aws.is_empty() {
        outln!("no model calls in this period");
        aws_table(&report, cx);
        return Ok(());
    }
    cx.out.table(
        rows,
        &[
            "DAY", "AGENT", "SOURCE", "MODEL", "CALLS", "INPUT", "CACHED", "OUTPUT", "COST",
        ],
        |r| {
            vec![
                r.day.to_string(),
                r.agent_name.clone(),
                r.source.to_owned(),
                if r.provider.is_empty() {
                    r.model.clone()
                } else {
                    format!("{}/{}", r.provider, r.model)
                },
                r.calls.to_string(),
                tokens(r.input_tokens),
                hit_rate(r.cache_read_tokens, r.input_tokens),
                tokens(r.output_tokens),
                dollars(r.cost_usd),
            ]
        },
    );
    if !rows.is_empty() {
        outln!();
        outln!("{}", total_line(rows));
        outln!(
            "model prices as of {} (PULSE_PRICES=FILE overrides them); CACHED is the share of input tokens read from the provider's prompt cache",
            pulse_shared::engine::PRICES_AS_OF
        );
    }
    aws_table(&report, cx);
    Ok(())
}

/// `pulse usage --by action`: each run's and turn's model calls, newest first, with the
/// cost kept when it was made (or, marked `*`, priced at today's table).
async fn by_action(
    plan: &UsagePlan,
    agents: &[pulse_shared::domain::Agent],
    since: jiff::Timestamp,
    cx: &Ctx<'_>,
) -> Result<(), Failure> {
    let store = cx.b.store.as_ref();
    let mut rows = Vec::new();
    for agent in agents {
        for r in records(store, agent, since).await?.calls {
            rows.push((agent.name.clone(), r));
        }
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.1.at));
    if cx.out.json {
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|(name, r)| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                v["agent_name"] = name.clone().into();
                v
            })
            .collect();
        cx.out.json_value(&list);
        return Ok(());
    }
    let repriced = rows
        .iter()
        .any(|(_, r)| r.cost_usd.is_none() && plan.prices.of(&r.model).is_some());
    cx.out.table(
        &rows,
        &[
            "AT", "AGENT", "SOURCE", "ID", "MODEL", "CALLS", "INPUT", "CACHED", "OUTPUT", "COST",
        ],
        |(name, r)| {
            let cost = match r.cost_usd {
                Some(c) => dollars(Some(c.dollars())),
                None => match plan.prices.of(&r.model) {
                    Some(p) => format!("{}*", dollars(Some(p.cost(&r.usage)))),
                    None => "?".to_owned(),
                },
            };
            vec![
                r.at.strftime("%Y-%m-%d %H:%M:%S").to_string(),
                name.clone(),
                r.source.to_owned(),
                r.id.clone(),
                r.model.clone(),
                r.calls.to_string(),
                tokens(r.usage.input_tokens),
                hit_rate(r.usage.cache_read_tokens, r.usage.input_tokens),
                tokens(r.usage.output_tokens),
                cost,
            ]
        },
    );
    if repriced {
        outln!();
        outln!(
            "* priced at today's table (prices as of {}): its cost was not recorded when it was made",
            pulse_shared::engine::PRICES_AS_OF
        );
    }
    Ok(())
}

/// The share of `input` tokens read from the cache, as a percentage (`-` for none).
fn hit_rate(read: u64, input: u64) -> String {
    match (read, input) {
        (0, _) | (_, 0) => "-".to_owned(),
        (r, i) => format!("{:.0} %", r as f64 * 100.0 / i as f64),
    }
}

/// The line under the models table: the tokens, and what they cost where the price
/// table knows the model; a model it does not know is named, with how to price it,
/// never counted as free. What the prompt cache saved, when it read anything.
fn total_line(rows: &[UsageRow]) -> String {
    let (input, output, read): (u64, u64, u64) = rows.iter().fold((0, 0, 0), |(i, o, c), r| {
        (
            i + r.input_tokens,
            o + r.output_tokens,
            c + r.cache_read_tokens,
        )
    });
    let mut tokens_used = format!(
        "{} input and {} output tokens",
        tokens(input),
        tokens(output)
    );
    if read > 0 {
        let saved: f64 = rows.iter().filter_map(|r| r.saved_usd).sum();
        tokens_used.push_str(&format!(
            " ({} of the input read from the prompt cache, saving about {})",
            hit_rate(read, input),
            dollars(Some(saved))
        ));
    }
    let unpriced: std::collections::BTreeSet<&str> = rows
        .iter()
        .filter(|r| r.cost_usd.is_none())
        .map(|r| r.model.as_str())
        .collect();
    let priced: Vec<f64> = rows.iter().filter_map(|r| r.cost_usd).collect();
    if unpriced.is_empty() {
        return format!(
            "total: {tokens_used}, about {}",
            dollars(Some(priced.iter().sum()))
        );
    }
    let names = unpriced.into_iter().collect::<Vec<_>>().join(", ");
    let fix = format!(
        "no price for model {names}; set one with PULSE_PRICES=FILE, a JSON file such as \
         {{\"models\": {{\"MODEL\": {{\"input\": 0.5, \"output\": 1.5}}}}}} (US dollars per million tokens)"
    );
    if priced.is_empty() {
        format!("total: {tokens_used}, cost unknown: {fix}")
    } else {
        format!(
            "total: {tokens_used}, about {} for the priced models (marked ? are not): {fix}",
            dollars(Some(priced.iter().sum()))
        )
    }
}

/// The AWS requests the heartbeats and turns recorded, when there are any (on the AWS
/// backend).
fn aws_table(report: &UsageReport, cx: &Ctx<'_>) {
    let rows = &report.aws;
    if rows.is_empty() {
        return;
    }
    outln!();
    outln!("AWS requests, as each heartbeat and turn recorded them:");
    cx.out.table(
        rows,
        &[
            "DAY", "AGENT", "SOURCE", "COUNT", "REQUESTS", "DYNAMODB", "SQS", "WRU", "RRU", "COST",
        ],
        |r| {
            vec![
                r.day.to_string(),
                r.agent_name.clone(),
                r.source.to_owned(),
                r.records.to_string(),
                tokens(r.requests.total()),
                tokens(r.requests.of_service("DynamoDB")),
                tokens(r.requests.of_service("SQS")),
                format!("{:.1}", r.requests.wru),
                format!("{:.1}", r.requests.rru),
                dollars(Some(r.cost_usd)),
            ]
        },
    );
    let cost: f64 = rows.iter().map(|r| r.cost_usd).sum();
    let count = |source: &str| -> u64 {
        rows.iter()
            .filter(|r| r.source == source)
            .map(|r| r.records)
            .sum()
    };
    let (beats, turns) = (count("heartbeats"), count("turns"));
    outln!();
    outln!(
        "total: about {} for {beats} heartbeat{} and {turns} turn{} ({} per million); not in it: \
         the sweeper's shared requests and Lambda time (see `pulse bench sweep`)",
        dollars(Some(cost)),
        if beats == 1 { "" } else { "s" },
        if turns == 1 { "" } else { "s" },
        dollars(Some(cost / (beats + turns).max(1) as f64 * 1e6)),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(model: &str, cost: Option<f64>) -> UsageRow {
        UsageRow {
            day: jiff::civil::date(2026, 11, 25),
            agent_id: "agt_x".into(),
            agent_name: "scout".into(),
            source: "turns",
            provider: "openai".into(),
            model: model.into(),
            calls: 1,
            input_tokens: 1_200,
            output_tokens: 34,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
            cache_write_long_tokens: 0,
            cost_usd: cost,
            saved_usd: cost.map(|_| 0.0),
        }
    }

    #[test]
    fn a_model_without_a_price_is_named_with_the_fix_never_priced_at_minus_zero() {
        let line = total_line(&[row("my-llama", None)]);
        assert!(!line.contains("-0"), "{line}");
        assert!(!line.contains('$'), "{line}");
        assert!(
            line.contains("no price for model my-llama; set one with PULSE_PRICES=FILE"),
            "{line}"
        );
        let mixed = total_line(&[row("my-llama", None), row("gpt-4o", Some(0.0031))]);
        assert!(
            mixed.contains("about $0.003100 for the priced models"),
            "{mixed}"
        );
        assert!(mixed.contains("no price for model my-llama"), "{mixed}");
        let priced = total_line(&[row("gpt-4o", Some(0.25))]);
        assert_eq!(
            priced,
            "total: 1,200 input and 34 output tokens, about $0.2500"
        );
        assert_eq!(dollars(Some(-0.0)), "$0.0000");
    }

    #[test]
    fn token_counts_are_grouped_by_thousands() {
        assert_eq!(super::tokens(0), "0");
        assert_eq!(super::tokens(999), "999");
        assert_eq!(super::tokens(1_000), "1,000");
        assert_eq!(super::tokens(12_345_678), "12,345,678");
    }

    #[test]
    fn small_sums_keep_their_digits() {
        assert_eq!(super::dollars(None), "?");
        assert_eq!(super::dollars(Some(0.0)), "$0.0000");
        assert_eq!(super::dollars(Some(0.000_003_312_5)), "$0.000003");
        assert_eq!(super::dollars(Some(1.23456)), "$1.2346");
    }
}
