//! Agents as files: a directory planned and applied against the store, on both backends —
//! created once, a second apply a no-op, an edit one change that reaches the next
//! heartbeat's prompt, a renamed schedule removed only with `prune`, an edit made
//! elsewhere seen as drift, and an export that applies as a no-op.

use std::path::Path;

use pulse_shared::agent_dir::{self, AgentDir, Plan, ScheduleChange, Verb};
use pulse_shared::domain::{Agent, AgentChanges, ScheduleRule, TimeZoneName};
use pulse_tests::fake_llm::Scripted;
use pulse_tests::{Kind, on_both_backends};

use crate::lifecycle::{World, world};

fn write(dir: &Path, files: &[(&str, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

/// Writes what an export made.
fn write_files(dir: &Path, files: &[(&str, String)]) {
    let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
    write(dir, &files);
}

async fn plan(w: &World, dir: &Path, prune: bool) -> Plan {
    let read = AgentDir::read(dir).unwrap();
    agent_dir::plan(
        w.b.store.as_ref(),
        &[read],
        &agent_dir::PlanOptions::new(prune),
        w.b.now(),
    )
    .await
    .unwrap()
}

/// Plans `dirs`, the variables the files name read from `env`.
async fn plan_in(
    w: &World,
    dirs: &[&Path],
    prune: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Plan, agent_dir::PlanError> {
    let options = agent_dir::PlanOptions {
        env,
        ..agent_dir::PlanOptions::new(prune)
    };
    let read: Vec<AgentDir> = dirs.iter().map(|d| AgentDir::read(d).unwrap()).collect();
    agent_dir::plan(w.b.store.as_ref(), &read, &options, w.b.now()).await
}

async fn apply(w: &World, plan: &Plan, source: &str) -> agent_dir::Applied {
    agent_dir::apply(
        &w.b.store,
        &w.ops,
        plan,
        &agent_dir::ApplyOptions::new(Some(source)),
        w.b.now(),
    )
    .await
    .unwrap()
}

/// The APPLIED events in the agent's log: what each said changed, and its source.
async fn applied_events(w: &World, agent: &Agent) -> Vec<(Vec<String>, String)> {
    let mut events = w.b.store.list_events(&agent.id, 100).await.unwrap();
    events.sort_by(|a, b| a.id.cmp(&b.id));
    events
        .iter()
        .filter(|e| e.event_type.as_str() == agent_dir::APPLIED)
        .map(|e| {
            let changed = e.payload["changed"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap().to_owned())
                .collect();
            (changed, e.payload["source"].as_str().unwrap().to_owned())
        })
        .collect()
}

const AGENT: &str = r#"name = "gardener"
interval = "1h"
think = "always"

[discord]
channel = "4242"
"#;
const SCHEDULES: &str = r#"[[schedule]]
name = "water"
cron = "0 7 * * *"
note = "water the tomatoes"
"#;

on_both_backends!(
    a_directory_is_applied_once_and_an_edit_is_one_change_that_reaches_the_next_heartbeat,
    applied_once
);
async fn applied_once(kind: Kind) {
    let w = world(kind).await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("gardener");
    write(
        &dir,
        &[
            ("agent.toml", AGENT),
            ("SOUL.md", "You are the gardener.\n"),
            ("HEARTBEAT.md", "Look at the beds.\n"),
            ("schedules.toml", SCHEDULES),
        ],
    );
    let first = plan(&w, &dir, false).await;
    let p = &first.agents[0];
    assert_eq!((p.verb, p.name.as_str()), (Verb::Create, "gardener"));
    let field = |p: &agent_dir::AgentPlan, f: &str| {
        p.fields
            .iter()
            .find(|c| c.field == f)
            .map(|c| (c.before.clone(), c.after.clone()))
    };
    assert_eq!(field(p, "interval"), Some((None, Some("1h".into()))));
    assert_eq!(
        field(p, "SOUL.md"),
        Some((None, Some("21 characters".into()))),
        "texts by their size"
    );
    assert_eq!(
        field(p, "discord.channel"),
        Some((None, Some("4242".into())))
    );
    assert_eq!(
        p.schedules,
        [ScheduleChange::Create {
            name: "water".into(),
            rule: "cron 0 7 * * * (UTC), note \"water the tomatoes\"".into()
        }]
    );
    assert_eq!(p.sizes.len(), 2);
    let done = apply(&w, &first, "commit a1").await;
    assert_eq!(done.created.len(), 1);
    let agent =
        w.b.store
            .get_agent(&done.created[0])
            .await
            .unwrap()
            .unwrap();
    assert_eq!(agent.persona.as_deref(), Some("You are the gardener."));
    assert_eq!(agent.instructions.as_deref(), Some("Look at the beds."));
    let schedules = w.ops.schedules(&agent.id).await.unwrap();
    assert_eq!(schedules.len(), 1);
    assert_eq!(schedules[0].name.as_deref(), Some("water"));

    // The same files again: nothing to do, nothing written, no event.
    let again = plan(&w, &dir, false).await;
    assert_eq!((again.agents[0].verb, again.changes()), (Verb::Same, 0));
    let done = apply(&w, &again, "commit a1").await;
    assert_eq!(
        (done.same, done.created.len(), done.changed.len()),
        (1, 0, 0)
    );
    assert_eq!(
        w.ops.schedules(&agent.id).await.unwrap()[0].id,
        schedules[0].id
    );

    // An edited HEARTBEAT.md is one change, and the next heartbeat works from it.
    write(
        &dir,
        &[("HEARTBEAT.md", "Look at the beds and the greenhouse.\n")],
    );
    let edit = plan(&w, &dir, false).await;
    assert_eq!(edit.changes(), 1);
    assert_eq!(
        edit.agents[0].fields[0],
        agent_dir::FieldChange {
            field: "HEARTBEAT.md".into(),
            before: Some("17 characters".into()),
            after: Some("36 characters".into()),
        }
    );
    let done = apply(&w, &edit, "commit b2").await;
    assert_eq!(done.changed.len(), 1);
    assert_eq!(done.changed[0], agent.id);
    // One event a write: the create's and the edit's, none for the apply that did
    // nothing.
    let events = applied_events(&w, &agent).await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].1, "commit a1");
    for f in ["SOUL.md", "HEARTBEAT.md", "interval", "schedule water made"] {
        assert!(
            events[0].0.iter().any(|c| c == f),
            "{f} in {:?}",
            events[0].0
        );
    }
    assert_eq!(
        events[1],
        (vec!["HEARTBEAT.md".to_owned()], "commit b2".to_owned())
    );
    // A minute on, past the settle time events wait out before a heartbeat reads them.
    w.b.advance(jiff::SignedDuration::from_mins(1));
    w.llm.script([Scripted::text("The greenhouse is warm.")]);
    assert_eq!(w.beat().await, 1);
    let prompt = w.llm.requests().last().unwrap().body.to_string();
    assert!(
        prompt.contains("Look at the beds and the greenhouse."),
        "{prompt}"
    );
    assert!(prompt.contains("You are the gardener."), "{prompt}");
    assert!(
        prompt.contains("APPLIED"),
        "the heartbeat reads what apply changed: {prompt}"
    );
}

on_both_backends!(
    a_renamed_schedule_is_removed_only_with_prune_and_an_edit_elsewhere_is_drift,
    prune_and_drift
);
async fn prune_and_drift(kind: Kind) {
    let w = world(kind).await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("gardener");
    write(
        &dir,
        &[("agent.toml", AGENT), ("schedules.toml", SCHEDULES)],
    );
    let first = plan(&w, &dir, false).await;
    let id = apply(&w, &first, "a1").await.created[0].clone();

    // Renamed: the new one is made; the old one stays unless pruned.
    write(
        &dir,
        &[(
            "schedules.toml",
            &SCHEDULES.replace("\"water\"", "\"watering\""),
        )],
    );
    let kept = plan(&w, &dir, false).await;
    let old = w.ops.schedules(&id).await.unwrap()[0].id.clone();
    assert_eq!(
        kept.agents[0].schedules,
        [
            ScheduleChange::Remove {
                name: "water".into(),
                id: old.clone(),
                rule: "cron 0 7 * * * (UTC), note \"water the tomatoes\"".into(),
                pruned: false,
            },
            ScheduleChange::Create {
                name: "watering".into(),
                rule: "cron 0 7 * * * (UTC), note \"water the tomatoes\"".into(),
            },
        ]
    );
    assert_eq!(kept.changes(), 1, "a schedule kept is no write");
    let pruned = plan(&w, &dir, true).await;
    assert_eq!(pruned.changes(), 2);
    apply(&w, &pruned, "b2").await;
    let names: Vec<Option<String>> = w
        .ops
        .schedules(&id)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, [Some("watering".to_owned())]);

    // An edit made elsewhere (the dashboard, the CLI) is a difference the plan shows.
    let edit = AgentChanges {
        interval: Some("2h".parse().unwrap()),
        ..AgentChanges::default()
    };
    w.ops.update(&id, &edit).await.unwrap();
    let drift = plan(&w, &dir, false).await;
    assert_eq!(drift.agents[0].verb, Verb::Change);
    assert_eq!(
        drift.agents[0].fields,
        [agent_dir::FieldChange {
            field: "interval".into(),
            before: Some("2h".into()),
            after: Some("1h".into()),
        }]
    );
}

on_both_backends!(
    an_agent_made_with_the_cli_exported_to_files_applies_as_a_no_op,
    export_round_trip
);
async fn export_round_trip(kind: Kind) {
    let w = world(kind).await;
    let mut new = pulse_shared::domain::NewAgent::named("exported");
    new.interval = "45m".parse().unwrap();
    new.persona = Some("You are careful.\n\nYou keep lists.".into());
    new.instructions = Some("## Inbox (every 4h)\nRead it.".into());
    new.timezone = TimeZoneName::parse("Europe/Paris").unwrap();
    new.active_hours = Some("08:00-21:30".parse().unwrap());
    new.budgets.usd_day = Some(pulse_shared::domain::Usd::from_dollars(1.25));
    new.discord.users = vec!["123".into(), "456".into()];
    let (agent, first) = new.create(w.b.now()).unwrap();
    w.b.store.create_agent(&agent, &first).await.unwrap();
    let paris = TimeZoneName::parse("Europe/Paris").unwrap();
    // A schedule made without a name is written under its id.
    let made = w
        .ops
        .schedule(
            &agent.id,
            ScheduleRule::cron("30 8 * * MON", paris).unwrap(),
            Some("week ahead".into()),
        )
        .await
        .unwrap()
        .schedule;
    let utc = ScheduleRule::cron("0 12 * * *", TimeZoneName::utc()).unwrap();
    w.ops.schedule(&agent.id, utc, None).await.unwrap();
    let agent = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    let schedules = w.ops.schedules(&agent.id).await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("exported");
    let own = agent_dir::Owned {
        schedules,
        ..agent_dir::Owned::default()
    };
    let files = AgentDir::of(&agent, &own, &dir).files();
    write_files(&dir, &files);
    let toml = std::fs::read_to_string(dir.join("schedules.toml")).unwrap();
    assert!(toml.contains(&format!("name = \"{}\"", made.id)), "{toml}");
    assert!(
        !toml.contains("Europe/Paris"),
        "the agent's zone is left implied: {toml}"
    );
    assert!(toml.contains("timezone = \"UTC\""), "{toml}");
    let p = plan(&w, &dir, true).await;
    assert_eq!(
        (p.agents[0].verb, p.changes()),
        (Verb::Same, 0),
        "{:?}",
        p.agents[0]
    );
}

/// The schemas the book publishes accept the example directory's files and refuse a
/// misspelt key, as `apply` does.
#[test]
fn the_published_schemas_take_the_example_and_refuse_a_misspelt_key() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents/scout");
    let as_json = |text: &str| -> serde_json::Value { toml::from_str(text).unwrap() };
    for (schema, file) in [
        (agent_dir::agent_schema(), "agent.toml"),
        (agent_dir::schedules_schema(), "schedules.toml"),
        (agent_dir::hooks_schema(), "hooks.toml"),
        (agent_dir::webhooks_schema(), "webhooks.toml"),
        (agent_dir::tools_schema(), "tools.toml"),
    ] {
        let validator = jsonschema::validator_for(&schema).unwrap();
        let text = std::fs::read_to_string(example.join(file)).unwrap();
        let doc = as_json(&text);
        let errors: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{file}: {errors:?}");
        // The directory reads as apply reads it.
        AgentDir::read(&example).unwrap();
        let misspelt = as_json(&text.replacen("\nname =", "\nnmae =", 1));
        assert!(!validator.is_valid(&misspelt), "{file} with a misspelt key");
    }
}

