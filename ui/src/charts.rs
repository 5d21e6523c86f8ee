//! Charts, drawn on the server as SVG: no script, no library, nothing fetched from
//! elsewhere, so they work offline under the page's Content-Security-Policy and show in
//! a screenshot as they do on screen.
//!
//! Each chart's numbers come from a data function also served as JSON
//! (`/ui/agents/{id}/charts.json`, `/ui/charts.json`), so what is drawn can be read and
//! checked by a program.

use std::collections::BTreeMap;

use jiff::civil::Date;
use jiff::{SignedDuration, Timestamp};
use maud::{Markup, PreEscaped, html};
use pulse_shared::domain::{Agent, DeliveryStatus, HeartbeatStatus, OutcomeKind, Role};
use pulse_shared::engine::{Prices, usage};
use pulse_shared::error::StoreError;
use pulse_shared::ports::Store;
use serde::Serialize;

/// Days an agent's charts cover.
pub(crate) const DAYS: usize = 14;
/// Most heartbeats, messages and deliveries read for them.
const SCAN: usize = 3_000;
/// Most memories read for them (the newest).
const MEMORY_SCAN: usize = 1_000;

/// One stacked series of a bar chart.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Series {
    pub(crate) name: &'static str,
    #[serde(skip)]
    pub(crate) color: &'static str,
    pub(crate) values: Vec<f64>,
}

/// An agent's days, oldest first: what its charts draw.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct AgentDays {
    /// The days, in the agent's time zone.
    pub(crate) days: Vec<Date>,
    /// Heartbeats by outcome: spoke, silent, skipped, failed.
    pub(crate) heartbeats: Vec<Series>,
    /// Model tokens a day (heartbeats and turns), as the daily budget counts them.
    pub(crate) tokens: Vec<f64>,
    /// Their estimated cost in US dollars (models without a price count nothing).
    pub(crate) dollars: Vec<f64>,
    /// The daily token budget, if any.
    pub(crate) budget: Option<u64>,
    /// Hook deliveries by result.
    pub(crate) deliveries: Vec<Series>,
    /// Memory: memories kept a day, and memories last recalled that day (a memory
    /// recalled on several days counts on its latest), from its newest 1,000.
    pub(crate) memory: Vec<Series>,
    /// Where a chart counts fewer than there were: a read stopped at its cap before the
    /// first day, so the days before the oldest row read are short.
    pub(crate) notes: Vec<String>,
}

/// What to say under the charts when `read` rows of `what` were read, `cap` at most,
/// the oldest at `oldest`: nothing when the read ended before the cap, or reached back
/// past `since`; else that the days before `oldest` count only part of them.
fn cut_note(
    what: &str,
    read: usize,
    cap: usize,
    oldest: Option<Timestamp>,
    since: Timestamp,
) -> Option<String> {
    let oldest = oldest.filter(|o| read >= cap && *o > since)?;
    Some(format!(
        "{what}: the newest {cap} were read, back to {}; the days before count only some",
        oldest.strftime("%Y-%m-%d %H:%M UTC")
    ))
}

