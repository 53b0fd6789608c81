use std::time::Instant;

use serde_json::json;

use super::*;

/// A table row: what it shows, each upstream's view, the configured count, what is followed.
type Row = (&'static str, Vec<Option<MasterView>>, usize, Option<(String, u64)>);

struct All;
impl Labels for All {
    fn label(&self, _: &str) -> Label<'_> {
        Label::Agreed
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
    let s = merge(&Snapshot::default(), &[view(Some("10.0.0.1"), Some(1), "ok")]);
    assert_eq!(primary(&s).as_deref(), Some("10.0.0.1:6379"));
    assert_eq!(s.master("m").map(|m| m.state), Some(MasterState::Ok));
    assert!(s.source_reachable);
    assert_eq!(s.version, 1);
    let next = merge(&s, &[view(Some("10.0.0.2"), Some(2), "ok")]);
    assert_eq!(primary(&next).as_deref(), Some("10.0.0.2:6379"));
}

fn combined(current: &Snapshot, upstreams: &[Option<&[MasterView]>]) -> (Snapshot, Vec<String>) {
    let (views, refused) = combine(current, upstreams, &Lineage::default(), &All);
    (merge(current, &views), refused)
}

#[test]
fn a_restarting_upstream_does_not_erase_the_primary() {
    let s = merge(&Snapshot::default(), &[view(Some("10.0.0.1"), Some(3), "ok")]);
    let (loading, _) = combined(&s, &[Some(&[view(None, None, "unknown")])]);
    assert_eq!(primary(&loading).as_deref(), Some("10.0.0.1:6379"));
    assert_eq!(loading.master("m").map(|m| m.state), Some(MasterState::Stale));
    let (empty, _) = combined(&s, &[Some(&[])]);
    assert_eq!(primary(&empty).as_deref(), Some("10.0.0.1:6379"));
}

#[test]
fn a_lower_epoch_is_never_published() {
    let s = merge(&Snapshot::default(), &[view(Some("10.0.0.2"), Some(5), "ok")]);
    let (older, refused) = combined(&s, &[Some(&[view(Some("10.0.0.1"), Some(4), "ok")])]);
    assert_eq!(primary(&older).as_deref(), Some("10.0.0.2:6379"));
    assert!(refused.iter().any(|r| r.contains("no majority withdrew")), "{refused:?}");
}

#[test]
fn an_unreachable_upstream_marks_stale_and_keeps_the_primary() {
    let s = merge(&Snapshot::default(), &[view(Some("10.0.0.1"), Some(1), "ok")]);
    let down = stale(&s);
    assert_eq!(primary(&down).as_deref(), Some("10.0.0.1:6379"));
    assert_eq!(down.master("m").map(|m| m.state), Some(MasterState::Stale));
    assert!(!down.source_reachable);
    assert!(crate::sweep::plan::changes(&s, &down).is_empty());
}

/// (An epoch far above what is published is no longer refused as "not a Sentinel epoch":
/// see `every_upstream_past_two_to_the_32_is_followed`.)
#[test]
fn an_equal_epoch_with_another_primary_or_no_replica_is_refused() {
    let s = merge(&Snapshot::default(), &[view(Some("10.0.0.1"), Some(5), "ok")]);
    for (bad, why) in [
        (view(Some("10.0.0.2"), Some(5), "ok"), "same epoch"),
        (view(Some("10.9.9.9"), Some(6), "ok"), "not a replica"),
    ] {
        let (next, refused) = combined(&s, &[Some(&[bad])]);
        assert_eq!(primary(&next).as_deref(), Some("10.0.0.1:6379"), "{why}");
        assert!(refused.iter().any(|r| r.contains(why)), "{why}: {refused:?}");
    }
    // A plausible one afterwards is taken: nothing is pinned.
    let (next, _) = combined(&s, &[Some(&[view(Some("10.0.0.2"), Some(6), "ok")])]);
    assert_eq!(primary(&next).as_deref(), Some("10.0.0.2:6379"));
}

// ---------------------------------------------------------------------------------------------
// The agents' majority rule (docs/deciding.md, "Agents"), as a table over `decide`.

const A: &str = "10.0.0.1"; // the primary
const R: &str = "10.0.0.2"; // its replica
const X: &str = "10.6.6.6"; // the attacker's node

/// The view of `m` with `primary` at `epoch` and these replicas.
fn at(primary: &str, epoch: u64, replicas: &[&str]) -> MasterView {
    let mut v = view(Some(primary), Some(epoch), "ok");
    v.replicas = replicas
        .iter()
        .map(|ip| ReplicaView {
            ip: ip.parse().expect("ip"),
            port: 6379,
            hostname: None,
            healthy: true,
        })
        .collect();
    v
}

/// The same, saying that `undone` at `epoch` was withdrawn.
fn withdrawing(mut v: MasterView, undone: &str, epoch: u64) -> MasterView {
    let ip = undone.parse().expect("ip");
    v.withdrawn = Some(crate::http::view::WithdrawnView { ip, port: 6379, epoch });
    v
}

/// What the agent publishes for `m` once it has `current` and reads `views` of `configured`.
fn published(
    current: &MasterView,
    views: &[Option<MasterView>],
    configured: usize,
) -> Option<(String, u64)> {
    let s = merge(&Snapshot::default(), std::slice::from_ref(current));
    let slots: Vec<Option<&MasterView>> = views.iter().map(Option::as_ref).collect();
    let (v, _) = match decide(s.master("m").map(|m| &**m), &slots, configured, &[]) {
        Decision::Follow(v) => (v, ()),
        Decision::Keep(_) => (current.clone(), ()),
    };
    Some((v.primary?.ip.to_string(), v.epoch?))
}

#[test]
fn a_change_of_primary_needs_a_majority_of_the_configured_upstreams() {
    let now = at(A, 5, &[R]);
    let real = at(R, 6, &[A]);
    let a = |e: u64| Some((A.to_string(), e));
    let r = |e: u64| Some((R.to_string(), e));
    #[rustfmt::skip]
    let table: Vec<Row> = vec![
        ("a real failover served by all three",
            vec![Some(real.clone()), Some(real.clone()), Some(real.clone())], 3, r(6)),
        ("a real failover served by two of three (one behind)",
            vec![Some(real.clone()), Some(now.clone()), Some(real.clone())], 3, r(6)),
        ("a real failover served by two of three (one unreachable)",
            vec![Some(real.clone()), None, Some(real.clone())], 3, r(6)),
        ("one upstream alone of three, the others unreachable: they still count",
            vec![Some(real.clone()), None, None], 3, a(5)),
        ("one of two, the other unreachable",
            vec![Some(real.clone()), None], 2, a(5)),
        ("the epoch jumps by thousands (one counter for every master): the majority is the bound",
            vec![Some(at(R, 5001, &[A])), Some(at(R, 5001, &[A])), None], 3, r(5001)),
        ("one lying upstream jumping the epoch",
            vec![Some(at(X, 999_999, &[A])), Some(now.clone()), Some(now.clone())], 3, a(5)),
        ("one lying upstream jumping the epoch, the others unreachable",
            vec![Some(at(X, 999_999, &[A])), None, None], 3, a(5)),
        ("upstreams disagreeing: three primaries",
            vec![Some(at(R, 6, &[A])), Some(at(X, 7, &[A])), Some(now.clone())], 3, a(5)),
        ("upstreams disagreeing on the epoch of the same primary",
            vec![Some(at(R, 6, &[A])), Some(at(R, 7, &[A])), None], 3, a(5)),
        ("a majority at the same epoch naming another primary",
            vec![Some(at(R, 5, &[A])), Some(at(R, 5, &[A])), Some(at(R, 5, &[A]))], 3, a(5)),
        ("a majority at a higher epoch naming a node that was never a replica",
            vec![Some(at(X, 6, &[A])), Some(at(X, 6, &[A])), None], 3, a(5)),
        ("a majority raising the epoch of the same primary",
            vec![Some(at(A, 9, &[R])), Some(at(A, 9, &[R])), None], 3, a(9)),
        ("a lower epoch without a withdrawal",
            vec![Some(at(R, 4, &[A])), Some(at(R, 4, &[A])), Some(at(R, 4, &[A]))], 3, a(5)),
        ("an epoch of u64::MAX from every upstream: no ceiling, the majority is the bound",
            vec![Some(at(R, u64::MAX, &[A])), Some(at(R, u64::MAX, &[A]))], 2, r(u64::MAX)),
        ("a single configured upstream: a majority of one",
            vec![Some(real.clone())], 1, r(6)),
        ("a single configured upstream, unreachable",
            vec![None], 1, a(5)),
        ("a single configured upstream naming a node that was never a replica",
            vec![Some(at(X, 6, &[A]))], 1, a(5)),
    ];
    for (case, views, configured, want) in table {
        assert_eq!(published(&now, &views, configured), want, "{case}");
    }
}

/// Regression (docs/decisions.md D26): with several `upstream.urls`, the highest epoch from any one
/// won, and the "was a replica" check read the replica list that same upstream sent.
#[test]
fn one_upstream_adds_the_attackers_node_to_the_replicas_at_e_plus_1_then_promotes_it_at_e_plus_2() {
    let honest = at(A, 5, &[R]);
    let mut s = merge(&Snapshot::default(), std::slice::from_ref(&honest));
    let lies = [at(A, 6, &[R, X]), at(X, 7, &[A, R])];
    for lie in lies {
        let answers = [Some(vec![lie]), Some(vec![honest.clone()]), Some(vec![honest.clone()])];
        let slots: Vec<Option<&[MasterView]>> = answers.iter().map(|a| a.as_deref()).collect();
        s = combined(&s, &slots).0;
        assert_eq!(primary(&s).as_deref(), Some("10.0.0.1:6379"));
        let m = s.master("m").expect("m");
        assert_eq!(m.epoch, Some(5));
        assert!(m.replicas.iter().all(|r| r.ip.to_string() != X), "{:?}", m.replicas);
    }
    // With the other two unreachable, the lie is still one of three.
    for lie in [at(A, 6, &[R, X]), at(X, 7, &[A, R])] {
        s = combined(&s, &[Some(&[lie]), None, None]).0;
        assert_eq!(primary(&s).as_deref(), Some("10.0.0.1:6379"));
        assert_eq!(s.master("m").map(|m| m.state), Some(MasterState::Stale));
    }
}

/// One upstream promoting a replica at e+1, then at e+2 (the same replica or another node), is one
/// voice of three however often it speaks (docs/decisions.md D26).
#[test]
fn one_upstream_promoting_a_replica_at_e_plus_1_then_at_e_plus_2_moves_nothing() {
    let honest = at(A, 5, &[R]);
    let mut s = merge(&Snapshot::default(), std::slice::from_ref(&honest));
    for lie in [at(R, 6, &[A]), at(R, 7, &[A])] {
        let views = [lie, honest.clone(), honest.clone()];
        let slots: Vec<Option<&[MasterView]>> =
            views.iter().map(|v| Some(std::slice::from_ref(v))).collect();
        let (next, _) = combined(&s, &slots);
        assert_eq!(primary(&next).as_deref(), Some("10.0.0.1:6379"));
        assert_eq!(next.master("m").map(|m| m.state), Some(MasterState::Ok), "outvoted");
        s = next;
    }
}

/// Regression (docs/decisions.md D26): a withdrawn provisional flip went back to a lower epoch, and
/// agents refused it and kept serving the replica the failover had given up.
#[test]
fn agents_refused_the_lower_epoch_of_a_withdrawn_provisional_flip_and_kept_a_replica() {
    let provisional = at(R, 6, &[]);
    let back = withdrawing(at(A, 5, &[R]), R, 6);
    let a = |e: u64| Some((A.to_string(), e));
    let r = |e: u64| Some((R.to_string(), e));
    #[rustfmt::skip]
    let table: Vec<Row> = vec![
        ("every upstream withdrew it", vec![Some(back.clone()), Some(back.clone()), Some(back.clone())], 3, a(5)),
        ("a majority withdrew it", vec![Some(back.clone()), None, Some(back.clone())], 3, a(5)),
        ("one of three withdrew it", vec![Some(back.clone()), Some(provisional.clone()), None], 3, r(6)),
        ("a single upstream withdrew it", vec![Some(back.clone())], 1, a(5)),
        ("a lower epoch without the withdrawal", vec![Some(at(A, 5, &[R]))], 1, r(6)),
        ("the withdrawal of another flip", vec![Some(withdrawing(at(A, 5, &[R]), R, 7))], 1, r(6)),
        ("the withdrawal of another node", vec![Some(withdrawing(at(A, 5, &[R]), X, 6))], 1, r(6)),
    ];
    for (case, views, configured, want) in table {
        assert_eq!(published(&provisional, &views, configured), want, "{case}");
    }
}

#[test]
fn a_replica_is_published_when_a_majority_lists_it() {
    let views = [at(A, 5, &[R, X]), at(A, 5, &[R]), at(A, 5, &[R])];
    let slots: Vec<Option<&MasterView>> = views.iter().map(Some).collect();
    let Decision::Follow(v) = decide(None, &slots, 3, &[]) else { panic!("a majority agrees") };
    let listed: Vec<String> = v.replicas.iter().map(|r| r.ip.to_string()).collect();
    assert_eq!(listed, [R]);
}

#[test]
fn an_agent_that_starts_needs_a_majority_for_its_first_primary() {
    // Named by one upstream of three, it is not published at all (issue 36, item 3; it was
    // published `unknown`, under that upstream's label and with its replicas).
    let (s, _) = combined(&Snapshot::default(), &[Some(&[at(X, 9, &[])]), None, None]);
    assert_eq!(primary(&s), None);
    assert!(s.master("m").is_none(), "{s:?}");
    let two = [Some(vec![at(A, 5, &[R])]), Some(vec![at(A, 5, &[R])]), None];
    let slots: Vec<Option<&[MasterView]>> = two.iter().map(|a| a.as_deref()).collect();
    let (s, _) = combined(&Snapshot::default(), &slots);
    assert_eq!(primary(&s).as_deref(), Some("10.0.0.1:6379"));
}

#[test]
fn on_equal_epochs_a_view_that_sees_its_sentinels_is_published() {
    let s = merge(&Snapshot::default(), &[at(A, 5, &[R])]);
    let mut stale = at(R, 6, &[A]);
    stale.state = "stale".into();
    let views = [stale, at(R, 6, &[A])];
    let slots: Vec<Option<&[MasterView]>> =
        views.iter().map(|v| Some(std::slice::from_ref(v))).collect();
    let (next, _) = combined(&s, &slots);
    assert_eq!(primary(&next).as_deref(), Some("10.0.0.2:6379"));
    assert_eq!(next.master("m").map(|m| m.state), Some(MasterState::Ok));
}

/// Regression: the upstreams publish the replicas of whichever Sentinel answered last, so a
/// majority served A with no replicas for a moment; a failover to R in that moment was refused
/// ("was not a replica"), and every later view too (R at a higher epoch, never a replica in
/// what the agent kept): the agent served the demoted A for good. What the agent published
/// before counts (only what a majority served gets published); a node it never published
/// is still refused.
#[test]
fn a_failover_while_the_upstreams_list_no_replicas_is_still_followed() {
    let mut lineage = Lineage::default();
    let step = |s: &Snapshot, views: &[MasterView], lineage: &mut Lineage| {
        let slots: Vec<Option<&[MasterView]>> =
            views.iter().map(|v| Some(std::slice::from_ref(v))).collect();
        let (next, refused) = combine(s, &slots, lineage, &All);
        let next = merge(s, &next);
        lineage.record(&next, Instant::now());
        (next, refused)
    };
    let (s, _) =
        step(&Snapshot::default(), &[at(A, 5, &[R]), at(A, 5, &[R]), at(A, 5, &[R])], &mut lineage);
    let (s, _) = step(&s, &[at(A, 5, &[]), at(A, 5, &[]), at(A, 5, &[R])], &mut lineage);
    assert!(s.master("m").is_some_and(|m| m.replicas.is_empty()), "the flicker is published");
    let (s, refused) = step(&s, &[at(R, 6, &[]), at(R, 6, &[]), at(R, 6, &[A])], &mut lineage);
    assert_eq!(primary(&s).as_deref(), Some("10.0.0.2:6379"), "{refused:?}");
    // A node no majority ever served is refused as before.
    let (s, refused) = step(&s, &[at(X, 7, &[]), at(X, 7, &[]), at(R, 6, &[A])], &mut lineage);
    assert_eq!(primary(&s).as_deref(), Some("10.0.0.2:6379"));
    assert!(refused.iter().any(|r| r.contains("not a replica")), "{refused:?}");
}

/// With two upstreams configured, one lying and one honest, the majority is two: nothing moves,
/// whichever the liar names (docs/trust.md, "Upstreams (for an agent)").
#[test]
fn two_upstreams_one_lying_move_nothing() {
    let now = at(A, 5, &[R]);
    let a = |e: u64| Some((A.to_string(), e));
    #[rustfmt::skip]
    let table: Vec<Row> = vec![
        ("the liar promotes the replica", vec![Some(at(R, 6, &[A])), Some(now.clone())], 2, a(5)),
        ("the liar names its own node", vec![Some(at(X, 6, &[A, R])), Some(now.clone())], 2, a(5)),
        ("the liar withdraws what is published", vec![Some(withdrawing(at(R, 4, &[A]), A, 5)), Some(now.clone())], 2, a(5)),
        ("the liar jumps the epoch, the honest one is down", vec![Some(at(R, 999_999, &[A])), None], 2, a(5)),
        ("both agree on a real failover", vec![Some(at(R, 6, &[A])), Some(at(R, 6, &[A]))], 2, Some((R.to_string(), 6))),
    ];
    for (case, views, configured, want) in table {
        assert_eq!(published(&now, &views, configured), want, "{case}");
    }
}

/// Regression: `combine` listed only the masters some answering upstream has, so a master one
/// answering upstream omitted (still loading it, or lying) while the others were down vanished from
/// the agent: no DNS answer, no HTTP answer. It keeps the last state (stale) until a majority of
/// the configured upstreams answer without it.
#[test]
fn a_master_one_answering_upstream_omits_while_the_others_are_down_is_kept() {
    let other =
        |name: &str| MasterView { name: name.into(), dns_name: name.into(), ..at(A, 1, &[]) };
    let (s, _) = combined(
        &Snapshot::default(),
        &[Some(&[at(A, 5, &[R]), other("n")]), Some(&[at(A, 5, &[R]), other("n")]), None],
    );
    assert_eq!(primary(&s).as_deref(), Some("10.0.0.1:6379"));
    // One upstream answers without `m`, the other two are down.
    let (kept, _) = combined(&s, &[Some(&[other("n")]), None, None]);
    assert_eq!(primary(&kept).as_deref(), Some("10.0.0.1:6379"), "m vanished");
    assert_eq!(kept.master("m").map(|m| m.state), Some(MasterState::Stale));
    // Two of three answer without it: it is gone upstream.
    let (gone, _) = combined(&s, &[Some(&[other("n")]), Some(&[other("n")]), None]);
    assert!(gone.master("m").is_none() && gone.master("n").is_some());
    // An upstream with no masters at all is loading: it says nothing about `m`.
    let (loading, _) = combined(&s, &[Some(&[]), Some(&[other("n")]), None]);
    assert_eq!(primary(&loading).as_deref(), Some("10.0.0.1:6379"));
}

/// Regression (no ceiling on the epoch: docs/decisions.md D4): Sentinel's epoch is one counter for
/// every master, and a forged hello can push every real Sentinel past any ceiling. The agent capped
/// epochs at 2^32 and then refused every real failover for good, while its upstreams followed them.
#[test]
fn every_upstream_past_two_to_the_32_is_followed() {
    let past = (1u64 << 32) + 5000;
    let now = at(A, 1 << 32, &[R]);
    let r = |e: u64| Some((R.to_string(), e));
    #[rustfmt::skip]
    let table: Vec<Row> = vec![
        ("every upstream past 2^32", vec![Some(at(R, past, &[A])), Some(at(R, past, &[A])), Some(at(R, past, &[A]))], 3, r(past)),
        ("a majority at u64::MAX", vec![Some(at(R, u64::MAX, &[A])), Some(at(R, u64::MAX, &[A])), None], 3, r(u64::MAX)),
        ("one upstream past 2^32 of three", vec![Some(at(R, past, &[A])), Some(now.clone()), None], 3, Some((A.to_string(), 1 << 32))),
    ];
    for (case, views, configured, want) in table {
        assert_eq!(published(&now, &views, configured), want, "{case}");
    }
    // And from what is published at such an epoch, the next real failover.
    let s = merge(&Snapshot::default(), &[at(R, past, &[A])]);
    let (next, refused) = combined(&s, &[Some(&[at(A, past + 1, &[R])])]);
    assert_eq!(primary(&next).as_deref(), Some("10.0.0.1:6379"), "{refused:?}");
}

/// A node known by `hostname` at `ip`.
fn named_view(ip: &str, hostname: &str, epoch: u64, replicas: &[(&str, &str)]) -> MasterView {
    let mut v = at(ip, epoch, &[]);
    v.primary.as_mut().expect("a primary").hostname = Some(hostname.into());
    v.replicas = replicas
        .iter()
        .map(|(ip, h)| ReplicaView {
            ip: ip.parse().expect("ip"),
            port: 6379,
            hostname: Some((*h).into()),
            healthy: true,
        })
        .collect();
    v
}

/// Regression, the agent's lineage (docs/deciding.md, "Agents"): a replica whose IP changed (its
/// hostname announced) was refused as the new primary ("not a replica"), and an address the
/// agent published once passed forever, whoever holds it now. The lineage knows a node by its
/// hostname too (its old address is then no longer it) and forgets what it has not published
/// for LINEAGE_TTL.
#[test]
fn an_agents_was_a_replica_survives_a_changed_ip_and_forgets_old_addresses() {
    const S: &str = "10.0.0.3"; // another replica, dropped by the Sentinels after a while
    let t0 = Instant::now();
    let step = |s: &Snapshot, v: MasterView, lineage: &mut Lineage, now: Instant| {
        let (views, refused) = combine(s, &[Some(std::slice::from_ref(&v))], lineage, &All);
        let next = merge(s, &views);
        lineage.record(&next, now);
        (next, refused)
    };
    let mut lineage = Lineage::default();
    let both = [(R, "r.lan"), (S, "s.lan")];
    let (s, _) = step(&Snapshot::default(), named_view(A, "a.lan", 5, &both), &mut lineage, t0);
    // The replica comes back at another address and is published there, then promoted.
    let moved = "10.0.0.9";
    let (s, _) = step(&s, named_view(A, "a.lan", 5, &[]), &mut lineage, t0);
    let (s, refused) = step(&s, named_view(moved, "r.lan", 6, &[(A, "a.lan")]), &mut lineage, t0);
    assert_eq!(primary(&s).as_deref(), Some("10.0.0.9:6379"), "{refused:?}");
    // Its old address is no longer it.
    let (_, refused) = step(&s, at(R, 7, &[]), &mut Lineage::default(), t0);
    assert!(refused.iter().any(|r| r.contains("not a replica")), "{refused:?}");
    // S, unpublished since t0, would still pass within LINEAGE_TTL...
    let soon = t0 + LINEAGE_TTL / 2;
    assert!(lineage.of("m").iter().any(|n| n.ip.to_string() == S), "{lineage:?}");
    // ...but long after, its address is someone else's.
    let later = t0 + LINEAGE_TTL + std::time::Duration::from_secs(1);
    let (s, _) = step(&s, named_view(moved, "r.lan", 6, &[(A, "a.lan")]), &mut lineage, soon);
    let (s, _) = step(&s, named_view(moved, "r.lan", 6, &[(A, "a.lan")]), &mut lineage, later);
    let (s, refused) = step(&s, at(S, 7, &[]), &mut lineage, later);
    assert_eq!(primary(&s).as_deref(), Some("10.0.0.9:6379"), "an address long unpublished passed");
    assert!(refused.iter().any(|r| r.contains("not a replica")), "{refused:?}");
    // What was published lately (the old primary, listed as a replica) still passes.
    let (s, refused) = step(&s, named_view(A, "a.lan", 8, &[]), &mut lineage, later);
    assert_eq!(primary(&s).as_deref(), Some("10.0.0.1:6379"), "{refused:?}");
}

// ---------------------------------------------------------------------------------------------
// Issue 36, item 3: an upstream's labels and replicas. Without `masters:`, the agent took each
// master's label from the first agreeing view, and published a master no majority named (label
// and replicas whole) from the first upstream's view: one lying upstream of three listed first
// served a master named `!` claiming the label `mymaster` (sorted first, it took the label: the
// agent's `mymaster.<zone>` answered SERVFAIL and `replicas.mymaster.<zone>` the attacker's
// address), or gave master alpha the label beta.

const C: &str = "10.0.0.3"; // beta's primary

/// Master `name` under `label`, primary `primary` at epoch 5, with `replicas`.
fn labelled(name: &str, label: &str, primary: Option<&str>, replicas: &[&str]) -> MasterView {
    let mut v = match primary {
        Some(p) => at(p, 5, replicas),
        None => MasterView { primary: None, epoch: None, ..at(A, 5, replicas) },
    };
    v.name = name.into();
    v.dns_name = label.into();
    v
}

/// The published masters after one merge from nothing: `(name, label, primary, healthy
/// replicas)`, sorted by name.
type Published = Vec<(String, String, Option<String>, Vec<String>)>;

/// Each configured upstream's answer (`None`: down).
type Answers = Vec<Option<Vec<MasterView>>>;

fn publish(upstreams: &[Option<Vec<MasterView>>], labels: &dyn Labels) -> Published {
    let slots: Vec<Option<&[MasterView]>> = upstreams.iter().map(|u| u.as_deref()).collect();
    let (views, _) = combine(&Snapshot::default(), &slots, &Lineage::default(), labels);
    let s = merge(&Snapshot::default(), &views);
    s.masters
        .values()
        .map(|m| {
            let healthy = m.replicas.iter().filter(|r| r.healthy).map(|r| r.ip.to_string());
            let primary = m.primary.as_ref().map(|p| p.ip.to_string());
            (m.name.clone(), m.label.clone(), primary, healthy.collect())
        })
        .collect()
}

fn row(name: &str, label: &str, primary: Option<&str>, replicas: &[&str]) -> Published {
    let replicas = replicas.iter().map(|r| r.to_string()).collect();
    vec![(name.into(), label.into(), primary.map(Into::into), replicas)]
}

#[test]
fn one_lying_upstream_listed_first_takes_no_label_and_no_replica_list() {
    let honest = || Some(vec![labelled("mymaster", "mymaster", Some(A), &[R])]);
    let mymaster = row("mymaster", "mymaster", Some(A), &[R]);
    let liar = |extra: Vec<MasterView>| {
        let mut views = vec![labelled("mymaster", "mymaster", Some(A), &[R])];
        views.extend(extra);
        Some(views)
    };
    #[rustfmt::skip]
    let table: Vec<(&str, Answers, Published)> = vec![
        ("without the liar: the primary and its replicas",
            vec![honest(), honest(), honest()], mymaster.clone()),
        ("a master named `!` (sorted first) claiming the label with the attacker's replica",
            vec![liar(vec![labelled("!", "mymaster", None, &[X])]), honest(), honest()],
            mymaster.clone()),
        ("the same with a primary of its own",
            vec![liar(vec![labelled("!", "mymaster", Some(X), &[X])]), honest(), honest()],
            mymaster.clone()),
        ("a master only the liar names, under a label of its own, the others down",
            vec![liar(vec![labelled("evil", "evil", Some(X), &[X])]), honest(), None],
            mymaster.clone()),
        ("the liar's own addresses among the replicas",
            vec![Some(vec![labelled("mymaster", "mymaster", Some(A), &[X, R, X])]), honest(), honest()],
            mymaster.clone()),
        ("the liar, as the first `ok` view, gives mymaster another label",
            vec![Some(vec![labelled("mymaster", "beta", Some(A), &[R])]), honest(), honest()],
            mymaster.clone()),
        ("a master two of three name is published",
            vec![liar(vec![labelled("two", "two", Some(C), &[])]), Some(vec![labelled("mymaster", "mymaster", Some(A), &[R]), labelled("two", "two", Some(C), &[])]), honest()],
            [mymaster.clone(), row("two", "two", Some(C), &[])].concat()),
        ("a master only one of three names is not published, even alone",
            vec![Some(vec![labelled("solo", "solo", Some(C), &[])]), None, None], vec![]),
        ("named by a majority without an agreed primary: unknown, the replicas a majority lists",
            vec![Some(vec![labelled("m", "m", Some(X), &[R, X])]), Some(vec![labelled("m", "m", Some(A), &[R])]), Some(vec![labelled("m", "m", None, &[R])])],
            row("m", "m", None, &[R])),
        ("named by a majority with no label a majority gives: not published",
            vec![Some(vec![labelled("m", "x", Some(A), &[])]), Some(vec![labelled("m", "y", Some(A), &[])]), None], vec![]),
        ("a replica healthy for one of three only is listed, not healthy",
            vec![Some(vec![labelled("m", "m", Some(A), &[R])]), Some(vec![MasterView { replicas: vec![ReplicaView { healthy: false, ..at(A, 5, &[R]).replicas[0].clone() }], ..labelled("m", "m", Some(A), &[]) }]), Some(vec![MasterView { replicas: vec![ReplicaView { healthy: false, ..at(A, 5, &[R]).replicas[0].clone() }], ..labelled("m", "m", Some(A), &[]) }])],
            row("m", "m", Some(A), &[])),
    ];
    for (case, upstreams, want) in table {
        assert_eq!(publish(&upstreams, &All), want, "{case}");
    }
}

/// Alpha and beta, each with its own label: the liar swaps them (as the first `ok` view) so that
/// beta's clients would write into alpha.
#[test]
fn one_lying_upstream_cannot_give_master_alpha_the_label_beta() {
    let real = || {
        Some(vec![
            labelled("alpha", "alpha", Some(A), &[R]),
            labelled("beta", "beta", Some(C), &[]),
        ])
    };
    let swapped = Some(vec![
        labelled("alpha", "beta", Some(A), &[R]),
        labelled("beta", "alpha", Some(C), &[]),
    ]);
    let want = [row("alpha", "alpha", Some(A), &[R]), row("beta", "beta", Some(C), &[])].concat();
    assert_eq!(publish(&[swapped.clone(), real(), real()], &All), want);
    // Two of three relabelling is a relabelling.
    let relabelled = [row("alpha", "beta", Some(A), &[R]), row("beta", "alpha", Some(C), &[])];
    assert_eq!(publish(&[swapped.clone(), swapped, real()], &All), relabelled.concat());
}

/// Published labels move only with a majority; a label two masters would hold is held by neither.
#[test]
fn a_published_label_moves_only_with_a_majority_and_is_never_shared() {
    let step = |s: &Snapshot, upstreams: &[Option<Vec<MasterView>>]| {
        let slots: Vec<Option<&[MasterView]>> = upstreams.iter().map(|u| u.as_deref()).collect();
        let (views, refused) = combine(s, &slots, &Lineage::default(), &All);
        (merge(s, &views), refused)
    };
    let label_of = |s: &Snapshot, name: &str| s.master(name).map(|m| m.label.clone());
    let m = |label: &str| Some(vec![labelled("m", label, Some(A), &[R])]);
    let (s, _) = step(&Snapshot::default(), &[m("cache"), m("cache"), m("cache")]);
    assert_eq!(label_of(&s, "m").as_deref(), Some("cache"));
    // One of three renames it, one is down: no majority gives another label, it keeps its own.
    let (s, _) = step(&s, &[m("other"), m("cache"), None]);
    assert_eq!(label_of(&s, "m").as_deref(), Some("cache"));
    let (s, _) = step(&s, &[m("other"), m("rest"), None]);
    assert_eq!(label_of(&s, "m").as_deref(), Some("cache"), "no majority: kept");
    let (s, _) = step(&s, &[m("other"), m("other"), None]);
    assert_eq!(label_of(&s, "m").as_deref(), Some("other"));
    // Two masters under one label (upstreams that serve it so): neither is published.
    let both = Some(vec![labelled("m", "dup", Some(A), &[R]), labelled("n", "dup", Some(C), &[])]);
    let (s, refused) = step(&s, &[both.clone(), both, None]);
    assert!(s.master("m").is_none() && s.master("n").is_none(), "{s:?}");
    assert!(refused.iter().any(|r| r.contains("published for none")), "{refused:?}");
}

/// With `masters:`, the configured label is the label, whatever the upstreams call the master;
/// a master not listed is not followed; a listed one still needs a majority to exist.
#[test]
fn a_configured_label_is_the_label_and_a_master_still_needs_a_majority() {
    struct Own;
    impl Labels for Own {
        fn label(&self, master: &str) -> Label<'_> {
            if master == "mymaster" { Label::Own("cache") } else { Label::Unfollowed }
        }
    }
    let view = |label: &str| {
        Some(vec![
            labelled("mymaster", label, Some(A), &[R]),
            labelled("other", "other", Some(C), &[]),
        ])
    };
    let want = row("mymaster", "cache", Some(A), &[R]);
    assert_eq!(publish(&[view("x"), view("y"), view("z")], &Own), want);
    assert_eq!(publish(&[view("x"), None, None], &Own), vec![]);
}

