//! What one Sentinel event asks of its link, as values: what to tell the decider (at once, or
//! in the order of the events once a lookup is done) and which masters to reconcile. No
//! connection here: the link's session carries it out ([`super::Link`]), and the table test
//! below reads every kind of event without one.

use std::collections::{BTreeSet, HashSet};

use super::Session;
use crate::sentinel::Scope;
use crate::sentinel::message::{Addr, Down, Event};

/// What the decider is told of one event.
#[derive(Debug, PartialEq, Eq)]
pub enum Tell {
    /// `+new-epoch`: at once, ahead of what waits on a lookup (epochs only bound what may be
    /// published, so the sooner the better).
    NewEpoch(u64),
    /// `+try-failover` / `+elected-leader`, once this Sentinel said whether it runs it as
    /// Valkey's coordinated failover (its record, asked then).
    FailoverStarted { master: String, elected: bool },
    /// `+selected-slave` / `+failover-state-send-slaveof-noone`: `epoch` once `SLAVEOF NO ONE`
    /// was sent and the failover's epoch is known (the replica is then resolved first, so the
    /// decider may watch its `ROLE`).
    Promoting { master: String, replica: Addr, epoch: Option<u64> },
    /// `+promoted-slave`: the failover's epoch (`None`: asked of the Sentinel), the promoted
    /// replica resolved.
    Promoted { master: String, replica: Addr, epoch: Option<u64> },
    /// `+failover-end` (or `-for-timeout`) and `-failover-abort-*`.
    FailoverEnded { master: String, aborted: bool },
    /// A replica back or converted: resolved first.
    NodeBack { master: String, node: Addr, converted_to: Option<Addr> },
    /// A primary's own `+sdown`/`-sdown`/`+odown`/`-odown`.
    MasterDown { master: String, node: Addr, down: Down },
}

/// An event's consequences.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Told {
    pub tell: Option<Tell>,
    pub reconcile: Option<Scope>,
}

