//! `pulse schedules …` (and `pulse agents schedule`): reminders beside an agent's
//! interval — a one-time wake, or a cron pattern in a time zone.

use clap::{Args, Subcommand};
use jiff::Timestamp;
use pulse_shared::domain::{
    Expectation, Must, Schedule, ScheduleId, ScheduleRule, TimeZoneName, parse_duration,
};
use pulse_shared::engine::{EngineSettings, LifecycleError};

use super::{AgentRef, Ctx, agent_ref, input, store};
use crate::Failure;
use crate::output::{short, when};

#[derive(Subcommand, Debug)]
pub(crate) enum SchedulesCmd {
    /// Wake an agent at a time, after a while, or on a cron pattern.
    Add(AddSchedule),
    /// An agent's schedules and their next wakes.
    List {
        /// The agent: its id, name or alias.
        #[arg(long)]
        agent: String,
    },
    /// Delete a schedule: it wakes the agent no more.
    Delete {
        /// The agent: its id, name or alias.
        #[arg(long)]
        agent: String,
        /// The schedule's id (`sch_…`).
        id: String,
    },
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("when").required(true).args(["at", "r#in", "cron"])))]
pub(crate) struct AddSchedule {
    /// The agent: its id, name or alias.
    #[arg(long)]
    agent: String,
    /// Once, at this time (2026-11-25T09:00:00Z, or with an offset).
    #[arg(long, value_name = "TIMESTAMP")]
    at: Option<String>,
    /// Once, this long from now (90s, 2h, 1d).
    #[arg(long = "in", id = "r#in", value_name = "DURATION")]
    r#in: Option<String>,
    /// On a cron pattern: minute hour day-of-month month day-of-week, e.g.
    /// "0 9 * * MON-FRI".
    #[arg(long, value_name = "PATTERN")]
    cron: Option<String>,
    /// The cron pattern's time zone (default: the agent's).
    #[arg(long, requires = "cron")]
    timezone: Option<String>,
    /// What it is about: given to the agent with each wake.
    #[arg(long)]
    note: Option<String>,
    /// What each heartbeat it wakes must do: speak (to its user) or act (speak, or call a
    /// tool that does something). One that does not ends `incomplete`, and after
    /// --alert-after of its runs in a row the HEARTBEAT_INCOMPLETE hook fires, once.
    #[arg(long, value_name = "speak|act")]
    expect: Option<String>,
    /// Its incomplete runs in a row before the HEARTBEAT_INCOMPLETE hook fires (1 to
    /// 100; default 3).
    #[arg(long, value_name = "N", requires = "expect")]
    alert_after: Option<u32>,
}

/// A validated schedules command.
pub(crate) enum SchedulesPlan {
    Add(AddPlan),
    List(AgentRef),
    Delete(AgentRef, ScheduleId),
}

/// A validated `schedules add`.
pub(crate) struct AddPlan {
    agent: AgentRef,
    when: When,
    note: Option<String>,
    expect: Option<Expectation>,
}

enum When {
    At(Timestamp),
    In(jiff::SignedDuration),
    Cron(String, Option<TimeZoneName>),
}

pub(crate) fn plan_add(a: AddSchedule) -> Result<AddPlan, Failure> {
    let when = match (a.at, a.r#in, a.cron) {
        (Some(at), None, None) => When::At(at.trim().parse::<Timestamp>().map_err(|e| {
            Failure::Input(format!(
                "--at {at:?}: {e}; give a time such as 2026-11-25T09:00:00Z"
            ))
        })?),
        (None, Some(d), None) => {
            let d = parse_duration("in", &d).map_err(input)?;
            if !d.is_positive() {
                return Err(Failure::Input(format!(
                    "--in {:?}: give how long from now, more than 0s (e.g. --in 90s, --in 2h)",
                    d.to_string()
                )));
            }
            When::In(d)
        }
        (None, None, Some(pattern)) => {
            let tz = a
                .timezone
                .as_deref()
                .map(TimeZoneName::parse)
                .transpose()
                .map_err(input)?;
            // Checked now, so a bad pattern is reported before anything is opened.
            ScheduleRule::cron(&pattern, tz.clone().unwrap_or_else(TimeZoneName::utc))
                .map_err(input)?;
            When::Cron(pattern, tz)
        }
        _ => {
            return Err(Failure::Input("give one of --at, --in or --cron".into()));
        }
    };
    // Checked now, as the agent's are, so a bad value is reported before anything is
    // opened.
    let expect = a
        .expect
        .as_deref()
        .map(Must::parse)
        .transpose()
        .map_err(input)?
        .map(|must| {
            Expectation {
                must,
                alert_after: a.alert_after.unwrap_or(Expectation::ALERT_AFTER),
            }
            .checked("runs")
        })
        .transpose()
        .map_err(input)?;
    Ok(AddPlan {
        agent: agent_ref(&a.agent)?,
        when,
        note: a.note,
        expect,
    })
}

