//! Faults: every kind the simulator injects, the rate of each in a mix, and the dice
//! that decide — one seeded generator, so the same seed injects the same faults at the
//! same calls.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use pulse_shared::adapters::aws::faults::Fault as AwsFault;
use serde::Serialize;

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// A store call fails before it takes effect.
    StoreFails,
    /// A store call takes effect, then reports a failure (the acknowledgement is lost).
    StoreLostAck,
    /// A sessions-queue acknowledgement is lost: the message comes back after its
    /// visibility timeout although it was processed.
    QueueLostAck,
    /// A sessions-queue message becomes visible again while its first delivery still runs
    /// (its visibility timed out), so a second worker receives it.
    QueueRedelivered,
    /// A hooks-queue acknowledgement is lost.
    HookQueueLostAck,
    /// A worker dies at an await point: its future is dropped mid-task.
    WorkerKilled,
    /// The hook dispatcher dies at an await point.
    DispatcherKilled,
    /// A second sweep runs over the same minute as another.
    SweepOverlap,
    /// The model cannot be reached.
    LlmFails,
    /// The model answers 429 after the client's retries.
    LlmRateLimited,
    /// The model takes minutes to answer.
    LlmSlow,
    /// The model asks for a tool.
    LlmAsksTool,
    /// Discord answers 429 after the client's retries.
    DiscordRateLimited,
    /// Discord answers 5xx.
    DiscordFails,
    /// Discord does not answer in time.
    DiscordTimesOut,
    /// A hook receiver answers 500.
    HookFails,
    /// A hook receiver does not answer in time.
    HookTimesOut,
    /// A hook receiver answers 410 Gone.
    HookGone,
    /// A tool fails (unreachable).
    ToolFails,
    /// A tool does not answer in time.
    ToolTimesOut,
    /// A tool answers with something that is not a tool response.
    ToolMalformed,
    /// A tool's answer raises events that its subscription processes again (a cascade).
    ToolCascades,
    /// A user message arrives while the agent's heartbeat runs.
    MessageMidHeartbeat,
    /// An agent is paused (and resumed a while later).
    AgentPaused,
    /// An agent's settings are changed.
    AgentUpdated,
    /// An agent is deleted.
    AgentDeleted,
    /// An agent's model calls a tool whose policy is `ask`: the call is parked for its
    /// owner, and decided late, twice at once, or never.
    ApprovalParked,
    /// A webhook's sender sends a delivery again within minutes (its answer was lost).
    WebhookResent,
    /// A captured webhook request is sent again after the signature's tolerance.
    WebhookReplayed,
    /// A webhook's sender sends a burst of fresh deliveries, past the hourly limit.
    WebhookBurst,
    /// A Discord interaction (a user's slash command) is delivered again within minutes.
    InteractionResent,
    /// A captured interaction is sent again after the signature's tolerance.
    InteractionReplayed,
    /// The power is cut just after an acknowledgement, on the embedded store: the files
    /// the cut would leave are checked after the run (see the `power` module). Not in
    /// the default or heavy mix, which keep the store in memory: the `power` mix adds it.
    PowerCut,
}

impl Fault {
    /// Every kind, in report order.
    pub const ALL: [Fault; 33] = [
        Fault::StoreFails,
        Fault::StoreLostAck,
        Fault::QueueLostAck,
        Fault::QueueRedelivered,
        Fault::HookQueueLostAck,
        Fault::WorkerKilled,
        Fault::DispatcherKilled,
        Fault::SweepOverlap,
        Fault::LlmFails,
        Fault::LlmRateLimited,
        Fault::LlmSlow,
        Fault::LlmAsksTool,
        Fault::DiscordRateLimited,
        Fault::DiscordFails,
        Fault::DiscordTimesOut,
        Fault::HookFails,
        Fault::HookTimesOut,
        Fault::HookGone,
        Fault::ToolFails,
        Fault::ToolTimesOut,
        Fault::ToolMalformed,
        Fault::ToolCascades,
        Fault::MessageMidHeartbeat,
        Fault::AgentPaused,
        Fault::AgentUpdated,
        Fault::AgentDeleted,
        Fault::ApprovalParked,
        Fault::WebhookResent,
        Fault::WebhookReplayed,
        Fault::WebhookBurst,
        Fault::InteractionResent,
        Fault::InteractionReplayed,
        Fault::PowerCut,
    ];