/// Reads `event` with what the session remembers (the last epoch, each failover's epoch);
/// `wanted`: the masters this polestar serves (`None`: all). One arm per kind of event: as
/// long as the list of [`Event`]s.
///
/// A failover's epoch is the `+new-epoch` that comes right before its `+try-failover`
/// (Sentinel announces the two in one go), never an earlier one: an epoch heard before any
/// other event, a vote in another master's election among them, is no failover's.
pub fn translate(event: Event, session: &mut Session, wanted: Option<&HashSet<String>>) -> Told {
    let just_before = session.last_epoch.take();
    let scope = |master: &str| {
        let served = wanted.is_none_or(|names| names.contains(master));
        served.then(|| Scope::Masters(BTreeSet::from([master.to_owned()])))
    };
    let told = |tell| Told { tell: Some(tell), reconcile: None };
    match event {
        Event::NewEpoch(epoch) => {
            session.last_epoch = Some(epoch);
            told(Tell::NewEpoch(epoch))
        }
        Event::Voted(epoch) => told(Tell::NewEpoch(epoch)),
        Event::FailoverStarted { master, elected } => {
            if let Some(epoch) = just_before {
                session.remember(&master, epoch);
            }
            told(Tell::FailoverStarted { master, elected })
        }
        Event::Promoting { master, replica, sent } => {
            let epoch = session.failover_epoch.get(&master).copied().filter(|_| sent);
            told(Tell::Promoting { master, replica, epoch })
        }
        Event::Promoted { master, replica } => {
            let epoch = session.failover_epoch.remove(&master);
            told(Tell::Promoted { master, replica, epoch })
        }
        Event::FailoverEnded { master, aborted } => {
            session.failover_epoch.remove(&master);
            let reconcile = scope(&master);
            Told { tell: Some(Tell::FailoverEnded { master, aborted }), reconcile }
        }
        Event::NodeBack { master, node, converted_to } => {
            let reconcile = scope(&master);
            Told { tell: Some(Tell::NodeBack { master, node, converted_to }), reconcile }
        }
        Event::MasterDown { master, node, down } => {
            let reconcile = scope(&master);
            Told { tell: Some(Tell::MasterDown { master, node, down }), reconcile }
        }
        Event::Switched { master, .. } | Event::Changed { master } => {
            Told { tell: None, reconcile: scope(&master) }
        }
        Event::Topology => Told { tell: None, reconcile: Some(Scope::All) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> Addr {
        Addr { host: "10.0.0.1".into(), port }
    }

    fn only(master: &str) -> Option<Scope> {
        Some(Scope::Masters(BTreeSet::from([master.to_owned()])))
    }

    /// A failover as one Sentinel announces it, event by event: the epoch is bound at the
    /// start and handed on with the promotion once `SLAVEOF NO ONE` is sent, and at the
    /// `+promoted-slave`; the end forgets it and asks for a reconciliation.
    #[test]
    fn a_failover_read_event_by_event() {
        let mut session = Session::default();
        let m = || "m".to_string();
        let steps = [
            (Event::NewEpoch(7), Some(Tell::NewEpoch(7)), None),
            (
                Event::FailoverStarted { master: m(), elected: false },
                Some(Tell::FailoverStarted { master: m(), elected: false }),
                None,
            ),
            (
                Event::FailoverStarted { master: m(), elected: true },
                Some(Tell::FailoverStarted { master: m(), elected: true }),
                None,
            ),
            (
                Event::Promoting { master: m(), replica: addr(2), sent: false },
                Some(Tell::Promoting { master: m(), replica: addr(2), epoch: None }),
                None,
            ),
            (
                Event::Promoting { master: m(), replica: addr(2), sent: true },
                Some(Tell::Promoting { master: m(), replica: addr(2), epoch: Some(7) }),
                None,
            ),
            (
                Event::Promoted { master: m(), replica: addr(2) },
                Some(Tell::Promoted { master: m(), replica: addr(2), epoch: Some(7) }),
                None,
            ),
            (Event::Switched { master: m(), old: addr(1), new: addr(2) }, None, only("m")),
            (
                Event::FailoverEnded { master: m(), aborted: false },
                Some(Tell::FailoverEnded { master: m(), aborted: false }),
                only("m"),
            ),
        ];
        for (event, tell, reconcile) in steps {
            let why = format!("{event:?}");
            assert_eq!(translate(event, &mut session, None), Told { tell, reconcile }, "{why}");
        }
        assert!(session.failover_epoch.is_empty(), "the failover's epoch is forgotten");
    }

    /// Two masters fail over at once: the leader of `a` votes in `b`'s election (a later
    /// epoch) between its `+try-failover` and its `+elected-leader`. `a`'s failover keeps the
    /// epoch announced with its start; a vote, or an epoch heard before some other event, is
    /// bound to no failover.
    #[test]
    fn a_failover_keeps_its_own_epoch_whatever_else_is_voted() {
        let mut session = Session::default();
        let name = |m: &str| m.to_string();
        let started = |m: &str, elected| Event::FailoverStarted { master: name(m), elected };
        let promoted = |m: &str| Event::Promoted { master: name(m), replica: addr(2) };
        for event in [
            Event::NewEpoch(7),
            started("a", false),
            Event::Voted(8),
            started("a", true),
            Event::NewEpoch(9),
            promoted("x"),
            started("b", true),
        ] {
            translate(event, &mut session, None);
        }
        let told = translate(promoted("a"), &mut session, None);
        let tell = Tell::Promoted { master: name("a"), replica: addr(2), epoch: Some(7) };
        assert_eq!(told.tell, Some(tell), "a's failover took another epoch");
        let told = translate(promoted("b"), &mut session, None);
        let tell = Tell::Promoted { master: name("b"), replica: addr(2), epoch: None };
        assert_eq!(told.tell, Some(tell), "b's epoch is asked of the Sentinel, not guessed");
        let told = translate(Event::Voted(10), &mut session, None);
        assert_eq!(told.tell, Some(Tell::NewEpoch(10)), "a vote still bounds what is published");
    }

    /// A `+promoted-slave` without a `+try-failover` heard (the link came up in between) asks
    /// the Sentinel for the epoch; events about a master this polestar does not serve ask for
    /// no reconciliation; `+monitor` and the like ask for a full one.
    #[test]
    fn what_is_asked_of_the_sentinel_and_what_is_reconciled() {
        let mut session = Session::default();
        let wanted = HashSet::from(["m".to_string()]);
        let event = Event::Promoted { master: "m".into(), replica: addr(2) };
        let told = translate(event, &mut session, Some(&wanted));
        let tell = Tell::Promoted { master: "m".into(), replica: addr(2), epoch: None };
        assert_eq!(told, Told { tell: Some(tell), reconcile: None });
        let other = Event::Changed { master: "other".into() };
        assert_eq!(translate(other, &mut session, Some(&wanted)), Told::default());
        let down = Down { objective: true, began: true, quorum: Some("2/3".into()) };
        let event = Event::MasterDown { master: "m".into(), node: addr(1), down: down.clone() };
        let told = translate(event, &mut session, Some(&wanted));
        let tell = Tell::MasterDown { master: "m".into(), node: addr(1), down };
        assert_eq!(told, Told { tell: Some(tell), reconcile: only("m") });
        let all = translate(Event::Topology, &mut session, Some(&wanted));
        assert_eq!(all, Told { tell: None, reconcile: Some(Scope::All) });
    }
}