const HOOKS: &str = r#"[[hook]]
name = "ci"
types = ["AFTER_HEARTBEAT", "HEARTBEAT_INCOMPLETE"]
url = "https://hooks.example.com/pulse"
auth_header_env = "CI_HOOK_AUTH"
description = "the CI's receiver"
"#;

on_both_backends!(
    hooks_in_files_are_made_once_with_one_secret_shown_once_and_no_secret_in_a_plan_or_an_export,
    hooks_in_files
);
async fn hooks_in_files(kind: Kind) {
    let w = world(kind).await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("gardener");
    write(&dir, &[("agent.toml", AGENT), ("hooks.toml", HOOKS)]);
    let header = std::cell::RefCell::new("Bearer first-token".to_owned());
    let env = |var: &str| (var == "CI_HOOK_AUTH").then(|| header.borrow().clone());
    let first = plan_in(&w, &[&dir], false, &env).await.unwrap();
    let hooks = &first.agents[0].hooks;
    assert_eq!(hooks.len(), 2, "one hook per type: {hooks:?}");
    let shown = serde_json::to_string(&first).unwrap();
    assert!(
        !shown.contains("first-token"),
        "no header in a plan: {shown}"
    );
    let done = apply(&w, &first, "a1").await;
    assert_eq!(
        done.secrets.len(),
        1,
        "one secret for the two: {:?}",
        done.secrets
    );
    let secret = done.secrets[0].secret.clone();
    assert!(secret.starts_with("whsec_"), "{secret}");
    let id = done.created[0].clone();
    let stored = w.b.store.list_hooks(&id).await.unwrap();
    assert_eq!(stored.len(), 2);
    for h in &stored {
        assert_eq!(h.name.as_deref(), Some("ci"));
        assert_eq!(h.secret.expose(), secret, "signed with the secret shown");
        assert_eq!(
            h.auth_header.as_ref().map(|a| a.expose()),
            Some("Bearer first-token")
        );
    }
    assert_eq!(
        plan_in(&w, &[&dir], false, &env).await.unwrap().changes(),
        0,
        "applied twice: nothing"
    );

    // A new header value is a change, shown hidden.
    *header.borrow_mut() = "Bearer second-token".to_owned();
    let rotated = plan_in(&w, &[&dir], false, &env).await.unwrap();
    assert_eq!(rotated.changes(), 2);
    let shown = serde_json::to_string(&rotated).unwrap();
    assert!(!shown.contains("-token"), "{shown}");
    assert!(shown.contains("*** (another value)"), "{shown}");
    apply(&w, &rotated, "b2").await;
    let again = w.b.store.list_hooks(&id).await.unwrap();
    assert!(
        again.iter().all(|h| h.secret.expose() == secret),
        "the secret is kept"
    );
    assert!(
        again
            .iter()
            .all(|h| h.auth_header.as_ref().unwrap().expose() == "Bearer second-token")
    );

    // One type left out: kept unless pruned.
    write(
        &dir,
        &[(
            "hooks.toml",
            &HOOKS.replace(", \"HEARTBEAT_INCOMPLETE\"", ""),
        )],
    );
    let kept = plan_in(&w, &[&dir], false, &env).await.unwrap();
    assert_eq!(kept.changes(), 0);
    assert!(matches!(
        &kept.agents[0].hooks[..],
        [agent_dir::HookChange::Remove { pruned: false, hook_type, .. }] if hook_type == "HEARTBEAT_INCOMPLETE"
    ));
    let pruned = plan_in(&w, &[&dir], true, &env).await.unwrap();
    apply(&w, &pruned, "c3").await;
    assert_eq!(w.b.store.list_hooks(&id).await.unwrap().len(), 1);

    // Exported, the header is named by a variable, never written.
    let agent = w.b.store.get_agent(&id).await.unwrap().unwrap();
    let hooks = w.b.store.list_hooks(&id).await.unwrap();
    let own = agent_dir::Owned {
        hooks,
        ..agent_dir::Owned::default()
    };
    let files = AgentDir::of(&agent, &own, &dir).files();
    let text: String = files.iter().map(|(_, t)| t.as_str()).collect();
    assert!(
        !text.contains("-token") && !text.contains(&secret),
        "{text}"
    );
    assert!(
        text.contains("auth_header_env = \"PULSE_HOOK_AUTH_CI\""),
        "{text}"
    );
}

