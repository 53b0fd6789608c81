//! The drain side of an episode as a state machine (pure): [`step`] takes the episode's
//! [`State`] (where the drain stands, and what it reads of the fence side), the latest orders,
//! what the node last answered and the time, and returns the next state and the I/O for the
//! shell ([`super::Episode`]) to do. The shell reports each answer back with the next
//! [`Probe`] (`now` is when it came), and ticks the drain side at [`Drain::wake`] and when the
//! orders change, never while one of its commands runs.
//!
//! The rules (the timeline is in [`super`]):
//! - A drain order the orders name, other than the one taken up last, is taken up at once;
//!   one under way (a `ROLE` asked, the first pass waiting for the fence, a pass running) is
//!   finished first. A stage acts only while the orders still name its order.
//! - The first pass is tried at once and then every `interval` until it reaches the node. A
//!   returning node's (`only_if_master`) asks `ROLE` first: the order ends unless the node
//!   answers master, or replica when this episode demoted it (its clients are stale all the
//!   same). Before the cutoff (`order.at + grace`) the first pass waits, at most
//!   [`FENCE_FIRST`], for the fence side's first attempt
//!   ([`super::phase::Phase::tried`]), so that a client killed at the flip reconnects to a
//!   paused (or demoted) node.
//! - Once a pass has reached the node, a sweep every `interval` and one exactly at the cutoff;
//!   the first sweep that starts at or after it is the last, whatever it found (a first pass
//!   that starts after the cutoff spares the clients that connected after it, and is the last
//!   once it reaches the node).
//! - Then, until the window ends, every [`STALE_SWEEP`] (or `interval`, if longer) the clients
//!   whose last command is a write are killed.
//! - A pass that reached every client records the flip's `flip_to_drained`, once per flip
//!   ([`State::timed`]: a returning node's order that took over a flip's carries its instant).

use std::time::Duration;

use tokio::time::Instant;

use super::state::{Demoted, State};
use super::{DrainOrder, Orders, STALE_SWEEP};
use crate::drain::Reason;
use crate::node::Role;

/// How long the first pass waits for the fence side's first attempt (a connect and a command).
pub const FENCE_FIRST: Duration = Duration::from_secs(2);

/// The drain settings an episode keeps from its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    pub grace: Duration,
    pub interval: Duration,
}

impl Pace {
    fn cutoff(self, order: &DrainOrder) -> Instant {
        order.at + self.grace
    }

    /// When the pass after one that started at `started` is due: an interval later, but not
    /// past the cutoff while before it (one pass runs exactly at the cutoff).
    fn after(self, order: &DrainOrder, started: Instant) -> Instant {
        let next = started + self.interval;
        let cutoff = self.cutoff(order);
        if started < cutoff { next.min(cutoff) } else { next }
    }
}

/// Where the drain of one old primary stands. Kept for the whole episode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Drain {
    /// No drain order taken up yet.
    #[default]
    Idle,
    /// `order` is taken up and no pass has reached the node: the first pass is tried at
    /// `next`.
    Unreached { order: DrainOrder, next: Instant },
    /// The first pass, tried at `started`: asking a returning node's `ROLE`.
    Asking { order: DrainOrder, started: Instant },
    /// The first pass, tried at `started`: waiting for the fence side's first attempt, at most
    /// until `by`.
    AwaitingFence { order: DrainOrder, started: Instant, by: Instant },
    /// The first pass, tried at `started`, is running.
    FirstPass { order: DrainOrder, started: Instant },
    /// A pass has reached the node: the next sweep at `next`.
    Sweeping { order: DrainOrder, next: Instant },
    /// A sweep, started at `started`, is running.
    Sweep { order: DrainOrder, started: Instant },
    /// Past the cutoff: the next sweep for clients that still write at `next` (or running).
    StaleWriters { order: DrainOrder, next: Instant },
    /// Done with `order` (it did not apply, or its window ended): nothing until the orders
    /// name another.
    Over { order: DrainOrder },
}

impl Drain {
    /// The order taken up last.
    pub fn order(self) -> Option<DrainOrder> {
        match self {
            Self::Idle => None,
            Self::Unreached { order, .. }
            | Self::Asking { order, .. }
            | Self::AwaitingFence { order, .. }
            | Self::FirstPass { order, .. }
            | Self::Sweeping { order, .. }
            | Self::Sweep { order, .. }
            | Self::StaleWriters { order, .. }
            | Self::Over { order } => Some(order),
        }
    }

