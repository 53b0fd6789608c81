//! The fence side of an episode as a phase machine (pure): [`step`] takes where the fence
//! stands, the latest orders, what the node last answered and the time, and returns the next
//! phase and the I/O for the shell ([`super::Episode`]) to do. The shell reports each answer
//! back with the next [`Probe`], on the same tick (`now` is the tick's). The episode's own
//! step ([`super::state::step`]) runs this beside the drain side's rules.
//!
//! The rules (the timeline is in [`super`]): a stop ends the episode, lifting our pause
//! unless polestar gave the promotion up (then it lapses); the end of the window ends it too;
//! a node that answers replica has nothing left to fence or demote until the orders change; a
//! confirmed promotion demotes the node (refused for a node that answered replica during the
//! current drain order and master again: Sentinel promoted it again); before `fence_until` a
//! node that answers master is paused; after it, our pause ends (`fence_over`); with no pause
//! and no drain order the episode is done. The phase leaves [`Phase::Untried`] with the first
//! fence or demotion attempt, whatever its outcome: the first drain pass waits for that.

use tokio::time::Instant;

use super::{Orders, Stop};
use crate::node::Role;
use crate::topology::Node;

/// Where the fence of one old primary stands. Kept for the whole episode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Phase {
    /// No fence or demotion has been tried yet (nor a pause set): the first drain pass waits
    /// for the first attempt, so that a client killed at the flip reconnects to a paused (or
    /// demoted) node.
    #[default]
    Untried,
    /// No pause of ours on it. `seen_replica`: it answered replica during the current drain
    /// order, so a master answer later means Sentinel promoted it again (never demoted).
    Open { seen_replica: bool },
    /// We hold a pause on it (set before the command is sent), renewed each tick.
    Fenced { seen_replica: bool },
    /// It answers replica (we demoted it, or Sentinel or another polestar did): nothing left
    /// to fence or demote until the orders change.
    Replica,
}

impl Phase {
    /// A fence or demotion has been tried.
    pub fn tried(self) -> bool {
        self != Self::Untried
    }

    fn fenced(self) -> bool {
        matches!(self, Self::Fenced { .. })
    }

    fn seen_replica(self) -> bool {
        match self {
            Self::Untried => false,
            Self::Open { seen_replica } | Self::Fenced { seen_replica } => seen_replica,
            Self::Replica => true,
        }
    }

    /// After an attempt that set no pause and found no replica.
    fn attempted(self) -> Self {
        match self {
            Self::Untried => Self::Open { seen_replica: false },
            other => other,
        }
    }

    /// Our pause is gone (lifted, lapsing, or replaced by a demotion).
    fn unfenced(self) -> Self {
        match self {
            Self::Fenced { seen_replica } => Self::Open { seen_replica },
            other => other,
        }
    }
}

/// What the shell brings to [`step`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// A new tick: the interval passed, the window ended, or the orders changed (`changed`).
    /// `returning`: the drain order is new and a returning node's (it came back claiming
    /// master: it may be demoted again).
    Tick { changed: bool, returning: bool },
    /// The `ROLE` answer of a [`Action::Fence`], whose pause is applied whatever the role
    /// (`None`: no answer, the pause may or may not be set), and the round trips it took.
    Role { role: Option<Role>, round_trips: u32 },
    /// What an [`Action::Demote`] found.
    Demotion(Demotion),
}

/// What one demotion attempt found (the shell reports and counts it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Demotion {
    /// We sent `REPLICAOF`; the node answers replica and our pause is lifted.
    Done,
    /// The node already answers replica.
    AlreadyReplica,
    /// It answered but must not be demoted (yet): the fence goes on as without demotion.
    Refused,
    /// It did not answer: retried within the window.
    Unreachable,
}