const WEBHOOKS: &str = r#"[[webhook]]
name = "github"
scheme = "github"
types = ["push"]
secret_env = "GITHUB_WEBHOOK_SECRET"

[[webhook]]
name = "alerts"
rate_limit = "10/h"
wake = true
"#;

on_both_backends!(
    webhooks_in_files_keep_their_url_when_changed_and_their_secret_is_shown_once,
    webhooks_in_files
);
async fn webhooks_in_files(kind: Kind) {
    let w = world(kind).await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("gardener");
    write(&dir, &[("agent.toml", AGENT), ("webhooks.toml", WEBHOOKS)]);
    let env = |var: &str| (var == "GITHUB_WEBHOOK_SECRET").then(|| "gh-made-secret-1".to_owned());
    // Without the sender's secret, the webhook is not made.
    let refused = plan_in(&w, &[&dir], false, &|_| None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("secret_env names GITHUB_WEBHOOK_SECRET, which is not set"),
        "{refused}"
    );
    let first = plan_in(&w, &[&dir], false, &env).await.unwrap();
    assert_eq!(
        first.agents[0].webhooks,
        [
            agent_dir::WebhookChange::Create {
                name: "github".into(),
                scheme: "github".into()
            },
            agent_dir::WebhookChange::Create {
                name: "alerts".into(),
                scheme: "pulse".into()
            },
        ]
    );
    let applied = agent_dir::apply(
        &w.b.store,
        &w.ops,
        &first,
        &agent_dir::ApplyOptions {
            source: None,
            env: &env,
            memories: None,
            mcp: None,
        },
        w.b.now(),
    )
    .await
    .unwrap();
    let made = &applied.webhooks;
    assert_eq!(made.len(), 2);
    assert_eq!(
        made[0].secret, None,
        "the sender's own secret is not shown back"
    );
    let shown = made[1].secret.clone().expect("a made secret is shown once");
    let stored = |id: &pulse_shared::domain::WebhookId| {
        let store = w.b.store.clone();
        let id = id.clone();
        async move { store.get_webhook(&id).await.unwrap().unwrap() }
    };
    let github = stored(&made[0].id).await;
    assert_eq!(github.secrets[0].secret.expose(), "gh-made-secret-1");
    assert_eq!(github.name.as_deref(), Some("github"));
    let alerts = stored(&made[1].id).await;
    assert_eq!(alerts.secrets[0].secret.expose(), shown);
    assert!(alerts.wake);
    assert_eq!(
        plan_in(&w, &[&dir], false, &env).await.unwrap().changes(),
        0,
        "applied twice: nothing"
    );
    // The sender's secret is read once, when its webhook is made: later plans need not
    // have it.
    let later = plan_in(&w, &[&dir], false, &|_| None).await.unwrap();
    assert_eq!(later.changes(), 0);

    // A new limit is changed in place: the URL (its id) and the secret stay.
    write(
        &dir,
        &[("webhooks.toml", &WEBHOOKS.replace("10/h", "20/h"))],
    );
    let limit = plan_in(&w, &[&dir], false, &env).await.unwrap();
    assert_eq!(
        limit.agents[0].webhooks,
        [agent_dir::WebhookChange::Change {
            name: "alerts".into(),
            id: made[1].id.clone(),
            fields: vec![agent_dir::FieldChange {
                field: "rate_limit".into(),
                before: Some("10/h".into()),
                after: Some("20/h".into()),
            }],
        }]
    );
    apply(&w, &limit, "b2").await;
    let alerts = stored(&made[1].id).await;
    assert_eq!(alerts.secrets[0].secret.expose(), shown);
    assert_eq!(alerts.rate_limit.unwrap().to_string(), "20/h");

    // A scheme does not change in place.
    write(
        &dir,
        &[(
            "webhooks.toml",
            &WEBHOOKS.replace("\"github\"\ntypes", "\"stripe\"\ntypes"),
        )],
    );
    let refused = plan_in(&w, &[&dir], false, &env)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("a scheme does not change in place"),
        "{refused}"
    );

    // Exported: no secret, the scheme kept.
    let agent =
        w.b.store
            .get_agent(&applied.created[0])
            .await
            .unwrap()
            .unwrap();
    let own = agent_dir::Owned::of(w.b.store.as_ref(), &agent.id)
        .await
        .unwrap();
    let text: String = AgentDir::of(&agent, &own, &dir)
        .files()
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    assert!(
        !text.contains("gh-made-secret-1") && !text.contains(&shown),
        "{text}"
    );
    assert!(text.contains("scheme = \"github\""), "{text}");
    assert!(text.contains("rate_limit = \"20/h\""), "{text}");
}