    /// Its name in reports.
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

/// How often each fault is injected: a probability per opportunity (a store call, a
/// model request, a delivery, a minute of a worker's life...).
#[derive(Clone, Debug)]
pub struct Mix {
    rates: BTreeMap<Fault, f64>,
    /// On the AWS backend, the share of requests (per million) that meet each fault
    /// beneath the SDK: throttled, `500`, reset, answer lost.
    sdk: [u32; 4],
    /// The name it was chosen by.
    pub name: &'static str,
}

impl Mix {
    /// No faults: the engine on a calm day.
    pub fn none() -> Self {
        Self {
            rates: BTreeMap::new(),
            sdk: [0; 4],
            name: "none",
        }
    }

    /// Every kind but the power cut, at rates that make a simulated day meet each many
    /// times without the system spending it all on retries.
    pub fn default_mix() -> Self {
        use Fault::*;
        let rates = [
            (StoreFails, 0.002),
            (StoreLostAck, 0.002),
            (QueueLostAck, 0.01),
            (QueueRedelivered, 0.005),
            (HookQueueLostAck, 0.01),
            (WorkerKilled, 0.0005),
            (DispatcherKilled, 0.001),
            (SweepOverlap, 0.1),
            (LlmFails, 0.02),
            (LlmRateLimited, 0.02),
            (LlmSlow, 0.01),
            (LlmAsksTool, 0.2),
            (DiscordRateLimited, 0.03),
            (DiscordFails, 0.03),
            (DiscordTimesOut, 0.02),
            (HookFails, 0.05),
            (HookTimesOut, 0.02),
            (HookGone, 0.004),
            (ToolFails, 0.03),
            (ToolTimesOut, 0.01),
            (ToolMalformed, 0.02),
            (ToolCascades, 0.1),
            (MessageMidHeartbeat, 0.1),
            (AgentPaused, 0.3),
            (AgentUpdated, 0.3),
            (AgentDeleted, 0.1),
            (ApprovalParked, 0.5),
            (WebhookResent, 0.05),
            (WebhookReplayed, 0.01),
            (WebhookBurst, 0.005),
            (InteractionResent, 0.05),
            (InteractionReplayed, 0.02),
        ];
        Self {
            rates: rates.into_iter().collect(),
            // 3 % of requests: with four attempts a call fails about once in a million.
            sdk: [10_000, 5_000, 5_000, 10_000],
            name: "default",
        }
    }

    /// Ten times the default rates (capped at one in two).
    pub fn heavy() -> Self {
        let mut m = Self::default_mix();
        for r in m.rates.values_mut() {
            *r = (*r * 10.0).min(0.5);
        }
        // 10 % of requests: a call fails about once in ten thousand.
        m.sdk = [30_000, 20_000, 20_000, 30_000];
        m.name = "heavy";
        m
    }

    /// The default mix, with the power cut after one acknowledgement in a hundred: the
    /// store is then a recorded file (the embedded backend only).
    pub fn power() -> Self {
        let mut m = Self::default_mix();
        m.rates.insert(Fault::PowerCut, 0.01);
        m.name = "power";
        m
    }

    /// Only the given faults at the given rates, for a test that aims at one behaviour
    /// (not replayable from the command line: its name is `custom`).
    pub fn only(rates: &[(Fault, f64)]) -> Self {
        Self {
            rates: rates.iter().copied().collect(),
            sdk: [0; 4],
            name: "custom",
        }
    }

