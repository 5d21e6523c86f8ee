//! Dollar budgets (`--budget-usd-day`, `--budget-usd-month`): before each model call of
//! an agent that has one, the call's worst case — its prompt at the dearest rate it may
//! be billed at, and all of its `max_tokens` written — is held against the day's and
//! the month's budget in the store, in one conditional write, so two workers cannot
//! both spend what is left; a call that does not fit is not made. After the call the
//! hold is settled with what it cost at the price table's prices. `BUDGET_THRESHOLD`
//! fires when the spent share of a period's budget crosses 50, 80 and 100 %, once each;
//! from two thirds on, the model reads one line saying what is left.
//!
//! An agent without a dollar budget holds nothing and reads nothing: no write is added
//! to its calls.

use jiff::Timestamp;
use serde_json::json;
use tracing::{info, warn};

use super::budget::{day_of, next_midnight, told};
use super::hooks::HookEmitter;
use super::{ModelPrice, Prices};
use crate::domain::{Agent, CacheTtl, ChatMessage, HookType, Limit, LlmRequest, Tally, Usage, Usd};
use crate::error::{EngineError, StoreError, chain};
use crate::ports::Store;

/// The most tokens one picture in a prompt is billed as.
const IMAGE_TOKENS: f64 = 1_600.0;

/// The shares of a budget at which BUDGET_THRESHOLD fires, in percent.
pub const THRESHOLDS: [u64; 3] = [50, 80, 100];

/// A call's hold, to settle when its answer (or its failure) is known.
#[derive(Clone, Debug)]
pub struct Hold {
    limits: Vec<Limit>,
    amount: Usd,
    price: ModelPrice,
}

/// What holding a call's worst case came to.
#[derive(Clone, Debug)]
pub enum Held {
    /// The agent has no dollar budget: nothing held, nothing to settle.
    Free,
    /// Held: make the call, then [`settle`].
    Held(Hold),
    /// Not held, and the call is not to be made.
    Refused(Refusal),
}

/// Why a call was not made.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// For the record (the SKIPPED action, the turn's error) and the logs.
    pub reason: String,
    /// For the person who wrote: what happened and when the agent answers again.
    pub line: String,
}

/// The agent's budgets in force at `now`: today's and this month's, in its time zone.
pub fn limits(agent: &Agent, now: Timestamp) -> Vec<Limit> {
    let day = day_of(agent, now);
    let mut out = Vec::new();
    if let Some(limit) = agent.budgets.usd_day {
        out.push(Limit {
            period: day.to_string(),
            limit,
        });
    }
    if let Some(limit) = agent.budgets.usd_month {
        out.push(Limit {
            period: format!("{:04}-{:02}", day.year(), day.month()),
            limit,
        });
    }
    out
}

/// The most `request` can cost at `price`: its prompt (estimated at four characters a
/// token, tools included, and 1,600 tokens a picture) at the dearest rate it may be
/// billed at — written to the cache for an hour, if it asks for that — and all of
/// `max_tokens` written.
pub fn worst_case(price: &ModelPrice, request: &LlmRequest) -> Usd {
    let chars: usize = request
        .messages
        .iter()
        .map(|m| match m {
            ChatMessage::ToolResult { content, .. } => content.len(),
            m => m.text().map_or(0, str::len),
        })
        .sum::<usize>()
        + request
            .tools
            .iter()
            .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
            .sum::<usize>();
    // A picture is at most about 1,600 tokens (Anthropic: width × height / 750, images
    // scaled to 1.15 megapixels; OpenAI's high detail is less).
    let images: usize = request
        .messages
        .iter()
        .map(|m| match m {
            ChatMessage::User { images, .. } | ChatMessage::ToolResult { images, .. } => {
                images.len()
            }
            _ => 0,
        })
        .sum();
    // Bytes, not characters: never fewer tokens than the provider counts; 10 % more
    // for what the wire format adds.
    let prompt = (chars.div_ceil(4) as f64 * 1.1).ceil()
        + 64.0 * request.messages.len() as f64
        + IMAGE_TOKENS * images as f64;
    let write = match request.cache.map(|c| c.ttl) {
        Some(CacheTtl::Hour) => price.cache_write_long.or(price.cache_write),
        Some(CacheTtl::Minutes5) => price.cache_write,
        None => None,
    };
    let per_input = write.unwrap_or(price.input).max(price.input);
    Usd::from_dollars(
        (prompt * per_input + f64::from(request.max_tokens) * price.output) / 1_000_000.0,
    )
}