// ---------------------------------------------------------------------------------------------
// The bounds on one upstream, and a merge linear in what the upstreams serve.

fn many(count: usize, prefix: &str) -> Vec<MasterView> {
    (0..count)
        .map(|i| labelled(&format!("{prefix}{i:05}"), &format!("{prefix}{i:05}"), Some(A), &[R]))
        .collect()
}

#[test]
fn one_upstream_serving_past_the_bounds_is_refused() {
    use crate::agent::feed::{MAX_MASTERS, MAX_REPLICAS, TooMuch, bounded};
    let replicas: Vec<&str> = vec![R; MAX_REPLICAS + 1];
    let crowded = labelled("m", "m", Some(A), &replicas);
    #[rustfmt::skip]
    let table: Vec<(&str, Vec<MasterView>, Result<(), TooMuch>)> = vec![
        ("a thousand masters", many(1000, "m"), Ok(())),
        ("the most masters", many(MAX_MASTERS, "m"), Ok(())),
        ("one master more", many(MAX_MASTERS + 1, "m"), Err(TooMuch::Masters(MAX_MASTERS + 1))),
        ("one master with too many replicas", vec![crowded],
            Err(TooMuch::Replicas { master: "m".into(), count: MAX_REPLICAS + 1 })),
    ];
    for (case, views, want) in table {
        assert_eq!(bounded(&views), want, "{case}");
    }
}