    /// No pass of the order taken up has reached the node yet: at the window's end the drain
    /// is reported abandoned.
    pub fn unreached(self) -> bool {
        matches!(
            self,
            Self::Unreached { .. }
                | Self::Asking { .. }
                | Self::AwaitingFence { .. }
                | Self::FirstPass { .. }
        )
    }

    /// When the shell ticks the drain side next, if the time alone will wake it (else only new
    /// orders, or an answer, do).
    pub fn wake(self, orders: &Orders) -> Option<Instant> {
        let (order, at) = match self {
            Self::AwaitingFence { by, .. } => return Some(by),
            Self::Unreached { order, next }
            | Self::Sweeping { order, next }
            | Self::StaleWriters { order, next } => (order, next),
            _ => return None,
        };
        (orders.drain == Some(order)).then_some(at)
    }

    /// The stage once the command it waited on was dropped (the episode's shell restarted):
    /// that attempt is made again at `now`.
    pub fn interrupted(self, now: Instant) -> Self {
        match self {
            Self::Asking { order, .. }
            | Self::AwaitingFence { order, .. }
            | Self::FirstPass { order, .. } => Self::Unreached { order, next: now },
            Self::Sweep { order, .. } => Self::Sweeping { order, next: now },
            other => other,
        }
    }
}

/// What the shell brings to [`step`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The time [`Drain::wake`] named came, or the orders changed.
    Tick,
    /// The fence side's first attempt is over (brought by the episode's step).
    FenceTried,
    /// The `ROLE` an [`Action::AskRole`] got (`None`: no answer).
    Role(Option<Role>),
    /// What an [`Action::FirstPass`] or [`Action::Sweep`] found.
    Passed(Pass),
    /// An [`Action::SweepWriters`] is over (whatever it found: the next one is due all the same).
    Swept,
}

/// What one pass found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// It reached the node and every client it had to.
    Complete,
    /// It reached the node, which failed part-way (the clients not reached are left for the
    /// next pass).
    Interrupted,
    /// It did not reach the node.
    Unreachable,
}

/// The I/O a step asks for; each reports back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Ask the node's `ROLE`.
    AskRole,
    /// The order's first pass, reported as its `reason`: kill the clients that may have
    /// connected before `cutoff`. `timed`: the flip whose `flip_to_drained` a complete pass
    /// records.
    FirstPass { cutoff: Instant, reason: Reason, timed: Option<Instant> },
    /// A sweep, as the first pass but reported quietly when it finds no one.
    Sweep { cutoff: Instant, timed: Option<Instant> },
    /// Kill the clients whose last command is a write. `last`: the window ends before the next
    /// one, so those it still finds are reported left behind (nothing cuts them any more).
    SweepWriters { last: bool },
}

/// One transition of the drain side: see the module documentation.
pub fn step(state: State, orders: &Orders, probe: Probe, now: Instant) -> (State, Vec<Action>) {
    let (state, actions) = match probe {
        Probe::Tick => return tick(state, orders, now),
        Probe::FenceTried => return fence_tried(state),
        Probe::Role(role) => asked(state, role, now),
        Probe::Passed(pass) => passed(state, orders, pass, now),
        Probe::Swept => swept(state, orders, now),
    };
    // An answer that starts nothing is followed as a wait would be: new orders are taken up,
    // a pass already due is made.
    if actions.is_empty() { tick(state, orders, now) } else { (state, actions) }
}

fn tick(state: State, orders: &Orders, now: Instant) -> (State, Vec<Action>) {
    match state.drain {
        // Their answer comes first.
        Drain::Asking { .. } | Drain::FirstPass { .. } | Drain::Sweep { .. } => (state, vec![]),
        Drain::AwaitingFence { order, started, by } if now >= by => {
            first_pass(state, order, started)
        }
        Drain::AwaitingFence { .. } => (state, vec![]),
        _ => match orders.drain {
            Some(order) if state.drain.order() != Some(order) => attempt(state, order, now),
            Some(order) => due(state, order, orders, now),
            None => (state, vec![]),
        },
    }
}