on_both_backends!(
    seed_memories_are_given_once_and_not_again_once_forgotten,
    seed_memories
);
async fn seed_memories(kind: Kind) {
    let w = world(kind).await;
    let book =
        w.b.connected()
            .memories(&pulse_tests::fake_services(&w.llm, &w.discord));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("gardener");
    let seeds = "# What the gardener knows\n\n- Ana grows tomatoes on the balcony.\n- Ana is away in August.\n* Ana is away in August.\n";
    write(&dir, &[("agent.toml", AGENT), ("memories.md", seeds)]);
    let apply_seeds = |plan: Plan| {
        let book = book.clone();
        let store = w.b.store.clone();
        let now = w.b.now();
        let ops = &w.ops;
        async move {
            let options = agent_dir::ApplyOptions {
                source: Some("seeds"),
                env: &|_: &str| None,
                memories: Some(&book),
                mcp: None,
            };
            agent_dir::apply(&store, ops, &plan, &options, now)
                .await
                .unwrap()
        }
    };
    let first = plan(&w, &dir, false).await;
    assert_eq!(
        first.agents[0].memories,
        [
            "Ana grows tomatoes on the balcony.",
            "Ana is away in August."
        ],
        "one a line, a repeated one once"
    );
    let id = apply_seeds(first).await.created[0].clone();
    let kept = w.b.store.all_memories(&id).await.unwrap();
    assert_eq!(kept.len(), 2);
    assert!(
        kept.iter()
            .all(|m| m.source == pulse_shared::domain::MemorySource::Operator)
    );
    assert_eq!(plan(&w, &dir, false).await.changes(), 0, "given once");

    // Forgotten, a seed is not given again; a new line is.
    let away = kept.iter().find(|m| m.text.contains("August")).unwrap();
    assert!(book.forget(&id, &away.id).await.unwrap());
    assert_eq!(plan(&w, &dir, false).await.changes(), 0, "not given again");
    write(
        &dir,
        &[(
            "memories.md",
            &format!("{seeds}- Ana's dog is called Miso.\n"),
        )],
    );
    let more = plan(&w, &dir, false).await;
    assert_eq!(more.agents[0].memories, ["Ana's dog is called Miso."]);
    apply_seeds(more).await;
    assert_eq!(w.b.store.all_memories(&id).await.unwrap().len(), 2);

    // Exported: the seeds still kept, one a line; applying them changes nothing.
    let agent = w.b.store.get_agent(&id).await.unwrap().unwrap();
    let own = agent_dir::Owned::of(w.b.store.as_ref(), &id).await.unwrap();
    let out = tmp.path().join("exported");
    let files = AgentDir::of(&agent, &own, &out).files();
    let memories = &files.iter().find(|(n, _)| *n == "memories.md").unwrap().1;
    assert_eq!(
        memories,
        "- Ana grows tomatoes on the balcony.\n- Ana's dog is called Miso.\n"
    );
    write_files(&out, &files);
    assert_eq!(plan(&w, &out, false).await.changes(), 0);
}