/// Three upstreams serving the most masters each, one of them inventing as many more of its
/// own: two merges take half a second unoptimized (the old merge compared every name with every
/// other: 4 s at 4,000 masters, quadratic), and publish only the real ones.
#[test]
fn a_merge_of_three_upstreams_at_the_bound_is_linear() {
    use crate::agent::feed::MAX_MASTERS;
    let real = many(MAX_MASTERS, "m");
    let invented = many(MAX_MASTERS, "evil");
    let upstreams = [Some(&invented[..]), Some(&real[..]), Some(&real[..])];
    let mut lineage = Lineage::default();
    let started = Instant::now();
    let (views, refused) = combine(&Snapshot::default(), &upstreams, &lineage, &All);
    let s = merge(&Snapshot::default(), &views);
    lineage.record(&s, Instant::now());
    let (views, _) = combine(&s, &upstreams, &lineage, &All);
    let again = merge(&s, &views);
    lineage.record(&again, Instant::now());
    let took = started.elapsed();
    eprintln!("MERGE: two merges of 3 x {MAX_MASTERS} masters took {took:?}");
    assert_eq!(again.masters.len(), MAX_MASTERS);
    assert!(again.masters.keys().all(|n| n.starts_with('m')));
    assert!(refused.iter().any(|r| r.starts_with("10000 master(s)")), "{refused:?}");
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
}