/// The order taken up is still the orders': whatever is due now.
fn due(state: State, order: DrainOrder, orders: &Orders, now: Instant) -> (State, Vec<Action>) {
    match state.drain {
        Drain::Unreached { next, .. } if now >= next => attempt(state, order, now),
        Drain::Sweeping { next, .. } if now >= next => {
            let sweep =
                Action::Sweep { cutoff: state.pace.cutoff(&order), timed: timed(state, order) };
            (State { drain: Drain::Sweep { order, started: now }, ..state }, vec![sweep])
        }
        Drain::StaleWriters { next, .. } if now >= next => {
            let last = after_the_window(state.pace, orders, now);
            (state, vec![Action::SweepWriters { last }])
        }
        _ => (state, vec![]),
    }
}

/// An attempt at the first pass, starting now.
fn attempt(state: State, order: DrainOrder, now: Instant) -> (State, Vec<Action>) {
    if order.only_if_master {
        let asking = Drain::Asking { order, started: now };
        return (State { drain: asking, ..state }, vec![Action::AskRole]);
    }
    before_pass(state, order, now, now)
}

/// The node may be drained: the first pass, once the fence side has tried (before the cutoff).
fn before_pass(
    state: State,
    order: DrainOrder,
    started: Instant,
    now: Instant,
) -> (State, Vec<Action>) {
    if now < state.pace.cutoff(&order) && !state.fence.tried() {
        let by = now + FENCE_FIRST;
        return (State { drain: Drain::AwaitingFence { order, started, by }, ..state }, vec![]);
    }
    first_pass(state, order, started)
}

fn first_pass(state: State, order: DrainOrder, started: Instant) -> (State, Vec<Action>) {
    let pass = Action::FirstPass {
        cutoff: state.pace.cutoff(&order),
        reason: order.reason,
        timed: timed(state, order),
    };
    (State { drain: Drain::FirstPass { order, started }, ..state }, vec![pass])
}

/// The flip a complete pass of `order` is to time, unless it was timed already.
fn timed(state: State, order: DrainOrder) -> Option<Instant> {
    order.flipped.filter(|f| state.timed != Some(*f))
}

fn fence_tried(state: State) -> (State, Vec<Action>) {
    match state.drain {
        Drain::AwaitingFence { order, started, .. } => first_pass(state, order, started),
        _ => (state, vec![]),
    }
}

/// A returning node's `ROLE`: it is drained only while it claims master, or is a replica
/// because this episode demoted it.
fn asked(state: State, role: Option<Role>, now: Instant) -> (State, Vec<Action>) {
    let Drain::Asking { order, started } = state.drain else { return (state, vec![]) };
    let drain = match role {
        Some(Role::Master) => return before_pass(state, order, started, now),
        Some(Role::Replica) if state.demoted == Demoted::ByUs => {
            return before_pass(state, order, started, now);
        }
        Some(_) => Drain::Over { order },
        None => Drain::Unreached { order, next: state.pace.after(&order, started) },
    };
    (State { drain, ..state }, vec![])
}

fn passed(state: State, orders: &Orders, pass: Pass, now: Instant) -> (State, Vec<Action>) {
    let (order, started, first) = match state.drain {
        Drain::FirstPass { order, started } => (order, started, true),
        Drain::Sweep { order, started } => (order, started, false),
        _ => return (state, vec![]),
    };
    let timed = match timed(state, order) {
        Some(flip) if pass == Pass::Complete => Some(flip),
        _ => state.timed,
    };
    let drain = if first && pass == Pass::Unreachable {
        Drain::Unreached { order, next: state.pace.after(&order, started) }
    } else if started >= state.pace.cutoff(&order) {
        stale_writers(state.pace, order, orders, now)
    } else {
        Drain::Sweeping { order, next: state.pace.after(&order, started) }
    };
    (State { drain, timed, ..state }, vec![])
}

fn swept(state: State, orders: &Orders, now: Instant) -> (State, Vec<Action>) {
    let Drain::StaleWriters { order, .. } = state.drain else { return (state, vec![]) };
    (State { drain: stale_writers(state.pace, order, orders, now), ..state }, vec![])
}

/// The next sweep for stale writers, or the order's end if it would come after the window's.
fn stale_writers(pace: Pace, order: DrainOrder, orders: &Orders, now: Instant) -> Drain {
    if after_the_window(pace, orders, now) {
        return Drain::Over { order };
    }
    Drain::StaleWriters { order, next: now + pace.interval.max(STALE_SWEEP) }
}

/// A stale-writer sweep due after one at `now` would come after the window's end.
fn after_the_window(pace: Pace, orders: &Orders, now: Instant) -> bool {
    now + pace.interval.max(STALE_SWEEP) >= orders.until
}

#[cfg(test)]
mod tests;
