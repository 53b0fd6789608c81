//! One upstream's masters as its event stream carries them (`?masters=only`): every master
//! when the stream starts, then the masters that changed at each snapshot the upstream
//! published (pure).
//!
//! The result is what `GET /v1/masters` would answer at that snapshot, and goes to the merger
//! like an answer read that way (the agents' trust rules in [`super::state`] are the same for
//! both). A change applies only to the version it was made after: one that does not follow
//! from what this stream sent ends the stream, and the next one starts from every master again.
//! So does an event past the bounds on what one upstream may serve ([`bounded`]): however
//! many masters a lying upstream invents, the agent holds and merges at most [`MAX_MASTERS`]
//! of it.

use std::collections::BTreeMap;

use crate::http::view::{MasterView, MastersEvent};

/// The most masters one upstream may serve: in one answer of `GET /v1/masters`, in one event,
/// and in what its stream has built. Ten times the fleets polestar is measured with (a
/// thousand masters); a 4 MiB answer could otherwise carry about 28,000.
pub const MAX_MASTERS: usize = 10_000;
/// The most replicas one upstream may list for one master (Sentinel lists every replica it
/// ever saw, down ones included, until a `SENTINEL RESET`).
pub const MAX_REPLICAS: usize = 256;

/// More than one upstream may serve: the answer or event is refused whole (a real polestar
/// never sends it), and the upstream counts as down until it sends less.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TooMuch {
    #[error("the upstream serves {0} masters, more than {MAX_MASTERS}")]
    Masters(usize),
    #[error("the upstream lists {count} replicas of {master:?}, more than {MAX_REPLICAS}")]
    Replicas { master: String, count: usize },
}

/// Whether `views` (an answer, an event's masters, or what a stream built) stay within the
/// bounds.
pub fn bounded(views: &[MasterView]) -> Result<(), TooMuch> {
    if views.len() > MAX_MASTERS {
        return Err(TooMuch::Masters(views.len()));
    }
    match views.iter().find(|v| v.replicas.len() > MAX_REPLICAS) {
        Some(v) => Err(TooMuch::Replicas { master: v.name.clone(), count: v.replicas.len() }),
        None => Ok(()),
    }
}

/// Why an event was not applied; the stream then ends.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(transparent)]
    Gap(#[from] Gap),
    #[error(transparent)]
    TooMuch(#[from] TooMuch),
}

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
    /// applied last. Refused past the bounds: the event itself, or what it would build (what
    /// was applied before is then kept as it was, and the stream ends).
    pub fn apply(&mut self, event: MastersEvent) -> Result<(), Refused> {
        bounded(&event.masters)?;
        let by_name = |views: Vec<MasterView>| views.into_iter().map(|v| (v.name.clone(), v));
        if let Some(after) = event.after
            && self.version != Some(after)
        {
            return Err(Gap { at: self.version, after }.into());
        }
        let total = match event.after {
            None => event.masters.len(),
            Some(_) => self.after_change(&event),
        };
        if total > MAX_MASTERS {
            return Err(TooMuch::Masters(total).into());
        }
        match event.after {
            None => self.views = by_name(event.masters).collect(),
            Some(_) => {
                for name in &event.removed {
                    self.views.remove(name);
                }
                self.views.extend(by_name(event.masters));
            }
        }
        self.version = Some(event.version);
        Ok(())
    }

    /// How many masters there are once the change `event` is applied (a master it names twice
    /// counts twice).
    fn after_change(&self, event: &MastersEvent) -> usize {
        let gone: std::collections::HashSet<&str> = event
            .removed
            .iter()
            .map(String::as_str)
            .filter(|n| self.views.contains_key(*n))
            .collect();
        let new =
            |v: &&MasterView| !self.views.contains_key(&v.name) || gone.contains(v.name.as_str());
        self.views.len() - gone.len() + event.masters.iter().filter(new).count()
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
            assert_eq!(got, want.map_err(Refused::Gap));
        }
    }

    fn views(prefix: &str, count: usize) -> Vec<MasterView> {
        (0..count).map(|i| view(&format!("{prefix}{i}"), 1, 1)).collect()
    }

    /// Issue 36, item 3: one stream added masters without a bound (about 28,000 per event, and
    /// more with every event). An event past [`MAX_MASTERS`], or one that would build more than
    /// that, is refused whole, and what was applied stays as it was.
    #[test]
    fn a_stream_adds_at_most_max_masters_per_event_and_in_all() {
        let half = MAX_MASTERS / 2;
        let full = |masters: Vec<MasterView>| event(1, None, &masters, &[]);
        let change =
            |masters: Vec<MasterView>, removed: &[&str]| event(2, Some(1), &masters, removed);
        let over = |n: usize| Err(Refused::TooMuch(TooMuch::Masters(n)));
        // (events applied to a fresh stream, the result: Ok(masters held) or the refusal)
        #[rustfmt::skip]
        let cases: Vec<(&str, Vec<MastersEvent>, Result<usize, Refused>)> = vec![
            ("the most in one full list", vec![full(views("a", MAX_MASTERS))], Ok(MAX_MASTERS)),
            ("one more in one full list", vec![full(views("a", MAX_MASTERS + 1))], over(MAX_MASTERS + 1)),
            ("half, then the other half as a change", vec![full(views("a", half)), change(views("b", half), &[])], Ok(MAX_MASTERS)),
            ("half, then one more than half as a change", vec![full(views("a", half)), change(views("b", half + 1), &[])], over(MAX_MASTERS + 1)),
            ("a change that replaces as many as it adds", vec![full(views("a", MAX_MASTERS)), change(views("b", 1), &["a0"])], Ok(MAX_MASTERS)),
            ("a change to masters already held adds none", vec![full(views("a", MAX_MASTERS)), change(views("a", 10), &[])], Ok(MAX_MASTERS)),
            ("a change past the bound by itself", vec![full(views("a", 1)), change(views("b", MAX_MASTERS + 1), &[])], over(MAX_MASTERS + 1)),
        ];
        for (case, events, want) in cases {
            let mut served = Served::default();
            let got =
                events.into_iter().try_for_each(|e| served.apply(e)).map(|()| served.views().len());
            assert_eq!(got, want, "{case}");
            assert!(served.views().len() <= MAX_MASTERS, "{case}");
        }
    }
}