on_both_backends!(
    tools_in_files_are_owned_by_their_agent_run_on_its_events_and_keep_their_secrets_out_of_plans_and_exports,
    tools_in_files
);
async fn tools_in_files(kind: Kind) {
    let w = world(kind).await;
    let notes = pulse_tests::FakeTool::start().await;
    let cal = pulse_tests::fake_mcp::FakeMcp::start().await;
    let services = pulse_tests::fake_services(&w.llm, &w.discord);
    let agent_tools = w.b.connected().agent_tools(w.b.clock.clone(), &services);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("gardener");
    let agent_toml = "name = \"gardener\"\ninterval = \"1h\"\ntools = [\"mcp:cal\"]\n";
    let tools_toml = format!(
        r#"[[tool]]
name = "notes"
url = "{}"
config = {{ board = "garden" }}
config_env = {{ api_key = "NOTES_KEY" }}

[[mcp]]
name = "cal"
url = "{}"
headers_env = {{ Authorization = "CAL_AUTH" }}
allow = ["add"]
policy = "allow"

[[subscription]]
tool = "notes"
event = "SEEDLING"
"#,
        notes.url(),
        cal.url()
    );
    write(
        &dir,
        &[("agent.toml", agent_toml), ("tools.toml", &tools_toml)],
    );
    let vars = std::cell::RefCell::new(std::collections::HashMap::from([
        ("NOTES_KEY".to_owned(), "key-one".to_owned()),
        ("CAL_AUTH".to_owned(), "Bearer cal-one".to_owned()),
    ]));
    let env = |var: &str| vars.borrow().get(var).cloned();
    let apply_plan = |plan: Plan| {
        let (env, store, now, ops) = (&env, w.b.store.clone(), w.b.now(), &w.ops);
        let clients = agent_tools.clients();
        async move {
            let options = agent_dir::ApplyOptions {
                source: Some("tools"),
                env,
                memories: None,
                mcp: Some(clients),
            };
            agent_dir::apply(&store, ops, &plan, &options, now)
                .await
                .unwrap()
        }
    };

    // Made once: the tool, the server (listed) and the subscription; no secret shown.
    let first = plan_in(&w, &[&dir], false, &env).await.unwrap();
    let names: Vec<&str> = first.agents[0].tools.iter().map(|c| c.name()).collect();
    assert_eq!(
        names,
        ["tool notes", "mcp cal", "subscription notes SEEDLING"]
    );
    let shown = serde_json::to_string(&first).unwrap();
    assert!(
        !shown.contains("key-one") && !shown.contains("cal-one"),
        "{shown}"
    );
    let unlisted = first.agents[0].prompt_total.tokens;
    let id = apply_plan(first).await.created[0].clone();
    let registry = w.b.store.load_registry().await.unwrap();
    let tool = |name: &str| {
        registry
            .tools
            .iter()
            .find(|t| t.name.as_str() == name)
            .unwrap()
            .clone()
    };
    assert_eq!(tool("notes").owner.as_ref(), Some(&id));
    let server = tool("cal");
    let listed = server.mcp_server().unwrap();
    assert_eq!(server.owner.as_ref(), Some(&id));
    assert!(listed.listed_at.is_some() && listed.tools.iter().any(|t| t.name == "add"));
    assert_eq!(listed.headers[0].value.expose(), "Bearer cal-one");
    let agent = w.b.store.get_agent(&id).await.unwrap().unwrap();
    assert_eq!(
        agent.tools[0].server.as_str(),
        "cal",
        "given the server it declares"
    );
    let again = plan_in(&w, &[&dir], false, &env).await.unwrap();
    assert_eq!(again.changes(), 0, "applied twice: nothing");
    // Every heartbeat's prompt carries the listed tool's definition now.
    let listed_total = again.agents[0].prompt_total.tokens;
    assert!(
        listed_total > unlisted && unlisted > 500,
        "{unlisted} then {listed_total}"
    );

    // The subscription runs the tool on the agent's event, with the config's values.
    w.b.emit(&agent, "SEEDLING", serde_json::json!({"plant": "basil"}))
        .await;
    w.b.advance(jiff::SignedDuration::from_hours(1));
    w.b.sweeper(pulse_tests::settings())
        .sweep_once(w.b.now())
        .await;
    w.b.drain(&w.worker).await;
    let requests = notes.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0]["tool_config"]["api_key"], "key-one");
    assert_eq!(requests[0]["tool_config"]["board"], "garden");

    // A new secret is one change, shown hidden, and kept as given.
    vars.borrow_mut()
        .insert("NOTES_KEY".into(), "key-two".into());
    let rotated = plan_in(&w, &[&dir], false, &env).await.unwrap();
    assert_eq!(rotated.changes(), 1);
    let shown = serde_json::to_string(&rotated).unwrap();
    assert!(!shown.contains("key-"), "{shown}");
    assert!(shown.contains("*** (other values)"), "{shown}");
    apply_plan(rotated).await;
    let registry = w.b.store.load_registry().await.unwrap();
    let notes_tool = registry
        .tools
        .iter()
        .find(|t| t.name.as_str() == "notes")
        .unwrap();
    assert_eq!(notes_tool.config["api_key"], "key-two");

    // Another agent's files may not declare it, nor the deployment's tool; they may
    // subscribe to either.
    let shared = pulse_shared::domain::Tool::http(
        pulse_shared::domain::ToolName::parse("shared-sink").unwrap(),
        &notes.url(),
        std::time::Duration::from_secs(5),
        w.b.now(),
    )
    .unwrap();
    w.b.store.add_tool(&shared).await.unwrap();
    let other = tmp.path().join("weeder");
    write(
        &other,
        &[
            ("agent.toml", "name = \"weeder\"\n"),
            (
                "tools.toml",
                &format!("[[tool]]\nname = \"notes\"\nurl = \"{}\"\n", notes.url()),
            ),
        ],
    );
    let refused = plan_in(&w, &[&other], false, &env)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("owned by agent gardener's files"),
        "{refused}"
    );
    write(
        &other,
        &[(
            "tools.toml",
            &format!(
                "[[tool]]\nname = \"shared-sink\"\nurl = \"{}\"\n",
                notes.url()
            ),
        )],
    );
    let refused = plan_in(&w, &[&other], false, &env)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("the deployment's"), "{refused}");
    write(
        &other,
        &[(
            "tools.toml",
            "[[subscription]]\ntool = \"notes\"\nevent = \"WEED\"\n\n[[subscription]]\ntool = \"shared-sink\"\nevent = \"WEED\"\n",
        )],
    );
    let both = plan_in(&w, &[&other], false, &env).await.unwrap();
    let names: Vec<&str> = both.agents[0].tools.iter().map(|c| c.name()).collect();
    assert_eq!(
        names,
        ["subscription notes WEED", "subscription shared-sink WEED"]
    );
    apply_plan(both).await;

    // Exported: the secrets are named by variables, never written (a config value by
    // the variable it came from, a header by one made from its name); the other values
    // are written. Set, the export applies as a no-op.
    let own = agent_dir::Owned::of(w.b.store.as_ref(), &id).await.unwrap();
    let agent = w.b.store.get_agent(&id).await.unwrap().unwrap();
    let out = tmp.path().join("exported");
    let files = AgentDir::of(&agent, &own, &out).files();
    let text = &files.iter().find(|(n, _)| *n == "tools.toml").unwrap().1;
    assert!(
        !text.contains("key-two") && !text.contains("cal-one"),
        "{text}"
    );
    assert!(text.contains("PULSE_TOOL_CAL_AUTHORIZATION"), "{text}");
    assert!(text.contains("api_key = \"NOTES_KEY\""), "{text}");
    assert!(text.contains("board = \"garden\""), "{text}");
    write_files(&out, &files);
    {
        let mut v = vars.borrow_mut();
        v.insert(
            "PULSE_TOOL_CAL_AUTHORIZATION".into(),
            "Bearer cal-one".into(),
        );
    }
    assert_eq!(
        plan_in(&w, &[&out], false, &env).await.unwrap().changes(),
        0
    );

    // Left out of the files: kept; pruned, removed unless another agent subscribes.
    write(
        &dir,
        &[(
            "tools.toml",
            &tools_toml
                [tools_toml.find("[[mcp]]").unwrap()..tools_toml.find("[[subscription]]").unwrap()],
        )],
    );
    let kept = plan_in(&w, &[&dir], false, &env).await.unwrap();
    assert_eq!(kept.changes(), 0, "{:?}", kept.agents[0].tools);
    let refused = plan_in(&w, &[&dir], true, &env)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("tool notes") && refused.contains("a subscription"),
        "{refused}"
    );
    write(
        &other,
        &[(
            "tools.toml",
            "[[subscription]]\ntool = \"shared-sink\"\nevent = \"WEED\"\n",
        )],
    );
    apply_plan(plan_in(&w, &[&other], true, &env).await.unwrap()).await;
    let pruned = plan_in(&w, &[&dir], true, &env).await.unwrap();
    assert_eq!(pruned.changes(), 2, "{:?}", pruned.agents[0].tools);
    apply_plan(pruned).await;
    let registry = w.b.store.load_registry().await.unwrap();
    assert!(!registry.tools.iter().any(|t| t.name.as_str() == "notes"));
    assert!(registry.tools.iter().any(|t| t.name.as_str() == "cal"));
    assert!(
        !registry
            .subscriptions
            .iter()
            .any(|s| s.agent_id.as_ref() == Some(&id))
    );
}