    /// The mix named `name`: `none`, `default`, `heavy` or `power`.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "none" => Some(Self::none()),
            "default" => Some(Self::default_mix()),
            "heavy" => Some(Self::heavy()),
            "power" => Some(Self::power()),
            _ => None,
        }
    }

    /// Sets the rate of `fault` (the mix is then `custom`).
    pub fn set(&mut self, fault: Fault, rate: f64) {
        self.rates.insert(fault, rate);
        self.name = "custom";
    }

    /// The rate of `fault`.
    pub fn rate(&self, fault: Fault) -> f64 {
        self.rates.get(&fault).copied().unwrap_or(0.0)
    }

    /// On the AWS backend, each fault beneath the SDK with its share of requests, per
    /// million.
    pub fn aws(&self) -> [(AwsFault, u32); 4] {
        let [t, e, r, l] = self.sdk;
        [
            (AwsFault::Throttled, t),
            (AwsFault::ServerError, e),
            (AwsFault::Reset, r),
            (AwsFault::LostAnswer, l),
        ]
    }
}

/// The simulation's randomness and its count of injected faults. One generator, drawn
/// from in the order the single-threaded run reaches each choice.
pub struct Dice {
    seed: u64,
    rng: Mutex<fastrand::Rng>,
    mix: Mix,
    injected: Mutex<BTreeMap<Fault, u64>>,
    /// While false (set-up, the final drain), nothing is injected.
    armed: std::sync::atomic::AtomicBool,
}

impl Dice {
    /// Dice from `seed` with `mix`.
    pub fn new(seed: u64, mix: Mix) -> Self {
        Self {
            seed,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            mix,
            injected: Mutex::default(),
            armed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The seed the dice were made from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Faults are injected from now on (`true`) or no more (`false`).
    pub fn arm(&self, on: bool) {
        self.armed.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether faults are being injected.
    pub fn armed(&self) -> bool {
        self.armed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether to inject `fault` at this opportunity; counts it if so.
    pub fn roll(&self, fault: Fault) -> bool {
        let rate = self.mix.rate(fault);
        if rate <= 0.0 || !self.armed() {
            return false;
        }
        let hit = self.unit() < rate;
        if hit {
            self.count(fault);
        }
        hit
    }

    fn count(&self, fault: Fault) {
        *lock(&self.injected).entry(fault).or_default() += 1;
    }

    /// A uniform number in [0, 1).
    pub fn unit(&self) -> f64 {
        lock(&self.rng).f64()
    }

    /// A uniform number in `0..n`.
    pub fn below(&self, n: u64) -> u64 {
        lock(&self.rng).u64(..n.max(1))
    }

    /// A duration in `[lo, hi)`, in whole milliseconds.
    pub fn between(&self, lo: Duration, hi: Duration) -> Duration {
        let (a, b) = (lo.as_millis() as u64, hi.as_millis() as u64);
        Duration::from_millis(a + self.below(b.saturating_sub(a).max(1)))
    }

    /// An exponentially distributed wait with mean `mean` (the gap between arrivals of a
    /// Poisson process).
    pub fn exponential(&self, mean: Duration) -> Duration {
        let u = self.unit().max(f64::MIN_POSITIVE);
        Duration::from_secs_f64(-u.ln() * mean.as_secs_f64())
    }

    /// The faults injected so far, by kind.
    pub fn injected(&self) -> BTreeMap<Fault, u64> {
        lock(&self.injected).clone()
    }

    /// The mix.
    pub fn mix(&self) -> &Mix {
        &self.mix
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_rolls_the_same_faults() {
        let roll = |seed| {
            let d = Dice::new(seed, Mix::heavy());
            d.arm(true);
            (0..1000)
                .map(|i| d.roll(Fault::ALL[i % Fault::ALL.len()]))
                .collect::<Vec<_>>()
        };
        assert_eq!(roll(1), roll(1));
        assert_ne!(roll(1), roll(2));
        let d = Dice::new(1, Mix::none());
        d.arm(true);
        assert!((0..1000).all(|_| !d.roll(Fault::StoreFails)));
        assert!(d.injected().is_empty());
    }

    #[test]
    fn every_fault_has_a_rate_in_the_power_mix_and_a_name() {
        let m = Mix::power();
        for f in Fault::ALL {
            assert!(m.rate(f) > 0.0, "{f:?}");
            assert_eq!(
                Mix::default_mix().rate(f) > 0.0,
                f != Fault::PowerCut,
                "{f:?}"
            );
            assert!(!f.name().is_empty());
        }
    }
}
