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
pub fn translate(event: Event, session: &mut Session, wanted: Option<&HashSet<String>>) -> Told {
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
        Event::FailoverStarted { master, elected } => {
            if let Some(epoch) = session.last_epoch {
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