on_both_backends!(
    a_tool_one_directory_declares_is_subscribed_to_given_and_hooked_by_another_in_one_apply,
    tools_across_directories
);
async fn tools_across_directories(kind: Kind) {
    let w = world(kind).await;
    let cal = pulse_tests::fake_mcp::FakeMcp::start().await;
    let services = pulse_tests::fake_services(&w.llm, &w.discord);
    let agent_tools = w.b.connected().agent_tools(w.b.clock.clone(), &services);
    let tmp = tempfile::tempdir().unwrap();
    let (user, maker) = (tmp.path().join("user"), tmp.path().join("maker"));
    let apply_dirs = |dirs: Vec<std::path::PathBuf>| {
        let read: Vec<AgentDir> = dirs.iter().map(|d| AgentDir::read(d).unwrap()).collect();
        let (store, now, ops) = (w.b.store.clone(), w.b.now(), &w.ops);
        let clients = agent_tools.clients();
        async move {
            let plan = agent_dir::plan(
                store.as_ref(),
                &read,
                &agent_dir::PlanOptions::new(false),
                now,
            )
            .await
            .unwrap();
            let options = agent_dir::ApplyOptions {
                mcp: Some(clients),
                ..agent_dir::ApplyOptions::new(Some("across"))
            };
            agent_dir::apply(&store, ops, &plan, &options, now)
                .await
                .unwrap()
        }
    };
    write(&user, &[("agent.toml", "name = \"user\"\n")]);
    let user_id = apply_dirs(vec![user.clone()]).await.created[0].clone();

    // The user's directory comes first, and names what the maker's declares.
    write(
        &user,
        &[
            ("agent.toml", "name = \"user\"\ntools = [\"mcp:cal\"]\n"),
            (
                "tools.toml",
                "[[subscription]]\ntool = \"ledger\"\nevent = \"SPENT\"\n",
            ),
        ],
    );
    write(
        &maker,
        &[
            ("agent.toml", "name = \"maker\"\n"),
            (
                "tools.toml",
                &format!(
                    "[[tool]]\nname = \"ledger\"\nurl = \"https://tools.example.com/ledger\"\n\n[[mcp]]\nname = \"cal\"\nurl = \"{}\"\n",
                    cal.url()
                ),
            ),
            (
                "hooks.toml",
                "[[hook]]\nname = \"books\"\ntypes = [\"AFTER_LEDGER\"]\nurl = \"https://hooks.example.com/books\"\n",
            ),
        ],
    );
    let done = apply_dirs(vec![user.clone(), maker.clone()]).await;
    assert_eq!(done.changed.len(), 1);
    assert_eq!(done.changed[0], user_id);
    let maker_id = done.created[0].clone();
    let registry = w.b.store.load_registry().await.unwrap();
    let ledger = registry
        .tools
        .iter()
        .find(|t| t.name.as_str() == "ledger")
        .unwrap();
    assert_eq!(ledger.owner.as_ref(), Some(&maker_id));
    assert!(
        registry
            .subscriptions
            .iter()
            .any(|s| { s.agent_id.as_ref() == Some(&user_id) && s.tool.as_str() == "ledger" })
    );
    let user_agent = w.b.store.get_agent(&user_id).await.unwrap().unwrap();
    assert_eq!(user_agent.tools[0].server.as_str(), "cal");
    let hooks = w.b.store.list_hooks(&maker_id).await.unwrap();
    assert_eq!(hooks[0].hook_type.as_str(), "AFTER_LEDGER");
}