/// Reads `agent`'s last [`DAYS`] days.
pub(crate) async fn agent_days(
    store: &dyn Store,
    agent: &Agent,
    now: Timestamp,
) -> Result<AgentDays, StoreError> {
    let zone = agent.timezone.zone();
    let today = now.to_zoned(zone.clone()).date();
    let days: Vec<Date> = (0..DAYS as i64)
        .rev()
        .filter_map(|back| today.checked_sub(jiff::Span::new().days(back)).ok())
        .collect();
    let since = now - SignedDuration::from_hours(24 * DAYS as i64);
    let slot = |t: Timestamp| {
        days.iter()
            .position(|d| *d == t.to_zoned(zone.clone()).date())
    };
    let zeros = || vec![0.0f64; days.len()];
    let mut notes = Vec::new();
    let (mut acted, mut nothing, mut skipped, mut failed) = (zeros(), zeros(), zeros(), zeros());
    let (mut incomplete, mut undeliverable) = (zeros(), zeros());
    // Heartbeats finished before outcomes were recorded: those that completed without a
    // skip, by day; each that spoke (its thought became a reply) counted as acted.
    let mut unrecorded = zeros();
    let heartbeats = store.list_heartbeats(&agent.id, SCAN).await?;
    notes.extend(cut_note(
        "Heartbeats",
        heartbeats.len(),
        SCAN,
        heartbeats
            .last()
            .map(|h| h.completed_at.unwrap_or(h.scheduled_at)),
        since,
    ));
    for hb in heartbeats {
        let (Some(ended), Some(i)) = (hb.completed_at, hb.completed_at.and_then(slot)) else {
            continue;
        };
        if ended < since {
            continue;
        }
        match (hb.outcome.as_ref().map(|o| o.kind), hb.status) {
            (Some(OutcomeKind::Acted), _) => acted[i] += 1.0,
            (Some(OutcomeKind::NothingToDo), _) => nothing[i] += 1.0,
            (Some(OutcomeKind::Skipped), _) => skipped[i] += 1.0,
            (Some(OutcomeKind::Incomplete), _) => incomplete[i] += 1.0,
            (Some(OutcomeKind::Undeliverable), _) => undeliverable[i] += 1.0,
            (Some(OutcomeKind::Failed), _) | (None, HeartbeatStatus::Failed) => failed[i] += 1.0,
            (None, HeartbeatStatus::Cancelled) => skipped[i] += 1.0,
            (None, _) if hb.skipped.is_some() => nothing[i] += 1.0,
            (None, _) => unrecorded[i] += 1.0,
        }
    }
    if unrecorded.iter().any(|n| *n > 0.0) {
        let messages = store.recent_messages(&agent.id, SCAN).await?;
        notes.extend(cut_note(
            "Conversation messages (the heartbeats that spoke)",
            messages.len(),
            SCAN,
            messages.last().map(|m| m.created_at),
            since,
        ));
        let mut spoke = zeros();
        for m in messages {
            if m.role == Role::Assistant
                && m.source == "heartbeat"
                && let Some(i) = slot(m.created_at)
            {
                spoke[i] += 1.0;
            }
        }
        for i in 0..days.len() {
            let did = spoke[i].min(unrecorded[i]);
            acted[i] += did;
            nothing[i] += unrecorded[i] - did;
        }
    }
    // Tokens from the ledger the daily budget counts; dollars from the usage by model.
    let (mut tokens, mut dollars) = (zeros(), zeros());
    for (i, day) in days.iter().enumerate() {
        tokens[i] = store
            .spend_of_day(&agent.id, *day)
            .await?
            .iter()
            .map(|s| s.tokens as f64)
            .fold(0.0, |a, b| a + b);
    }
    for row in usage(store, agent, since, &Prices::default()).await?.models {
        if let Some(i) = days.iter().position(|d| *d == row.day) {
            dollars[i] += row.cost_usd.unwrap_or(0.0);
        }
    }
    let mut by_result: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    for hook in store.list_hooks(&agent.id).await? {
        let deliveries = store.list_deliveries(&hook.id, SCAN).await?;
        notes.extend(cut_note(
            &format!("Deliveries of hook {}", hook.id),
            deliveries.len(),
            SCAN,
            deliveries.last().map(|d| d.created_at),
            since,
        ));
        for del in deliveries {
            if let Some(i) = slot(del.created_at) {
                let result = match del.status {
                    DeliveryStatus::Succeeded => "delivered",
                    DeliveryStatus::Pending => "retrying",
                    DeliveryStatus::Exhausted | DeliveryStatus::Cancelled => "failed",
                };
                by_result.entry(result).or_insert_with(zeros)[i] += 1.0;
            }
        }
    }
    let (mut kept, mut recalled) = (zeros(), zeros());
    let memories = store.memories(&agent.id, MEMORY_SCAN).await?;
    notes.extend(cut_note(
        "Memories",
        memories.len(),
        MEMORY_SCAN,
        memories.last().map(|m| m.created_at),
        since,
    ));
    for m in memories {
        if let Some(i) = slot(m.created_at) {
            kept[i] += 1.0;
        }
        if let Some(i) = m.recalled_at.and_then(slot) {
            recalled[i] += 1.0;
        }
    }
    let delivery = |name: &'static str, color| {
        series(
            name,
            color,
            by_result.get(name).cloned().unwrap_or_else(zeros),
        )
    };
    Ok(AgentDays {
        heartbeats: vec![
            series("acted", "#2f7d4f", acted),
            series("nothing to do", "#9bb7d4", nothing),
            series("skipped", "#d8dde3", skipped),
            series("incomplete", "#e0a030", incomplete),
            series("undeliverable", "#b04aa0", undeliverable),
            series("failed", "#c0392b", failed),
        ],
        deliveries: vec![
            delivery("delivered", "#2f7d4f"),
            delivery("retrying", "#e0a030"),
            delivery("failed", "#c0392b"),
        ],
        memory: vec![
            series("kept", "#7a5ea8", kept),
            series("recalled", "#d08a3c", recalled),
        ],
        days,
        tokens,
        dollars,
        budget: agent.budgets.daily_tokens,
        notes,
    })
}

