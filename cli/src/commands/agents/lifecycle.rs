//! The verbs that steer an agent's life: update, pause, resume, snooze, delete.

use pulse_shared::engine::{EngineSettings, LifecycleError, Toggled};

use super::{AgentsPlan, warn_without_key};
use crate::Failure;
use crate::commands::{Ctx, store};
use crate::output::{count, outln, when};

pub(crate) fn lifecycle_failure(e: LifecycleError) -> Failure {
    match e {
        LifecycleError::Store(e) => store(e),
        other => Failure::Input(other.to_string()),
    }
}

pub(super) async fn lifecycle(plan: AgentsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let out = cx.out;
    let ops = cx.b.lifecycle(cx.clock.clone(), &EngineSettings::default());
    match plan {
        AgentsPlan::Update(agent, changes) => {
            let id = agent.id(cx.b).await?;
            let done = ops.update(&id, &changes).await.map_err(lifecycle_failure)?;
            warn_without_key(cx, &done.agent);
            let mut line = format!("updated agent {} ({})", done.agent.name, id);
            if let Some(at) = done.replanned {
                line.push_str(&format!("; its next heartbeat is due {}", when(Some(at))));
            }
            out.created(&done.agent, id.as_str(), &line);
        }
        AgentsPlan::Pause(agent) => {
            let id = agent.id(cx.b).await?;
            let line = match ops.pause(&id).await.map_err(lifecycle_failure)? {
                Toggled::Already => format!("agent {id} is paused already"),
                Toggled::Done { running: true, .. } => format!(
                    "paused agent {id}; the heartbeat running now finishes, then none until `pulse agents resume {id}` (its user's messages are still answered)"
                ),
                Toggled::Done { .. } => format!(
                    "paused agent {id}: no heartbeats until `pulse agents resume {id}` (its user's messages are still answered)"
                ),
            };
            out.done(&line);
        }
        AgentsPlan::Resume(agent) => {
            let id = agent.id(cx.b).await?;
            let line = match ops.resume(&id).await.map_err(lifecycle_failure)? {
                Toggled::Already => format!("agent {id} is not paused or snoozed"),
                Toggled::Done {
                    next_heartbeat_at, ..
                } => format!(
                    "resumed agent {id}; its next heartbeat is due {}",
                    when(next_heartbeat_at)
                ),
            };
            out.done(&line);
        }
        AgentsPlan::Snooze(agent, length) => {
            let id = agent.id(cx.b).await?;
            let until = ops.snooze(&id, length).await.map_err(lifecycle_failure)?;
            out.done(&format!(
                "snoozed agent {id} until {}: no heartbeats of its own before then (its reminders still fire); `pulse agents resume {id}` ends it sooner",
                when(Some(until))
            ));
        }
        AgentsPlan::Delete { id: agent, yes } => {
            let id = agent.id(cx.b).await?;
            let footprint = ops.delete(&id, yes).await.map_err(lifecycle_failure)?;
            let listed: Vec<String> = footprint
                .kinds()
                .into_iter()
                .map(|(n, noun)| count(n as usize, noun))
                .collect();
            if !yes {
                outln!("deleting agent {id} would remove: {}", listed.join(", "));
                return Err(Failure::Input(format!(
                    "nothing deleted; run `pulse agents delete {id} --yes` to delete it"
                )));
            }
            if out.json {
                out.json_value(&serde_json::json!({ "agent_id": id, "deleted": footprint }));
            } else {
                out.done(&format!("deleted agent {id}: {}", listed.join(", ")));
            }
        }
        _ => unreachable!("answered by execute"),
    }
    Ok(())
}
