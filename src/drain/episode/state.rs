//! An episode's decisions in one pure function: [`step`] takes the episode's [`State`], the
//! latest orders, what the shell brings ([`Probe`]: a tick of one side, or what the node
//! answered) and the time, and returns the next state and the I/O to do. The fence side's
//! rules are [`phase::step`], the drain side's [`passes::step`]; what joins them is here: the
//! drain reads where the fence stands (its first pass waits for the first fence attempt, a
//! returning node's goes ahead on a replica this episode demoted), and the window's end
//! reports the drain abandoned only while no pass has reached the node.

use tokio::time::Instant;

use super::Orders;
use super::passes::{self, Drain, Pace};
use super::phase::{self, Demotion, Phase};

/// Everything an episode decides on, kept for the whole episode (across restarts of its shell).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State {
    /// Where the fence stands.
    pub fence: Phase,
    /// Where the drain stands.
    pub drain: Drain,
    /// Whether this episode made the node a replica. Kept for the whole episode, while the
    /// fence phase starts afresh with new orders.
    pub demoted: Demoted,
    /// The flip whose `flip_to_drained` was recorded last (each flip is timed once).
    pub timed: Option<Instant>,
    pub pace: Pace,
}

impl State {
    pub fn new(pace: Pace) -> Self {
        let (fence, drain) = (Phase::default(), Drain::default());
        Self { fence, drain, demoted: Demoted::NotByUs, timed: None, pace }
    }
}

/// Whether this episode made the node a replica (`REPLICAOF`, then `ROLE` said replica).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Demoted {
    NotByUs,
    ByUs,
}

/// What the shell brings to [`step`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    Fence(phase::Probe),
    Drain(passes::Probe),
}

/// The I/O a step asks for, in order: the fence side's and the drain side's (each side runs
/// one command at a time, the two side by side, so that a slow drain delays no renewal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Fence(phase::Action),
    Drain(passes::Action),
}

/// One transition of the episode: see the module documentation.
pub fn step(state: State, orders: &Orders, probe: Probe, now: Instant) -> (State, Vec<Action>) {
    match probe {
        Probe::Fence(probe) => fence(state, orders, probe, now),
        Probe::Drain(probe) => {
            let (state, actions) = passes::step(state, orders, probe, now);
            (state, actions.into_iter().map(Action::Drain).collect())
        }
    }
}

fn fence(state: State, orders: &Orders, probe: phase::Probe, now: Instant) -> (State, Vec<Action>) {
    let demoted = match probe {
        phase::Probe::Demotion(Demotion::Done) => Demoted::ByUs,
        _ => state.demoted,
    };
    let (fence, actions) = phase::step(state.fence, orders, probe, now);
    let reached = !state.drain.unreached();
    let kept = actions.into_iter().filter(|a| !(*a == phase::Action::Abandon && reached));
    let mut actions: Vec<Action> = kept.map(Action::Fence).collect();
    let next = State { fence, demoted, ..state };
    if state.fence.tried() || !fence.tried() {
        return (next, actions);
    }
    let (next, drain) = passes::step(next, orders, passes::Probe::FenceTried, now);
    actions.extend(drain.into_iter().map(Action::Drain));
    (next, actions)
}

#[cfg(test)]
mod tests;