pub(crate) fn plan(cmd: SchedulesCmd) -> Result<SchedulesPlan, Failure> {
    Ok(match cmd {
        SchedulesCmd::Add(a) => SchedulesPlan::Add(plan_add(a)?),
        SchedulesCmd::List { agent } => SchedulesPlan::List(agent_ref(&agent)?),
        SchedulesCmd::Delete { agent, id } => {
            SchedulesPlan::Delete(agent_ref(&agent)?, ScheduleId::parse(&id).map_err(input)?)
        }
    })
}

fn failure(e: LifecycleError) -> Failure {
    match e {
        LifecycleError::Store(e) => store(e),
        other => Failure::Input(other.to_string()),
    }
}

fn describe(rule: &ScheduleRule) -> String {
    match rule {
        ScheduleRule::Once { at } => format!("once at {}", when(Some(*at))),
        ScheduleRule::Cron { pattern, timezone } => format!("cron {pattern} ({timezone})"),
    }
}

/// What a schedule expects of the heartbeats it wakes, for its list: `speak`, `act after
/// 2` (when the count is not the default), or `-`.
fn expects(s: &Schedule) -> String {
    match s.expect {
        None => "-".to_owned(),
        Some(e) if e.alert_after == Expectation::ALERT_AFTER => e.must.as_str().to_owned(),
        Some(e) => format!("{} after {}", e.must.as_str(), e.alert_after),
    }
}

/// Makes the schedule `plan` describes.
pub(crate) async fn add(plan: AddPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let ops = cx.b.lifecycle(cx.clock.clone(), &EngineSettings::default());
    let agent = plan.agent.find(cx.b).await?;
    let now = cx.clock.now();
    let rule = match plan.when {
        When::At(at) => ScheduleRule::Once { at },
        When::In(d) => ScheduleRule::Once {
            at: now.saturating_add(d).unwrap_or(now),
        },
        When::Cron(pattern, tz) => {
            let tz = tz.unwrap_or_else(|| agent.timezone.clone());
            ScheduleRule::cron(&pattern, tz).map_err(input)?
        }
    };
    let done = ops
        .schedule_expecting(&agent.id, rule, plan.note, plan.expect)
        .await
        .map_err(failure)?;
    let s = &done.schedule;
    let mut line = format!(
        "scheduled {} for agent {}: {}; it first wakes the agent {}",
        s.id,
        agent.id,
        describe(&s.rule),
        when(s.next_at)
    );
    if done.pulled.is_some() {
        line.push_str(" (its next heartbeat is pulled forward to then)");
    }
    if let Some(e) = s.expect {
        line.push_str(&format!(
            "; each heartbeat it wakes must {} (HEARTBEAT_INCOMPLETE after {} of its runs in a row that do not)",
            e.must.as_str(),
            e.alert_after
        ));
    }
    cx.out.created(s, s.id.as_str(), &line);
    Ok(())
}

pub(crate) async fn execute(plan: SchedulesPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let ops = cx.b.lifecycle(cx.clock.clone(), &EngineSettings::default());
    match plan {
        SchedulesPlan::Add(p) => add(p, cx).await?,
        SchedulesPlan::List(agent) => {
            let agent = agent.id(cx.b).await?;
            let schedules = ops.schedules(&agent).await.map_err(failure)?;
            cx.out.table(
                &schedules,
                &["ID", "NAME", "WHEN", "NEXT WAKE", "WAKES", "EXPECT", "NOTE"],
                |s| {
                    vec![
                        s.id.to_string(),
                        s.name.clone().unwrap_or_else(|| "-".to_owned()),
                        describe(&s.rule),
                        when(s.next_at),
                        s.wakes.to_string(),
                        expects(s),
                        short(s.note.as_deref().unwrap_or("-"), 60),
                    ]
                },
            );
        }
        SchedulesPlan::Delete(agent, id) => {
            let agent = agent.id(cx.b).await?;
            if !ops.unschedule(&agent, &id).await.map_err(failure)? {
                return Err(Failure::Input(format!(
                    "agent {agent} has no schedule {id}; `pulse schedules list --agent {agent}` lists them"
                )));
            }
            crate::output::outln!("deleted schedule {id}: it wakes agent {agent} no more");
        }
    }
    Ok(())
}
