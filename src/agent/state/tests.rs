use serde_json::json;

use super::*;

struct All;
impl Labels for All {
    fn label(&self, _: &str, upstream: &str) -> Option<String> {
        Some(upstream.to_string())
    }
}

fn view(primary: Option<&str>, epoch: Option<u64>, state: &str) -> MasterView {
    let primary = primary.map(|ip| json!({"ip": ip, "port": 6379, "hostname": null}));
    serde_json::from_value(json!({
        "name": "m", "dns_name": "m", "primary": primary, "epoch": epoch,
        "since": "2026-01-01T00:00:00.000Z", "state": state,
        "replicas": [{"ip": "10.0.0.2", "port": 6379, "healthy": true}],
        "sentinels": {"configured": 3, "reachable": 3, "agreeing": 3},
    }))
    .expect("a valid view")
}

fn primary(s: &Snapshot) -> Option<String> {
    s.master("m").and_then(|m| m.primary.as_ref()).map(ToString::to_string)
}

#[test]
fn the_upstream_view_is_published() {
    let s = merge(&Snapshot::default(), &[view(Some("10.0.0.1"), Some(1), "ok")], &All);
    assert_eq!(primary(&s).as_deref(), Some("10.0.0.1:6379"));
    assert_eq!(s.master("m").map(|m| m.state), Some(MasterState::Ok));
    assert!(s.source_reachable);
    assert_eq!(s.version, 1);
    let next = merge(&s, &[view(Some("10.0.0.2"), Some(2), "ok")], &All);
    assert_eq!(primary(&next).as_deref(), Some("10.0.0.2:6379"));
}

#[test]
fn a_restarting_upstream_does_not_erase_the_primary() {
    let s = merge(&Snapshot::default(), &[view(Some("10.0.0.1"), Some(3), "ok")], &All);
    let loading = merge(&s, &[view(None, None, "unknown")], &All);
    assert_eq!(primary(&loading).as_deref(), Some("10.0.0.1:6379"));
    assert_eq!(loading.master("m").map(|m| m.state), Some(MasterState::Stale));
    let empty = merge(&s, &[], &All);
    assert_eq!(primary(&empty).as_deref(), Some("10.0.0.1:6379"));
}

#[test]
fn a_lower_epoch_is_never_published() {
    let s = merge(&Snapshot::default(), &[view(Some("10.0.0.2"), Some(5), "ok")], &All);
    let older = merge(&s, &[view(Some("10.0.0.1"), Some(4), "ok")], &All);
    assert_eq!(primary(&older).as_deref(), Some("10.0.0.2:6379"));
}

#[test]
fn an_unreachable_upstream_marks_stale_and_keeps_the_primary() {
    let s = merge(&Snapshot::default(), &[view(Some("10.0.0.1"), Some(1), "ok")], &All);
    let down = stale(&s);
    assert_eq!(primary(&down).as_deref(), Some("10.0.0.1:6379"));
    assert_eq!(down.master("m").map(|m| m.state), Some(MasterState::Stale));
    assert!(!down.source_reachable);
    assert!(crate::sweep::plan::changes(&s, &down).is_empty());
}

fn combined(current: &Snapshot, upstreams: &[&[MasterView]]) -> (Snapshot, Vec<String>) {
    let (views, refused) = combine(current, upstreams);
    (merge(current, &views, &All), refused)
}

#[test]
fn the_highest_epoch_of_the_upstreams_that_answer_wins() {
    let s = merge(&Snapshot::default(), &[view(Some("10.0.0.1"), Some(1), "ok")], &All);
    let behind = [view(Some("10.0.0.1"), Some(1), "ok")];
    let ahead = [view(Some("10.0.0.2"), Some(2), "ok")];
    let (next, refused) = combined(&s, &[&behind, &ahead]);
    assert_eq!(primary(&next).as_deref(), Some("10.0.0.2:6379"));
    assert!(refused.is_empty(), "{refused:?}");
    // Equal epochs: the upstream that still sees its Sentinels wins.
    let stale = [view(Some("10.0.0.2"), Some(2), "stale")];
    let (next, _) = combined(&next, &[&stale, &ahead]);
    assert_eq!(next.master("m").map(|m| m.state), Some(MasterState::Ok));
}

#[test]
fn an_absurd_epoch_a_jump_or_an_equal_epoch_with_another_primary_is_refused() {
    let s = merge(&Snapshot::default(), &[view(Some("10.0.0.1"), Some(5), "ok")], &All);
    for (bad, why) in [
        (view(Some("10.0.0.2"), Some(u64::MAX), "ok"), "not a Sentinel epoch"),
        (view(Some("10.0.0.2"), Some(5 + MAX_EPOCH_JUMP + 1), "ok"), "jumps"),
        (view(Some("10.0.0.2"), Some(5), "ok"), "same epoch"),
        (view(Some("10.9.9.9"), Some(6), "ok"), "not a replica"),
    ] {
        let (next, refused) = combined(&s, &[&[bad]]);
        assert_eq!(primary(&next).as_deref(), Some("10.0.0.1:6379"), "{why}");
        assert_eq!(next.master("m").map(|m| m.state), Some(MasterState::Ok), "{why}");
        assert!(refused.iter().any(|r| r.contains(why)), "{why}: {refused:?}");
    }
    // A plausible one afterwards is taken: nothing is pinned.
    let (next, _) = combined(&s, &[&[view(Some("10.0.0.2"), Some(6), "ok")]]);
    assert_eq!(primary(&next).as_deref(), Some("10.0.0.2:6379"));
}