/// The I/O a step asks for, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Lift our pause now (`CLIENT UNPAUSE`): the node is a replica, or stays the primary.
    Lift(&'static str),
    /// Stop renewing our pause and let it lapse (no `UNPAUSE`: another polestar may need it).
    LeaveToLapse,
    /// The window ended: report the drain abandoned (the episode's step keeps this only while
    /// no pass of the current drain order has reached the node).
    Abandon,
    /// Our pause ends (`fence_over`): left to lapse while unconfirmed, else lifted with the
    /// clients it holds killed first.
    FenceOver(&'static str),
    /// `ROLE` and the pause in one pipeline (one round trip: Sentinel sends the chosen replica
    /// `SLAVEOF NO ONE` about 100 ms after `+selected-slave`); report the role with
    /// [`Probe::Role`].
    Fence,
    /// The fence paused a master; `first`: it was not paused by us (report the fence, and the
    /// round trips it took).
    Paused { first: bool, round_trips: u32 },
    /// The fence paused a node that is no master and that we had not fenced: lift that pause
    /// at once, silently (there was no fence of ours to report lifted).
    Unpause,
    /// Demote the node to `to` if it answers master (refused if it answered replica before),
    /// and report it with [`Probe::Demotion`]. `fenced`: our pause is on it, and the fence
    /// loop renews nothing while it waits on the demotion, so the demotion renews the pause
    /// first, for as long as it may take (a pause that lapsed before `REPLICAOF` let writes
    /// through that the demotion then lost: seen on a loaded machine).
    Demote { to: Node, seen_replica: bool, fenced: bool },
    /// Sleep until `at` before the next tick (instead of the interval).
    SleepUntil(Instant),
    /// Wake for the next tick no later than `at`.
    WakeBy(Instant),
    /// A demotion that did not answer: if it took an interval or more, try again at once.
    RetryIfSlow,
    /// The episode is over on these orders.
    End,
}

/// One transition of the fence side: see the module documentation.
pub fn step(phase: Phase, orders: &Orders, probe: Probe, now: Instant) -> (Phase, Vec<Action>) {
    match probe {
        Probe::Tick { changed, returning } => {
            tick(after_orders(phase, changed, returning), orders, now)
        }
        Probe::Role { role, round_trips } => answered(phase, orders, role, round_trips),
        Probe::Demotion(outcome) => demotion(phase, orders, outcome, now),
    }
}

/// New orders: a node that answered replica is looked at afresh; a returning node's new drain
/// order forgets that it answered replica (it came back claiming master).
fn after_orders(phase: Phase, changed: bool, returning: bool) -> Phase {
    let phase = match phase {
        Phase::Replica if changed => Phase::Open { seen_replica: true },
        other => other,
    };
    match phase {
        Phase::Open { .. } if returning => Phase::Open { seen_replica: false },
        Phase::Fenced { .. } if returning => Phase::Fenced { seen_replica: false },
        other => other,
    }
}

fn tick(phase: Phase, orders: &Orders, now: Instant) -> (Phase, Vec<Action>) {
    if let Some(stop) = orders.stop {
        let mut actions = match (phase.fenced(), stop) {
            (false, _) => vec![],
            (true, Stop::GaveUp) => vec![Action::LeaveToLapse],
            (true, stop) => vec![Action::Lift(stop.as_str())],
        };
        actions.push(Action::End);
        return (phase.unfenced(), actions);
    }
    if now >= orders.until {
        let mut actions = vec![Action::Abandon];
        if phase.fenced() {
            actions.push(Action::FenceOver("window"));
        }
        actions.push(Action::End);
        return (phase.unfenced(), actions);
    }
    if phase == Phase::Replica {
        return (phase, vec![Action::SleepUntil(orders.until)]);
    }
    if let Some(to) = &orders.demote {
        let (seen_replica, fenced) = (phase.seen_replica(), phase.fenced());
        let demote = Action::Demote { to: to.clone(), seen_replica, fenced };
        return (phase, vec![demote]);
    }
    fence(phase, orders, now)
}

/// The fence part of a tick (also after a refused demotion).
fn fence(phase: Phase, orders: &Orders, now: Instant) -> (Phase, Vec<Action>) {
    if now < orders.fence_until {
        (phase, vec![Action::Fence])
    } else if phase.fenced() {
        (phase.unfenced(), vec![Action::FenceOver("fence_over")])
    } else if orders.drain.is_none() {
        (phase.attempted(), vec![Action::End])
    } else {
        (phase.attempted(), vec![])
    }
}

/// The node's `ROLE` before `fence_until`, its pause just set: a master stays paused, a
/// replica needs no fence, a node of another role keeps no pause it did not have.
fn answered(
    phase: Phase,
    orders: &Orders,
    role: Option<Role>,
    round_trips: u32,
) -> (Phase, Vec<Action>) {
    let (next, mut actions) = match role {
        Some(Role::Master) => {
            let seen_replica = phase.seen_replica();
            let first = !phase.fenced();
            (Phase::Fenced { seen_replica }, vec![Action::Paused { first, round_trips }])
        }
        Some(Role::Replica) if phase.fenced() => (Phase::Replica, vec![Action::Lift("replica")]),
        Some(Role::Replica) => (Phase::Replica, vec![Action::Unpause]),
        // Fenced as a master before: the renewed pause lapses as the fence ends.
        Some(Role::Other(_)) if phase.fenced() => (phase, vec![]),
        Some(Role::Other(_)) => (phase.attempted(), vec![Action::Unpause]),
        None => (phase.attempted(), vec![]),
    };
    actions.push(Action::WakeBy(orders.fence_until));
    (next, actions)
}

fn demotion(
    phase: Phase,
    orders: &Orders,
    outcome: Demotion,
    now: Instant,
) -> (Phase, Vec<Action>) {
    match outcome {
        Demotion::Done => (Phase::Replica, vec![]),
        Demotion::AlreadyReplica => (Phase::Replica, lift_if(phase, "replica")),
        Demotion::Refused => fence(phase.attempted(), orders, now),
        Demotion::Unreachable => (phase.attempted(), vec![Action::RetryIfSlow]),
    }
}

fn lift_if(phase: Phase, reason: &'static str) -> Vec<Action> {
    if phase.fenced() { vec![Action::Lift(reason)] } else { vec![] }
}

#[cfg(test)]
mod tests;
