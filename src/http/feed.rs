//! The masters as a feed on the event stream (`GET /v1/events/stream?masters=only|also`): a
//! stream starts with a `masters` event holding every master as `GET /v1/masters` renders it,
//! then gets one with the masters that changed at each published snapshot.
//!
//! Agents follow one polestar by the thousand (docs/decisions.md D30: 10,000), all woken by the
//! same change. Re-reading `GET /v1/masters` on every event cost each of them a request and a
//! full answer; here each change is rendered once per pair of snapshots (the one a stream sent
//! last, the one published now) and the same bytes are written to every stream that sent the
//! same snapshot last, so an agent applies a change without a request of its own.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Bytes;

use super::view::{MasterView, MastersEvent};
use crate::events;
use crate::topology::{Master, Snapshot};

/// Changes kept rendered: the streams woken by one change all ask for the same pair; a stream
/// that fell behind (it missed snapshots while it was writing) asks for another, rendered then.
const KEPT: usize = 8;

/// `masters` events as rendered, shared by every stream.
#[derive(Default)]
pub struct Frames(Mutex<Kept>);

#[derive(Default)]
struct Kept {
    /// Every master of one snapshot.
    full: Option<(Arc<Snapshot>, Bytes)>,
    /// What changed from one snapshot to another (`None`: no master did), newest last.
    changes: VecDeque<(Arc<Snapshot>, Arc<Snapshot>, Option<Bytes>)>,
}

impl Frames {
    /// The event a stream starts with: every master of `snapshot`.
    pub fn full(&self, snapshot: &Arc<Snapshot>) -> Bytes {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((of, frame)) = &kept.full
            && Arc::ptr_eq(of, snapshot)
        {
            return frame.clone();
        }
        let frame = render(&full(snapshot));
        kept.full = Some((snapshot.clone(), frame.clone()));
        frame
    }

    /// The event from `from` (what the stream sent last) to `to`, `None` when no master changed
    /// (callers that ask while it is rendered wait for it instead of rendering it too).
    pub fn change(&self, from: &Arc<Snapshot>, to: &Arc<Snapshot>) -> Option<Bytes> {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let same = |(a, b, _): &&(Arc<Snapshot>, Arc<Snapshot>, Option<Bytes>)| {
            Arc::ptr_eq(a, from) && Arc::ptr_eq(b, to)
        };
        if let Some((_, _, frame)) = kept.changes.iter().find(same) {
            return frame.clone();
        }
        let event = change(from, to);
        let changed = !event.masters.is_empty() || !event.removed.is_empty();
        let frame = changed.then(|| render(&event));
        if kept.changes.len() == KEPT {
            kept.changes.pop_front();
        }
        kept.changes.push_back((from.clone(), to.clone(), frame.clone()));
        frame
    }
}

/// Every master of `snapshot`.
pub fn full(snapshot: &Snapshot) -> MastersEvent {
    let masters = snapshot.masters.values().map(|m| MasterView::from(&**m)).collect();
    MastersEvent { version: snapshot.version, after: None, masters, removed: Vec::new() }
}

/// The masters of `to` whose view differs from their view in `from` (or that `from` lacks),
/// and the names of those `from` has and `to` has not. A master whose view differs only in the
/// Sentinels discovered (never trusted, and what forged hellos churn: docs/decisions.md D25)
/// wakes no stream: its list travels with the master's next change, and in every full list.
pub fn change(from: &Snapshot, to: &Snapshot) -> MastersEvent {
    let changed = |(name, master): (&String, &Arc<Master>)| match from.masters.get(name) {
        Some(old) if Arc::ptr_eq(old, master) => None,
        old => {
            let view = MasterView::from(&**master);
            old.is_none_or(|old| wakes(&MasterView::from(&**old), &view)).then_some(view)
        }
    };
    let masters = to.masters.iter().filter_map(changed).collect();
    let removed = from.masters.keys().filter(|n| !to.masters.contains_key(*n)).cloned().collect();
    MastersEvent { version: to.version, after: Some(from.version), masters, removed }
}

/// Whether a master's view changed in more than its discovered Sentinels.
fn wakes(old: &MasterView, new: &MasterView) -> bool {
    let mut compared = new.clone();
    compared.sentinels.discovered.clone_from(&old.sentinels.discovered);
    *old != compared
}