/// One named, coloured series of a chart.
fn series(name: &'static str, color: &'static str, values: Vec<f64>) -> Series {
    Series {
        name,
        color,
        values,
    }
}

/// A day's short label: `11-26`.
pub(crate) fn day_label(d: &Date) -> String {
    d.strftime("%m-%d").to_string()
}

/// A stacked bar chart: one bar a label, the series stacked in order, a dashed line at
/// `line` (a budget) when given, a legend under it.
pub(crate) fn bars(
    title: &str,
    labels: &[String],
    series: &[Series],
    line: Option<(&str, f64)>,
) -> Markup {
    const W: f64 = 400.0;
    const H: f64 = 150.0;
    const LEFT: f64 = 36.0;
    const BOTTOM: f64 = 20.0;
    let n = labels.len().max(1);
    let totals: Vec<f64> = (0..n)
        .map(|i| {
            series
                .iter()
                .map(|s| s.values.get(i).copied().unwrap_or(0.0))
                .sum()
        })
        .collect();
    let top = totals
        .iter()
        .copied()
        .chain(line.map(|(_, v)| v))
        .fold(0.0f64, f64::max)
        .max(1.0);
    let plot = H - BOTTOM - 8.0;
    let y = |v: f64| 8.0 + plot - v / top * plot;
    let slot = (W - LEFT) / n as f64;
    let bar = (slot * 0.7).max(1.0);
    let mut svg = String::new();
    for (i, label) in labels.iter().enumerate() {
        let x = LEFT + slot * i as f64 + (slot - bar) / 2.0;
        let mut base = 0.0;
        for s in series {
            let v = s.values.get(i).copied().unwrap_or(0.0);
            if v > 0.0 {
                let (y0, y1) = (y(base + v), y(base));
                svg.push_str(&format!(
                    r#"<rect x="{x:.1}" y="{y0:.1}" width="{bar:.1}" height="{:.1}" fill="{}"><title>{}: {} {}</title></rect>"#,
                    (y1 - y0).max(0.5),
                    s.color,
                    escape(label),
                    fmt(v),
                    s.name
                ));
            }
            base += v;
        }
        // Every other day, ending on the newest.
        if (n - 1 - i).is_multiple_of(2) || n <= 8 {
            svg.push_str(&format!(
                r#"<text x="{:.1}" y="{:.1}" class="tick" text-anchor="middle">{}</text>"#,
                x + bar / 2.0,
                H - 5.0,
                escape(label)
            ));
        }
    }
    if let Some((name, v)) = line {
        svg.push_str(&format!(
            r#"<line x1="{LEFT}" x2="{W}" y1="{0:.1}" y2="{0:.1}" class="budget"/><text x="{W}" y="{1:.1}" class="tick" text-anchor="end">{2} {3}</text>"#,
            y(v),
            y(v) - 3.0,
            escape(name),
            fmt(v)
        ));
    }
    svg.push_str(&format!(
        r#"<line x1="{LEFT}" x2="{LEFT}" y1="8" y2="{0:.1}" class="axis"/><line x1="{LEFT}" x2="{W}" y1="{0:.1}" y2="{0:.1}" class="axis"/><text x="{1:.1}" y="12" class="tick" text-anchor="end">{2}</text><text x="{1:.1}" y="{0:.1}" class="tick" text-anchor="end">0</text>"#,
        y(0.0),
        LEFT - 4.0,
        fmt(top)
    ));
    html! {
        figure.chart {
            figcaption { (title) }
            svg viewBox={"0 0 " (W) " " (H)} role="img" aria-label=(title) { (PreEscaped(svg)) }
            p.legend {
                @for s in series {
                    span {
                        // A presentation attribute, not an inline style: the page's policy
                        // allows no inline styles.
                        svg.swatch viewBox="0 0 10 10" aria-hidden="true" { rect width="10" height="10" rx="2" fill=(s.color) {} }
                        // Folded from +0: an empty f64 sum is -0, which reads "-0".
                        (s.name) " " (fmt(s.values.iter().fold(0.0, |a, b| a + b)))
                    }
                    " "
                }
            }
        }
    }
}