/// Holds `request`'s worst case on `model` against `agent`'s budgets, if it has any. A
/// budget that cannot take the call is full: BUDGET_THRESHOLD at 100 % is told through
/// `hooks`, once per period.
pub async fn hold(
    store: &dyn Store,
    hooks: Option<&HookEmitter>,
    prices: &Prices,
    agent: &Agent,
    model: &str,
    request: &LlmRequest,
    now: Timestamp,
) -> Result<Held, StoreError> {
    let limits = limits(agent, now);
    if limits.is_empty() {
        return Ok(Held::Free);
    }
    let Some(price) = prices.of(model) else {
        return Ok(Held::Refused(Refusal {
            reason: format!(
                "dollar budget: no price for model {model}, so what a call costs is not known and the budget cannot be kept; add the model's price to PULSE_PRICES"
            ),
            line: format!(
                "I have a spending limit, but no price for my model ({model}), so I cannot tell what answering costs and will not call it. (The operator can add its price with PULSE_PRICES.)"
            ),
        }));
    };
    let amount = worst_case(&price, request);
    Ok(
        match store.hold_usd(&agent.id, &limits, amount, now).await? {
            Ok(()) => Held::Held(Hold {
                limits,
                amount,
                price,
            }),
            Err(tally) => {
                let limit = limits
                    .iter()
                    .find(|l| l.period == tally.period)
                    .map_or(Usd::ZERO, |l| l.limit);
                tell(store, hooks, agent, (&tally, limit), 100, now).await;
                Held::Refused(Refusal {
                    reason: spent_reason(agent, &tally, limit, amount, now),
                    line: format!(
                        "I have used up {} budget of {limit} for the model, so I cannot answer until it resets {}; please ask me again then. (To raise it: `pulse agents update {} --budget-usd-{} USD`.)",
                        if tally.period.len() == 7 {
                            "this month's"
                        } else {
                            "today's"
                        },
                        resets(agent, &tally.period, now),
                        agent.id,
                        if tally.period.len() == 7 {
                            "month"
                        } else {
                            "day"
                        },
                    ),
                })
            }
        },
    )
}

/// Why a call was not made: for the SKIPPED action, the turn's line and the logs.
fn spent_reason(agent: &Agent, tally: &Tally, limit: Usd, amount: Usd, now: Timestamp) -> String {
    let month = tally.period.len() == 7;
    let (what, resets) = if month {
        (
            "this month's",
            format!("when the month ends ({})", agent.timezone),
        )
    } else {
        (
            "today's",
            format!(
                "after midnight ({}, {})",
                agent.timezone,
                next_midnight(agent, now)
            ),
        )
    };
    format!(
        "dollar budget spent: {} of {what} {limit} spent and {} held for calls being made ({}); the next call could cost up to {amount}; the model is called again {resets}",
        tally.spent, tally.held, tally.period
    )
}

/// When `period` resets, for the user's line.
pub fn resets(agent: &Agent, period: &str, now: Timestamp) -> String {
    if period.len() == 7 {
        "at the start of next month".to_owned()
    } else {
        format!(
            "at midnight ({})",
            next_midnight(agent, now)
                .to_zoned(agent.timezone.zone())
                .strftime("%Y-%m-%d %H:%M %Z")
        )
    }
}

/// What a call raced against a newer message used, for its settle: its answer's usage,
/// the estimate of one dropped, nothing for one that failed.
pub fn used(
    raced: &crate::engine::interrupt::Raced<
        Result<crate::domain::LlmResponse, crate::error::LlmError>,
    >,
    request: &LlmRequest,
) -> Option<Usage> {
    use crate::engine::interrupt::{Raced, estimated_usage};
    match raced {
        Raced::Done(Ok(r)) => Some(r.usage),
        Raced::Done(Err(_)) => None,
        Raced::Interrupted(_) => Some(estimated_usage(&request.messages)),
    }
}

/// Settles `hold` with what the call used (nothing, for a call that failed before an
/// answer), and fires BUDGET_THRESHOLD for each share it crossed. A failure to settle is
/// logged: the hold then keeps counting the worst case, so the budget errs on the side
/// of spending less.
pub async fn settle(
    store: &dyn Store,
    hooks: Option<&HookEmitter>,
    agent: &Agent,
    hold: Hold,
    usage: Option<&Usage>,
    now: Timestamp,
) {
    let cost = usage.map_or(Usd::ZERO, |u| Usd::from_dollars(hold.price.cost(u)));
    let periods: Vec<String> = hold.limits.iter().map(|l| l.period.clone()).collect();
    let tallies = match store
        .settle_usd(&agent.id, &periods, hold.amount, cost, now)
        .await
    {
        Ok(t) => t,
        Err(e) => {
            warn!(error = %chain(&e), held = %hold.amount, cost = %cost, "cannot settle a model call's hold; its worst case stays counted");
            return;
        }
    };
    // Only the settle whose cost took `spent` across a share tells it (the store's mark
    // keeps that once): a settle past it, as most after the first are, writes nothing
    // more.
    for (tally, limit) in tallies.iter().zip(&hold.limits) {
        let before = tally.spent.saturating_sub(cost).micros();
        for percent in THRESHOLDS {
            let at = limit.limit.micros().saturating_mul(percent).div_ceil(100);
            if before < at && tally.spent.micros() >= at {
                tell(store, hooks, agent, (tally, limit.limit), percent, now).await;
            }
        }
    }
}

