//! One upstream's masters as its event stream carries them (`?masters=only`): every master
//! when the stream starts, then the masters that changed at each snapshot the upstream
//! published (pure).
//!
//! The result is what `GET /v1/masters` would answer at that snapshot, and goes to the merger
//! like an answer read that way (the agents' trust rules in [`super::state`] are the same for
//! both). A change applies only to the version it was made after: one that does not follow
//! from what this stream sent ends the stream, and the next one starts from every master again.

use std::collections::BTreeMap;

use crate::http::view::{MasterView, MastersEvent};

/// What one upstream serves, as its stream told it.
#[derive(Debug, Default)]
pub struct Served {
    /// The upstream's snapshot version of the last event applied (`None`: none yet).
    version: Option<u64>,
    views: BTreeMap<String, MasterView>,
}

/// A change that does not follow from what was applied before: a missed event, or not a
/// polestar.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("the event stream sent a change after version {after}, where it had sent {}", sent(*.at))]
pub struct Gap {
    pub at: Option<u64>,
    pub after: u64,
}

fn sent(at: Option<u64>) -> String {
    at.map_or_else(|| "no full list".into(), |v| format!("version {v}"))
}

impl Served {
    /// Applies one `masters` event: every master (no `after`), or a change after the version
    /// applied last.
    pub fn apply(&mut self, event: MastersEvent) -> Result<(), Gap> {
        let by_name = |views: Vec<MasterView>| views.into_iter().map(|v| (v.name.clone(), v));
        match event.after {
            None => self.views = by_name(event.masters).collect(),
            Some(after) if self.version == Some(after) => {
                for name in &event.removed {
                    self.views.remove(name);
                }
                self.views.extend(by_name(event.masters));
            }
            Some(after) => return Err(Gap { at: self.version, after }),
        }
        self.version = Some(event.version);
        Ok(())
    }

    /// Every master, sorted by name, as `GET /v1/masters` answers.
    pub fn views(&self) -> Vec<MasterView> {
        self.views.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::view::{NodeView, SentinelsView};

    fn view(name: &str, port: u16, epoch: u64) -> MasterView {
        MasterView {
            name: name.into(),
            dns_name: name.into(),
            primary: Some(NodeView { ip: [10, 0, 0, 1].into(), port, hostname: None }),
            epoch: Some(epoch),
            since: None,
            state: "ok".into(),
            replicas: Vec::new(),
            sentinels: SentinelsView {
                configured: 3,
                reachable: 3,
                agreeing: 3,
                discovered: Vec::new(),
            },
            withdrawn: None,
        }
    }

    fn event(
        version: u64,
        after: Option<u64>,
        masters: &[MasterView],
        removed: &[&str],
    ) -> MastersEvent {
        let removed = removed.iter().map(|n| n.to_string()).collect();
        MastersEvent { version, after, masters: masters.to_vec(), removed }
    }

    fn primaries(served: &Served) -> Vec<(String, u16)> {
        let port = |v: &MasterView| v.primary.as_ref().map_or(0, |p| p.port);
        served.views().iter().map(|v| (v.name.clone(), port(v))).collect()
    }

    #[test]
    fn events_apply_in_order_and_a_gap_is_refused() {
        let (a1, a2, b1, c1) = (view("a", 1, 1), view("a", 2, 2), view("b", 1, 1), view("c", 1, 1));
        let full = event(10, None, &[b1.clone(), a1.clone()], &[]);
        // (events applied to a fresh stream, the result: Ok(primaries) or the gap)
        type Want = Result<Vec<(&'static str, u16)>, Gap>;
        let cases: Vec<(Vec<MastersEvent>, Want)> = vec![
            (vec![full.clone()], Ok(vec![("a", 1), ("b", 1)])),
            (
                vec![full.clone(), event(11, Some(10), std::slice::from_ref(&a2), &[])],
                Ok(vec![("a", 2), ("b", 1)]),
            ),
            (
                vec![full.clone(), event(12, Some(10), std::slice::from_ref(&c1), &["b"])],
                Ok(vec![("a", 1), ("c", 1)]),
            ),
            // A later full list replaces everything (a master it lacks is gone).
            (
                vec![full.clone(), event(20, None, std::slice::from_ref(&c1), &[])],
                Ok(vec![("c", 1)]),
            ),
            // A change before any full list, or after another version than the last applied.
            (
                vec![event(11, Some(10), std::slice::from_ref(&a2), &[])],
                Err(Gap { at: None, after: 10 }),
            ),
            (
                vec![full.clone(), event(12, Some(11), std::slice::from_ref(&a2), &[])],
                Err(Gap { at: Some(10), after: 11 }),
            ),
        ];
        for (events, want) in cases {
            let mut served = Served::default();
            let got =
                events.into_iter().try_for_each(|e| served.apply(e)).map(|()| primaries(&served));
            let want = want.map(|w| w.into_iter().map(|(n, p)| (n.to_string(), p)).collect());
            assert_eq!(got, want);
        }
    }
}
