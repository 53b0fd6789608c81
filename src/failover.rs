//! The failover signals: what the Sentinel side (the only writer of the topology) tells the
//! drain side (fence, drain, demote) about a failover. A neutral module, so that `sentinel`
//! and `drain` are siblings that do not import each other.
//!
//! Signals are sent only for changes the configured Sentinels agreed on, never because
//! polestar lost contact with them. Every fence, drain or demotion the drain side starts is
//! tied to one of these signals, so that the signal that undoes the state (an abort, a
//! withdrawn provisional flip) undoes what it started.

use std::time::Instant;

use crate::topology::Node;

/// One step of a failover of `master`, in the order the Sentinel side learns of them.
#[derive(Clone, Debug)]
pub enum Signal {
    /// A configured Sentinel started, or leads, a failover of `master` (`+try-failover`,
    /// `+elected-leader`) while `primary` is published: open the link the fence will need, so
    /// that the fence at the promotion is one round trip. Nothing is done to the node.
    FailoverStarted { master: String, primary: Node },
    /// A configured leader announced the promotion of `new` (resolved, where known) (`+selected-slave`,
    /// `+failover-state-send-slaveof-noone`): fence `old` early. A fence that no
    /// [`Signal::Flipped`] follows within a few seconds is lifted by the drain side itself (the
    /// leader died, an event was lost). `coordinated`: the leader runs Valkey 9's coordinated
    /// failover (it said so at the start), which fences `old` itself and which a fence of
    /// ours would stall.
    Promoting { master: String, old: Node, new: Option<Node>, at: Instant, coordinated: bool },
    /// The published primary changed: DNS and HTTP already answer `new`. `provisional`: the
    /// flip was made on the promoted replica's own `ROLE` answer while a configured leader
    /// promotes it, and is not confirmed yet ([`Signal::Confirmed`] or [`Signal::Aborted`]
    /// follows). A flip that is not provisional is confirmed at once.
    Flipped {
        master: String,
        old: Option<Node>,
        new: Node,
        epoch: u64,
        provisional: bool,
        at: Instant,
    },
    /// The provisional flip to `new` at `epoch` is confirmed (`+promoted-slave`, or a majority
    /// of the configured Sentinels): the old primary may be demoted.
    Confirmed { master: String, new: Node, epoch: u64 },
    /// The failover was aborted (and a provisional flip withdrawn): lift every fence and stop
    /// every drain started for it. `gave_up`: no Sentinel aborted the failover under way
    /// (polestar's own [`FENCE_WITHOUT_FLIP`](crate::sentinel::core::FENCE_WITHOUT_FLIP) ran
    /// out, the Sentinels converted a provisional primary back or contradicted it with its
    /// leader gone, the node answered replica again, or a leader aborted an older attempt
    /// while another leader's newer one goes on); its fences are then left to lapse,
    /// not lifted: `CLIENT UNPAUSE` lifts every polestar's pause, and another polestar may
    /// still need its fence.
    Aborted { master: String, gave_up: bool },
    /// A configured Sentinel reports `node` of `master` coming back (-sdown,
    /// +convert-to-slave, +role-change, +reboot) while `published` at `epoch` is the primary
    /// and no failover of `master` is in progress; if it still answers `ROLE` master, fence,
    /// drain and demote it at once.
    Returning { master: String, node: Node, published: Node, epoch: u64 },
}
