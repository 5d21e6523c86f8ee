//! `pulse usage`: the model tokens each agent's heartbeats and turns used, per day (the
//! agent's time zone), by model, with an estimated cost from a price table (built in,
//! or `PULSE_PRICES=FILE` over it).

use clap::Args;
use pulse_shared::config::Env;
use pulse_shared::domain::AgentId;
use pulse_shared::engine::{Prices, UsageRow, usage};

use super::events::Since;
use super::{Ctx, agent_id, require_agent};
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
}

/// A validated `pulse usage`.
pub(crate) struct UsagePlan {
    agent: Option<AgentId>,
    since: Since,
    prices: Prices,
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
        agent: a.agent.as_deref().map(agent_id).transpose()?,
        since: Since::parse(&a.since)?,
        prices,
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

fn dollars(c: Option<f64>) -> String {
    c.map_or_else(|| "?".to_owned(), |c| format!("${c:.4}"))
}

pub(crate) async fn execute(plan: UsagePlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let store = cx.b.store.as_ref();
    let agents = match &plan.agent {
        Some(id) => vec![require_agent(cx.b, id).await?],
        None => store.list_agents().await?,
    };
    let since = plan.since.at(cx.clock.now());
    let mut rows: Vec<UsageRow> = Vec::new();
    for agent in &agents {
        rows.extend(usage(store, agent, since, &plan.prices).await?);
    }
    rows.sort_by(|a, b| (a.day, &a.agent_name).cmp(&(b.day, &b.agent_name)));
    cx.out.table(
        &rows,
        &[
            "DAY", "AGENT", "SOURCE", "MODEL", "CALLS", "INPUT", "OUTPUT", "COST",
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
                tokens(r.output_tokens),
                dollars(r.cost_usd),
            ]
        },
    );
    if !cx.out.json && !rows.is_empty() {
        let (input, output): (u64, u64) = rows.iter().fold((0, 0), |(i, o), r| {
            (i + r.input_tokens, o + r.output_tokens)
        });
        let known: f64 = rows.iter().filter_map(|r| r.cost_usd).sum();
        let unpriced = rows.iter().any(|r| r.cost_usd.is_none());
        outln!();
        outln!(
            "total: {} input and {} output tokens, about {}{}",
            tokens(input),
            tokens(output),
            dollars(Some(known)),
            if unpriced {
                " (models marked ? are not in the price table: add them with PULSE_PRICES)"
            } else {
                ""
            }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn token_counts_are_grouped_by_thousands() {
        assert_eq!(super::tokens(0), "0");
        assert_eq!(super::tokens(999), "999");
        assert_eq!(super::tokens(1_000), "1,000");
        assert_eq!(super::tokens(12_345_678), "12,345,678");
    }
}