/// Tells BUDGET_THRESHOLD at `percent` of a period's budget, if it was not told before in
/// that period (the store's mark decides, so it is told once whoever finds it).
async fn tell(
    store: &dyn Store,
    hooks: Option<&HookEmitter>,
    agent: &Agent,
    (tally, limit): (&Tally, Usd),
    percent: u64,
    now: Timestamp,
) {
    let told = match store.mark_usd(&agent.id, &tally.period, percent, now).await {
        Ok(first) => !first,
        Err(e) => {
            warn!(error = %chain(&e), percent, period = %tally.period, "cannot mark a dollar budget's threshold; it is not told now");
            true
        }
    };
    if told {
        return;
    }
    if let Err(e) = crossed(store, hooks, agent, (tally, limit), percent, now).await {
        warn!(error = %chain(&e), percent, period = %tally.period, "cannot tell that a dollar budget's threshold was crossed");
    }
}

/// BUDGET_THRESHOLD: the event in the agent's log and the hooks on it.
async fn crossed(
    store: &dyn Store,
    hooks: Option<&HookEmitter>,
    agent: &Agent,
    (tally, limit): (&Tally, Usd),
    percent: u64,
    now: Timestamp,
) -> Result<(), EngineError> {
    let payload = json!({
        "period": tally.period,
        "percent": percent,
        "spent_usd": tally.spent,
        "budget_usd": limit,
        "resets": resets(agent, &tally.period, now),
    });
    told(
        store,
        hooks,
        agent,
        HookType::BUDGET_THRESHOLD,
        &[
            "usd",
            agent.id.as_str(),
            &tally.period,
            &percent.to_string(),
        ],
        payload,
        now,
    )
    .await?;
    info!(percent, period = %tally.period, spent = %tally.spent, budget = %limit, "dollar budget threshold crossed");
    Ok(())
}

/// The line the model reads once two thirds of a budget are spent: what is left, so it
/// can be brief. `None` below two thirds, and for an agent without a dollar budget (no
/// read then).
pub async fn left_line(
    store: &dyn Store,
    agent: &Agent,
    now: Timestamp,
) -> Result<Option<String>, StoreError> {
    let limits = limits(agent, now);
    if limits.is_empty() {
        return Ok(None);
    }
    let periods: Vec<String> = limits.iter().map(|l| l.period.clone()).collect();
    let tallies = store.usd_tallies(&agent.id, &periods).await?;
    let tightest = limits
        .iter()
        .zip(&tallies)
        .filter(|(l, t)| t.spent.micros().saturating_mul(3) >= l.limit.micros().saturating_mul(2))
        .min_by_key(|(l, t)| l.limit.saturating_sub(t.committed()));
    Ok(tightest.map(|(l, t)| {
        let what = if l.period.len() == 7 {
            "this month's"
        } else {
            "today's"
        };
        format!(
            "Budget: {} of {what} {} is left for the model (it resets {}). Keep this brief.",
            l.limit.saturating_sub(t.committed()),
            l.limit,
            resets(agent, &l.period, now)
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{NewAgent, PromptCache};

    #[test]
    fn the_worst_case_prices_the_prompt_at_its_dearest_rate_and_all_of_max_tokens() {
        let sonnet = Prices::default().of("claude-sonnet-4-5").unwrap();
        let mut req = LlmRequest {
            messages: vec![ChatMessage::user("x".repeat(40_000))],
            max_tokens: 1_000,
            ..LlmRequest::default()
        };
        // 10,000 tokens, 11,000 with the margin and 64 for the message: at $3 a
        // million, and 1,000 out at $15.
        let plain = worst_case(&sonnet, &req);
        assert_eq!(plain, Usd::from_dollars((11_064.0 * 3.0 + 15_000.0) / 1e6));
        req.cache = Some(PromptCache {
            history: 1,
            ttl: CacheTtl::Hour,
        });
        let hour = worst_case(&sonnet, &req);
        assert_eq!(hour, Usd::from_dollars((11_064.0 * 6.0 + 15_000.0) / 1e6));
        // A picture counts as 1,600 tokens.
        if let ChatMessage::User { images, .. } = &mut req.messages[0] {
            images.push(crate::domain::ImageInput::Url {
                url: "https://example.com/a.png".into(),
            });
        }
        let pictured = worst_case(&sonnet, &req);
        assert_eq!(
            pictured,
            Usd::from_dollars((12_664.0 * 6.0 + 15_000.0) / 1e6)
        );
    }

    #[test]
    fn a_day_and_a_month_are_periods_of_the_agents_own_calendar() {
        let mut a = NewAgent::named("frugal")
            .create("2026-03-31T23:30:00Z".parse().unwrap())
            .unwrap()
            .0;
        assert!(limits(&a, a.created_at).is_empty());
        a.budgets.usd_day = Some(Usd::from_micros(2_000_000));
        a.budgets.usd_month = Some(Usd::from_micros(40_000_000));
        a.timezone = crate::domain::TimeZoneName::parse("Asia/Tokyo").unwrap();
        let l = limits(&a, a.created_at);
        assert_eq!(l[0].period, "2026-04-01", "already tomorrow in Tokyo");
        assert_eq!(l[1].period, "2026-04");
    }
}
