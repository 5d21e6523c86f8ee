//! Whether an agent beats on its own, and how many agents are in each state.

/// Whether an agent beats on its own, and if not why: the first that holds of paused,
/// auto-paused (its user silent too long), snoozed, else active.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AgentState {
    /// It beats on its interval.
    Active,
    /// Its user snoozed it until a time (reminders still wake it).
    Snoozed,
    /// Its user was silent longer than its auto-pause allows; it waits for them.
    AutoPaused,
    /// Its operator or user paused it.
    Paused,
}

impl AgentState {
    /// Every state, in the order pages list them.
    pub const ALL: [AgentState; 4] = [
        AgentState::Active,
        AgentState::Snoozed,
        AgentState::AutoPaused,
        AgentState::Paused,
    ];

    /// The state of an agent that is (or not) paused, auto-paused and snoozed: a pause
    /// wins over an auto-pause, which wins over a snooze.
    pub fn of(paused: bool, auto_paused: bool, snoozed: bool) -> AgentState {
        if paused {
            AgentState::Paused
        } else if auto_paused {
            AgentState::AutoPaused
        } else if snoozed {
            AgentState::Snoozed
        } else {
            AgentState::Active
        }
    }

    /// As shown: `active`, `snoozed`, `auto-paused`, `paused`.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::Active => "active",
            AgentState::Snoozed => "snoozed",
            AgentState::AutoPaused => "auto-paused",
            AgentState::Paused => "paused",
        }
    }
}

/// How many agents are in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentStates {
    /// Beating on their interval.
    pub active: usize,
    /// Snoozed.
    pub snoozed: usize,
    /// Auto-paused.
    pub auto_paused: usize,
    /// Paused.
    pub paused: usize,
}

impl AgentStates {
    /// Counts one more agent in `state`.
    pub fn add(&mut self, state: AgentState) {
        *self.of_mut(state) += 1;
    }

    /// How many are in `state`.
    pub fn of(&self, state: AgentState) -> usize {
        match state {
            AgentState::Active => self.active,
            AgentState::Snoozed => self.snoozed,
            AgentState::AutoPaused => self.auto_paused,
            AgentState::Paused => self.paused,
        }
    }

    fn of_mut(&mut self, state: AgentState) -> &mut usize {
        match state {
            AgentState::Active => &mut self.active,
            AgentState::Snoozed => &mut self.snoozed,
            AgentState::AutoPaused => &mut self.auto_paused,
            AgentState::Paused => &mut self.paused,
        }
    }

    /// All agents.
    pub fn total(&self) -> usize {
        self.active + self.snoozed + self.auto_paused + self.paused
    }
}
