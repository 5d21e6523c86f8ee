//! Whole runs of the simulator: a seed replays byte for byte, a calm day injects nothing
//! and adds up, and the seeds that once found a violation hold.

use std::time::Duration;

use pulse_sim::{Fault, Mix, Options, Report};

fn run(agents: usize, hours: u64, seed: u64, mix: Mix) -> Report {
    split(agents, hours, seed, mix, pulse_sim::SHARD_AGENTS)
}

fn split(agents: usize, hours: u64, seed: u64, mix: Mix, shard_agents: usize) -> Report {
    pulse_sim::run(&Options {
        agents,
        duration: Duration::from_secs(hours * 3600),
        seed,
        mix,
        keep: None,
        shard_agents,
        backend: pulse_sim::SimBackend::Embedded,
    })
    .expect("the simulation runs")
}

/// The report without its wall time, the one figure that differs between runs.
fn replayable(r: &Report) -> String {
    let mut v = serde_json::to_value(r).unwrap();
    v.as_object_mut().unwrap().remove("wall_seconds");
    serde_json::to_string_pretty(&v).unwrap()
}

#[test]
fn the_same_seed_replays_the_same_run_and_another_seed_another() {
    let a = run(60, 3, 42, Mix::default_mix());
    let b = run(60, 3, 42, Mix::default_mix());
    assert!(a.passed(), "{}", a.text());
    assert!(
        a.injected.values().sum::<u64>() > 20,
        "faults were injected: {:?}",
        a.injected
    );
    assert_eq!(replayable(&a), replayable(&b), "one seed, one run");
    let c = run(60, 3, 43, Mix::default_mix());
    assert_ne!(replayable(&a), replayable(&c), "another seed, another run");
}

#[test]
fn a_calm_day_injects_nothing_and_every_figure_adds_up() {
    let r = run(100, 3, 7, Mix::none());
    assert!(r.passed(), "{}", r.text());
    assert!(r.injected.is_empty(), "{:?}", r.injected);
    let c = &r.counts;
    // Three hours and the drain (45 minutes): at most 15 heartbeats an agent at 15
    // minutes, at least 13 when each waits up to a minute for its sweep and the first
    // up to an interval.
    assert!(
        (1_300..=1_500).contains(&c.heartbeats_completed),
        "{}",
        r.text()
    );
    assert_eq!((c.heartbeats_failed, c.heartbeats_cancelled), (0, 0));
    assert!(c.actions > 0);
    assert_eq!(c.events_waiting, 0, "the drain reached every event");
    assert_eq!(c.tool_calls, c.actions, "one call per event, no retries");
    assert_eq!(c.discord_posts, c.messages, "one reply per message");
    // Replies in a channel are checked against their turn's record; replies through a
    // slash command's interaction are edits of it.
    let discord = r.invariant("discord_not_posted_after_record").unwrap();
    assert!(
        discord.checked > 0 && discord.checked < c.discord_posts,
        "channel replies were found and looked at: {} of {} posts",
        discord.checked,
        c.discord_posts
    );
    assert_eq!(c.hook_requests, c.hook_deliveries, "every delivery at once");
    assert_eq!(
        (
            c.tool_repeats,
            c.hook_repeats,
            c.discord_repeats,
            c.dead_letters
        ),
        (0, 0, 0, 0)
    );
    assert_eq!(c.queued_at_end, 0);
}

/// Found a resume that failed between its two writes leaving the agent active with its
/// heartbeat parked for good (fixed in `Lifecycle::resume`; its own test is in
/// `tests/it/lifecycle.rs`).
#[test]
fn seed_7_heavy_found_an_agent_resumed_with_its_heartbeat_still_parked() {
    let r = run(200, 6, 7, Mix::heavy());
    assert!(r.passed(), "{}", r.text());
}

/// A fleet larger than a shard runs as several deployments side by side: the report
/// sums them, and it is still one run per seed, whichever thread finished first.
#[test]
fn a_fleet_split_into_shards_adds_up_and_replays() {
    let a = split(90, 2, 11, Mix::default_mix(), 40);
    assert!(a.passed(), "{}", a.text());
    assert_eq!((a.shards, a.agents), (3, 90));
    let again = split(90, 2, 11, Mix::default_mix(), 40);
    assert_eq!(replayable(&a), replayable(&again), "one seed, one run");
    assert!(a.replay().ends_with("--shard-agents 40"), "{}", a.replay());
    assert!(
        a.text().contains("in 3 shards of at most 40 agents"),
        "{}",
        a.text()
    );

    // Calm, every shard's agents beat through the two hours and the drain: between 9
    // and 11 heartbeats each (the first up to an interval late, each up to a sweep).
    let calm = split(90, 2, 11, Mix::none(), 40);
    assert!(calm.passed(), "{}", calm.text());
    let c = &calm.counts;
    assert!(
        (90 * 9..=90 * 11).contains(&c.heartbeats_completed),
        "{}",
        calm.text()
    );
    assert_eq!(c.tool_calls, c.actions, "one call per event, no retries");
    assert_eq!(c.discord_posts, c.messages, "one reply per message");
    let once = calm.invariant("one_next_heartbeat").unwrap();
    assert_eq!(once.checked, 90, "every agent of every shard was checked");
}