/// The event as the stream sends it. Compact JSON escapes line breaks, so `data` is one line.
fn render(event: &MastersEvent) -> Bytes {
    // Plain data (strings, numbers, addresses): it always serializes.
    let json = serde_json::to_vec(event).unwrap_or_default();
    let mut frame = Vec::with_capacity(json.len() + 24);
    frame.extend_from_slice(b"event: ");
    frame.extend_from_slice(events::MASTERS.as_bytes());
    frame.extend_from_slice(b"\ndata: ");
    frame.extend_from_slice(&json);
    frame.extend_from_slice(b"\n\n");
    Bytes::from(frame)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::topology::{MasterState, Node};

    fn master(name: &str, port: u16, epoch: u64) -> Arc<Master> {
        Arc::new(Master {
            name: name.into(),
            label: name.into(),
            primary: Some(Node { ip: [10, 0, 0, 1].into(), port, hostname: None }),
            epoch: Some(epoch),
            since: None,
            state: MasterState::Ok,
            replicas: Vec::new(),
            sentinels: Default::default(),
            withdrawn: None,
            provisional: false,
        })
    }

    fn snapshot(version: u64, masters: &[&Arc<Master>]) -> Arc<Snapshot> {
        let masters: BTreeMap<String, Arc<Master>> =
            masters.iter().map(|m| (m.name.clone(), Arc::clone(m))).collect();
        Arc::new(Snapshot { version, masters, source_reachable: true })
    }

    fn names(event: &MastersEvent) -> Vec<&str> {
        event.masters.iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn a_change_holds_what_differs_and_what_is_gone() {
        let (a1, b1, c1) = (master("a", 1, 1), master("b", 1, 1), master("c", 1, 1));
        let (a2, b_copy) = (master("a", 2, 2), master("b", 1, 1));
        let d = master("d", 1, 1);
        let with = |m: &Arc<Master>, change: fn(&mut Master)| {
            let mut m = (**m).clone();
            change(&mut m);
            Arc::new(m)
        };
        let b_discovered = with(&b1, |m| m.sentinels.discovered = vec!["10.9.9.9:26379".into()]);
        let b_provisional = with(&b1, |m| m.provisional = true);
        let b_stale = with(&b1, |m| m.state = MasterState::Stale);
        let from = snapshot(4, &[&a1, &b1, &c1]);
        // (to, what the event holds, what it removes)
        let cases: [(Arc<Snapshot>, Vec<&str>, Vec<&str>); 8] = [
            (snapshot(5, &[&a1, &b1, &c1]), vec![], vec![]),
            (snapshot(5, &[&a2, &b1, &c1]), vec!["a"], vec![]),
            // Another Arc of the same view (an agent's merge rebuilds every master) is no change.
            (snapshot(5, &[&a1, &b_copy, &c1]), vec![], vec![]),
            // Nor is what the view does not show, or the discovered Sentinels alone.
            (snapshot(5, &[&a1, &b_provisional, &c1]), vec![], vec![]),
            (snapshot(5, &[&a1, &b_discovered, &c1]), vec![], vec![]),
            (snapshot(5, &[&a1, &b_stale, &c1]), vec!["b"], vec![]),
            (snapshot(5, &[&a1, &b1]), vec![], vec!["c"]),
            (snapshot(5, &[&a2, &b1, &d]), vec!["a", "d"], vec!["c"]),
        ];
        for (to, held, removed) in cases {
            let event = change(&from, &to);
            assert_eq!((event.version, event.after), (5, Some(4)));
            assert_eq!(names(&event), held);
            assert_eq!(event.removed, removed);
        }
    }

    #[test]
    fn the_full_event_holds_every_master_as_masters_json_renders_it() {
        let snap = snapshot(7, &[&master("a", 1, 1), &master("b", 2, 3)]);
        let event = full(&snap);
        assert_eq!((event.version, event.after, names(&event)), (7, None, vec!["a", "b"]));
        let json = serde_json::to_value(&event).expect("plain data");
        let list: Vec<MasterView> = snap.masters.values().map(|m| MasterView::from(&**m)).collect();
        assert_eq!(json["masters"], serde_json::to_value(&list).expect("plain data"));
        assert!(json.get("after").is_none() && json.get("removed").is_none(), "{json}");
    }

    #[test]
    fn each_pair_is_rendered_once_and_shared() {
        let frames = Frames::default();
        let (one, two) = (snapshot(1, &[&master("a", 1, 1)]), snapshot(2, &[&master("a", 2, 2)]));
        let first = frames.change(&one, &two).expect("a changed");
        let again = frames.change(&one, &two).expect("a changed");
        assert_eq!(first.as_ptr(), again.as_ptr(), "the same bytes, not a second rendering");
        let same = snapshot(3, &[&master("a", 2, 2)]);
        assert_eq!(frames.change(&two, &same), None, "nothing to send when no master changed");
        assert_eq!(frames.full(&two).as_ptr(), frames.full(&two).as_ptr());
        let text = std::str::from_utf8(&first).expect("JSON is text");
        let data = text.strip_prefix("event: masters\ndata: ").expect("the event line first");
        let data = data.strip_suffix("\n\n").expect("one data line, then the end of the event");
        assert!(!data.contains('\n'));
        let event: MastersEvent = serde_json::from_str(data).expect("the documented shape");
        assert_eq!(event, change(&one, &two));
    }
}