fn fmt(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else if v < 1.0 {
        format!("{v:.4}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An agent's charts: heartbeats by outcome, tokens against the budget (with dollars),
/// hook deliveries by result.
pub(crate) fn agent_charts(days: &AgentDays) -> Markup {
    let labels: Vec<String> = days.days.iter().map(day_label).collect();
    let tokens = [Series {
        name: "tokens",
        color: "#4a6fa5",
        values: days.tokens.clone(),
    }];
    let dollars: f64 = days.dollars.iter().sum();
    let budget = days.budget.map(|b| ("budget", b as f64));
    html! {
        div.charts {
            (bars(&format!("Heartbeats a day, last {DAYS} days"), &labels, &days.heartbeats, None))
            (bars(&format!("Tokens a day (about ${dollars:.2} in {DAYS} days)"), &labels, &tokens, budget))
            (bars("Hook deliveries a day", &labels, &days.deliveries, None))
            (bars("Memories kept and recalled a day", &labels, &days.memory, None))
        }
        @for n in &days.notes { p.muted.note { (n) } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_chart_stacks_its_series_and_draws_the_budget() {
        let labels: Vec<String> = vec!["11-25".into(), "11-26".into()];
        let series = [
            Series {
                name: "spoke",
                color: "#000",
                values: vec![1.0, 2.0],
            },
            Series {
                name: "failed",
                color: "#f00",
                values: vec![0.0, 1.0],
            },
        ];
        let svg = bars("Heartbeats", &labels, &series, Some(("budget", 5.0))).into_string();
        assert_eq!(svg.matches("<rect x=").count(), 3, "a zero draws no bar");
        assert!(svg.contains("11-26: 1 failed"));
        assert!(svg.contains("class=\"budget\"") && svg.contains("budget 5"));
        assert!(svg.contains("spoke 3") && svg.contains("failed 1"), "{svg}");
    }

    #[test]
    fn a_read_cut_at_its_cap_before_the_first_day_is_said() {
        let since = Timestamp::from_second(1_800_000_000).unwrap();
        let later = since + SignedDuration::from_hours(30);
        let earlier = since - SignedDuration::from_hours(1);
        assert_eq!(
            cut_note("Heartbeats", 10, 3_000, Some(later), since),
            None,
            "all read"
        );
        assert_eq!(
            cut_note("Heartbeats", 3_000, 3_000, Some(earlier), since),
            None,
            "read back past the first day"
        );
        let note = cut_note("Heartbeats", 3_000, 3_000, Some(later), since).unwrap();
        assert!(
            note.starts_with("Heartbeats: the newest 3000 were read, back to 2027-01-16 14:00 UTC"),
            "{note}"
        );
    }

    #[test]
    fn days_of_nothing_total_zero_not_minus_zero() {
        let labels: Vec<String> = vec!["11-25".into(), "11-26".into()];
        // What summing nothing gives in f64: -0.
        let nothing: f64 = std::iter::empty::<f64>().sum();
        let series = [Series {
            name: "tokens",
            color: "#000",
            values: vec![nothing, nothing],
        }];
        let svg = bars("Tokens", &labels, &series, None).into_string();
        assert!(svg.contains("tokens 0") && !svg.contains("-0"), "{svg}");
    }
}