/// Plans `dir` with its texts counted by `counter`.
async fn plan_counting(
    w: &World,
    dir: &Path,
    counter: Option<&pulse_shared::llm::tokens::TokenCounter>,
) -> Result<Plan, agent_dir::PlanError> {
    let options = agent_dir::PlanOptions {
        tokens: counter,
        ..agent_dir::PlanOptions::new(false)
    };
    let read = AgentDir::read(dir).unwrap();
    agent_dir::plan(w.b.store.as_ref(), &[read], &options, w.b.now()).await
}

on_both_backends!(
    a_files_tokens_are_counted_by_the_agents_model_and_over_its_budget_refused,
    counted_tokens
);
async fn counted_tokens(kind: Kind) {
    use pulse_shared::domain::{ProviderKind, Secret};
    use pulse_shared::llm::LlmConfig;
    use pulse_shared::llm::tokens::TokenCounter;
    use pulse_tests::fake_llm::FakeLlm;
    let w = world(kind).await;
    let fake = FakeLlm::start().await;
    let anthropic = LlmConfig {
        provider: ProviderKind::Anthropic,
        base_url: Some(fake.url().parse().unwrap()),
        anthropic_key: Some(Secret::new("sk-ant-counting")),
        ..LlmConfig::offline()
    };
    let counter = Some(TokenCounter::new(
        anthropic,
        pulse_egress::Egress::trusted(),
    ));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("gardener");
    let soul = "You are the gardener.";
    write(
        &dir,
        &[
            ("agent.toml", AGENT),
            ("SOUL.md", soul),
            ("HEARTBEAT.md", "Look at the beds."),
        ],
    );
    // Anthropic's model: each text counted by Anthropic, with the configured key.
    let p = plan_counting(&w, &dir, counter.as_ref()).await.unwrap();
    let a = &p.agents[0];
    let by = "Anthropic's count_tokens for claude-sonnet-4-5";
    assert_eq!(
        (a.sizes[0].file, a.sizes[0].tokens, a.sizes[0].exact),
        ("SOUL.md", soul.chars().count(), true),
        "the fake counts a token a character"
    );
    assert_eq!(a.sizes[0].counted_by, by);
    assert_eq!(a.prompt_tokens, soul.len() + "Look at the beds.".len());
    assert!(
        a.prompt_total.exact && a.prompt_total.tokens > 2_000,
        "{:?}",
        a.prompt_total
    );
    let asked = fake.requests();
    assert_eq!(asked.len(), 3, "SOUL.md, HEARTBEAT.md and the whole prompt");
    assert!(asked.iter().all(|r| r.path == "/v1/messages/count_tokens"
        && r.headers["x-api-key"] == "sk-ant-counting"
        && r.body["model"] == "claude-sonnet-4-5"));
    assert!(
        asked
            .iter()
            .any(|r| r.body["messages"][0]["content"] == soul),
        "SOUL.md as it is, one user message"
    );

    // A text within its characters but over its tokens is refused, loudly, by file.
    let long = "語".repeat(4_500);
    write(&dir, &[("SOUL.md", &long)]);
    let e = plan_counting(&w, &dir, counter.as_ref())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("SOUL.md"), "{e}");
    assert!(
        e.contains(&format!(
            "4500 tokens, counted by {by}; the budget is 4000 tokens"
        )),
        "{e}"
    );
    assert!(e.contains("nothing was applied"), "{e}");
    assert!(w.b.store.list_agents().await.unwrap().is_empty());
    // Without a count the same text is estimated, and within the characters' budget.
    let p = plan_counting(&w, &dir, None).await.unwrap();
    assert!(!p.agents[0].sizes[0].exact);
    assert_eq!(p.agents[0].sizes[0].tokens, 4_500usize.div_ceil(4) + 4);

    // The provider down: estimated, and said why, never refused for it.
    write(&dir, &[("SOUL.md", soul)]);
    fake.down(Some(500));
    let p = plan_counting(&w, &dir, counter.as_ref()).await.unwrap();
    let size = &p.agents[0].sizes[0];
    assert!(!size.exact);
    assert!(
        size.counted_by
            .starts_with("an estimate at 4 characters a token (Anthropic's count_tokens failed"),
        "{}",
        size.counted_by
    );
    // Once failed, the provider is not asked again by this counter: a plan of fifty
    // agents waits once.
    fake.down(None);
    let asked = fake.requests().len();
    let p = plan_counting(&w, &dir, counter.as_ref()).await.unwrap();
    assert!(
        p.agents[0].sizes[0]
            .counted_by
            .contains("count_tokens failed earlier in this plan"),
        "{:?}",
        p.agents[0].sizes[0]
    );
    assert_eq!(fake.requests().len(), asked);

    // An OpenAI model: counted by its own tokenizer, with no request.
    let openai = LlmConfig {
        provider: ProviderKind::OpenAi,
        model: Some("gpt-4o-mini".into()),
        ..LlmConfig::offline()
    };
    let counter = Some(TokenCounter::new(openai, pulse_egress::Egress::trusted()));
    let before = fake.requests().len();
    let p = plan_counting(&w, &dir, counter.as_ref()).await.unwrap();
    let size = &p.agents[0].sizes[0];
    assert_eq!(size.counted_by, "gpt-4o-mini's tokenizer (o200k_base)");
    assert!(
        size.exact && size.tokens > 3 && size.tokens < soul.len(),
        "{size:?}"
    );
    assert_eq!(fake.requests().len(), before);
}