/// Users who write while their agent's heartbeat runs (during its tool call or while its
/// model thinks) and a model that often wants to speak: the heartbeat yields, and no
/// thought reaches the conversation after the message.
#[test]
fn a_heartbeat_interrupted_by_its_user_does_not_speak_after_the_message() {
    let mix = Mix::only(&[(Fault::LlmAsksTool, 0.9), (Fault::MessageMidHeartbeat, 0.3)]);
    let r = run(400, 4, 5, mix);
    assert!(r.passed(), "{}", r.text());
    let silent = r.invariant("interrupted_heartbeat_silent").unwrap();
    assert!(r.injected["message_mid_heartbeat"] >= 10, "{}", r.text());
    assert!(
        r.counts.heartbeats_cancelled >= 5,
        "heartbeats yielded: {}",
        r.text()
    );
    assert!(
        silent.checked >= 5,
        "thoughts were spoken and checked: {}",
        r.text()
    );
}

/// Every event comes in as a signed request through the receiver's router. Senders that
/// send a delivery again (within the signature's tolerance) or have one replayed (past
/// it) never make a second event: the first is answered as a duplicate naming its
/// event, the second is refused.
#[test]
fn webhook_deliveries_sent_again_or_replayed_never_make_a_second_event() {
    let mix = Mix::only(&[(Fault::WebhookResent, 0.5), (Fault::WebhookReplayed, 0.5)]);
    let r = run(200, 4, 9, mix);
    assert!(r.passed(), "{}", r.text());
    let resent = r.injected["webhook_resent"];
    let replayed = r.injected["webhook_replayed"];
    assert!(resent >= 20 && replayed >= 5, "{}", r.text());
    let once = r.invariant("webhook_delivered_once").unwrap();
    // Each fresh delivery and each one sent again is a case.
    assert!(
        once.checked >= r.counts.actions + resent + replayed,
        "{}",
        r.text()
    );
    assert_eq!(
        r.counts.tool_calls, r.counts.actions,
        "one call per event: no delivery made a second one"
    );
}

/// The chatting users' messages come in as Discord slash commands through the receiver's
/// router, signed with the application's key. One delivered again (within the signature's
/// tolerance) is the same message, answered by one turn; one replayed past it is refused.
#[test]
fn slash_commands_delivered_again_or_replayed_are_answered_once() {
    let mix = Mix::only(&[
        (Fault::InteractionResent, 0.5),
        (Fault::InteractionReplayed, 0.5),
    ]);
    let r = run(400, 6, 13, mix);
    assert!(r.passed(), "{}", r.text());
    let resent = r.injected["interaction_resent"];
    let replayed = r.injected["interaction_replayed"];
    assert!(resent >= 5 && replayed >= 2, "{}", r.text());
    // Each slash command (about half the messages) and each delivery of one again is a
    // case.
    let taken = r.invariant("interaction_taken_once").unwrap();
    let slash = taken.checked - resent - replayed;
    assert!(
        slash > r.counts.messages / 4 && slash < r.counts.messages,
        "{}",
        r.text()
    );
    let answered = r.invariant("message_answered_once").unwrap();
    assert_eq!(answered.checked, r.counts.messages, "{}", r.text());
}

/// Senders now and then send a burst of fresh deliveries, past their webhook's hourly
/// limit: each is accepted while the clock hour has room, and refused with 429 and a
/// Retry-After once it has none; every one accepted reaches the tool.
#[test]
fn webhook_bursts_past_the_hourly_limit_are_refused_429_and_nothing_accepted_is_lost() {
    let mix = Mix::only(&[(Fault::WebhookBurst, 0.5)]);
    let r = run(100, 4, 17, mix);
    assert!(r.passed(), "{}", r.text());
    assert!(r.injected["webhook_burst"] >= 10, "{}", r.text());
    let limited = r.invariant("webhook_rate_limited").unwrap();
    // A case per fresh delivery: the accepted ones became actions, the rest were 429s.
    let refused = limited.checked - r.counts.actions;
    assert!(refused >= 20, "{refused} refused: {}", r.text());
    assert_eq!(r.counts.tool_calls, r.counts.actions);
}

#[test]
fn a_power_cut_after_any_acknowledgement_leaves_everything_acknowledged() {
    // The store is a file synced at every commit, recorded; after one acknowledgement in
    // two the files a cut there would leave are checked, four ways each.
    let mut mix = Mix::power();
    mix.set(Fault::PowerCut, 0.5);
    let r = run(100, 3, 5, mix);
    assert!(r.passed(), "{}", r.text());
    let cuts = r
        .invariants
        .iter()
        .find(|i| i.name == "acknowledged_survives_power_cut")
        .expect("the power-cut invariant is checked");
    let chosen = r.injected.get("power_cut").copied().unwrap_or(0);
    eprintln!(
        "{chosen} cuts chosen, {} images checked, in {:.1} s",
        cuts.checked, r.wall_seconds
    );
    assert!(chosen >= 10, "{}", r.text());
    // Each chosen point is cut at least once (everything unsynced lost).
    assert!(cuts.checked >= chosen, "{}", r.text());
    assert_eq!(cuts.violations, 0, "{}", r.text());
}
