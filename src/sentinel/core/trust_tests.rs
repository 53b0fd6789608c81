//! The trust model's sequences (docs/trust.md, "Sentinels"; docs/deciding.md): a forged hello that
//! moves every Sentinel, a stale Sentinel after a partition heals, a provisional flip whose leader
//! dies or aborts. Each test is named after the sequence it pins.

use std::time::Duration;

use super::*;

/// `from` reports `port` at `epoch` with exactly these followers (replica, its upstream).
fn report_with(from: SentinelId, port: u16, epoch: u64, followers: &[(u16, u16)]) -> Evidence {
    let followers =
        followers.iter().map(|(r, up)| Follower { node: node(*r), upstream: addr(*up) }).collect();
    Evidence::Report {
        from,
        primary: cand(port, epoch),
        failover_in_progress: false,
        replicas: Vec::new(),
        followers,
    }
}

/// What every real Sentinel reports after a forged hello at epoch 2 naming the unrelated node
/// 9999: the old primary 7001 listed as its replica (it reports the master role, so no
/// upstream), the real replicas still replicating from 7001.
fn forged(epoch: u64) -> Vec<Evidence> {
    (0..3).map(|s| report_with(s, 9999, epoch, &[(7002, 7001), (7003, 7001)])).collect()
}

fn suspected(actions: &[Action]) -> usize {
    actions.iter().filter(|a| matches!(a, Action::Suspected(_))).count()
}

/// Regression (docs/decisions.md D5): every Sentinel adopted a forged hello one epoch ahead naming
/// an unrelated node, and polestar published it (then fenced, drained and demoted the real
/// primary toward it).
#[test]
fn a_forged_hello_one_epoch_ahead_naming_an_unrelated_node_is_refused_and_suspect() {
    let q = quorum(2);
    let (state, signals, actions) = run(settled(), &q, forged(2));
    assert_eq!(published(&state), Some((7001, 1)), "the last good primary stays");
    assert!(signals.is_empty(), "nothing fenced, drained or demoted: {signals:?}");
    assert_eq!(suspected(&actions), 1, "one suspicion, not one per report: {actions:?}");
    let suspect = state.suspect.clone().expect("the master is suspect");
    assert_eq!(suspect.candidate, cand(9999, 2));
    assert!(suspect.reason.contains("127.0.0.1:9999"), "{}", suspect.reason);
    // Reconciliations repeat it every second: still refused, no new event.
    let (state, _, actions) = run(state, &q, forged(2));
    assert_eq!((published(&state), suspected(&actions)), (Some((7001, 1)), 0));
    // The Sentinels come back to the real primary: the suspicion ends.
    let back = (0..3).map(|s| report(s, 7001, 3)).collect();
    let (state, signals, actions) = run(state, &quorum(3), back);
    assert_eq!(published(&state), Some((7001, 3)));
    assert!(state.suspect.is_none() && signals.is_empty());
    assert!(actions.iter().any(|a| matches!(a, Action::Cleared)));
}

/// The forged node is never asked `ROLE` (the node credentials would go with it), nor
/// warmed, nor flipped to, even when a configured leader "promotes" it.
#[test]
fn a_promotion_of_a_node_that_never_was_a_replica_is_neither_watched_nor_flipped() {
    let q = quorum(2);
    let evidence = vec![promoting(0, 9999, Some(2)), role(9999, 2, Role::Master)];
    let (state, _, actions) = run(settled(), &q, evidence);
    assert!(!actions.iter().any(|a| matches!(a, Action::WatchRole { .. })), "{actions:?}");
    assert_eq!(published(&state), Some((7001, 1)));
    assert!(state.suspect.is_some());
}

/// The chain: forge to 9999, forge back to 7001 (Sentinel then lists 9999 as a replica, but
/// it reports the master role), forge to 9999 again: it never joined the lineage.
#[test]
fn a_forged_node_listed_as_a_replica_after_a_forged_switch_back_still_is_refused() {
    let q = quorum(4);
    let (state, _, _) = run(settled(), &q, forged(2));
    let back = (0..3).map(|s| report_with(s, 7001, 3, &[(7002, 7001), (7003, 7001)])).collect();
    let (state, _, _) = run(state, &q, back);
    assert_eq!(published(&state), Some((7001, 3)));
    let (state, signals, _) = run(state, &q, forged(4));
    assert_eq!(published(&state), Some((7001, 3)));
    assert!(signals.is_empty() && state.suspect.is_some());
}

/// A real failover of a dead primary: its replicas lost their link but still name it as
/// their upstream, and were in the lineage before: the promoted one is published.
#[test]
fn a_real_failover_to_a_replica_of_the_master_is_published() {
    let q = quorum(2);
    let promoted = (0..2).map(|s| report_with(s, 7002, 2, &[(7003, 7002)])).collect();
    let (state, signals, _) = run(settled(), &q, promoted);
    assert_eq!(published(&state), Some((7002, 2)));
    assert!(state.suspect.is_none());
    assert_eq!(signals, [S::Flipped { new: 7002, epoch: 2, provisional: false }]);
    // A replica of a replica (7004 follows 7003) joins the lineage through it.
    let cascade = (0..2).map(|s| report_with(s, 7002, 2, &[(7003, 7002), (7004, 7003)]));
    let (state, _, _) = run(state, &q, cascade.collect());
    assert!(state.lineage.nodes().any(|n| n.port == 7004), "{:?}", state.lineage);
}

/// At start-up there is no history: the first majority is published.
#[test]
fn the_first_primary_needs_no_lineage() {
    let evidence = (0..2).map(|s| report_with(s, 9999, 1, &[])).collect();
    let (state, _, _) = run(State::default(), &quorum(1), evidence);
    assert_eq!(published(&state), Some((9999, 1)));
}

/// Regression (docs/decisions.md D7): after a partition healed, a Sentinel that missed the
/// failover reported `-sdown slave <new> @ m <old>` while polestar (which had lost the
/// others) still published the old primary: the new primary was fenced and demoted.
#[test]
fn a_stale_sentinel_after_a_partition_heals_gets_nothing_demoted() {
    let q = quorum(2);
    // Sentinels 0 and 1 are cut off (and fail over to 7002 where polestar cannot see it).
    let cut = vec![Evidence::Gone { from: 0 }, Evidence::Gone { from: 1 }];
    let (state, _, _) = run(settled(), &q, cut);
    let stale_says = Evidence::NodeBack { from: 2, node: node(7002) };
    let (state, signals, _) = run(state, &q, vec![stale_says]);
    assert!(signals.is_empty(), "one Sentinel's word demoted a node: {signals:?}");
    // The others return with the new primary; the stale one still names 7003 as returning.
    let healed = vec![report(0, 7002, 2), report(1, 7002, 2)];
    let (state, _, _) = run(state, &q, healed);
    assert_eq!(published(&state), Some((7002, 2)));
    let (state, signals, _) =
        run(state, &q, vec![Evidence::NodeBack { from: 2, node: node(7003) }]);
    assert!(
        signals.is_empty(),
        "the stale Sentinel's report is not what is published: {signals:?}"
    );
    // A Sentinel that reports what is published is believed about the returning old primary.
    let current = Evidence::NodeBack { from: 0, node: node(7001) };
    let (_, signals, _) = run(state, &q, vec![current]);
    assert_eq!(signals, [S::Returning { node: 7001, published: 7002 }]);
}

/// A node the master never had is not demoted on a Sentinel's word (it would get the node
/// credentials and a `REPLICAOF`).
#[test]
fn a_returning_node_that_never_was_the_masters_is_left_alone() {
    let (_, signals, _) =
        run(settled(), &quorum(2), vec![Evidence::NodeBack { from: 0, node: node(9999) }]);
    assert!(signals.is_empty(), "{signals:?}");
}

/// `from`'s `+convert-to-slave slave <port> @ m <to>`.
fn converted(from: SentinelId, port: u16, to: u16) -> Evidence {
    Evidence::Converted { from, node: node(port), converted_to: addr(to) }
}

/// Regression (docs/deciding.md, "Withdrawal and giving up"): the leader sent `SLAVEOF NO ONE` and
/// polestar flipped to 7002 on its `ROLE`, then the leader died before `+promoted-slave`. No
/// Sentinel ever learned the new configuration; the others turned 7002 back into a replica of 7001,
/// and polestar went on publishing a replica (its promotion counted as flipped, so no timeout ended
/// it).
#[test]
fn a_provisional_flip_whose_leader_dies_is_withdrawn_when_the_others_convert_the_node_back() {
    let q = quorum(2);
    // Sentinels 1 and 2 still report 7001 at epoch 1; the leader 0 is gone.
    let t0 = Instant::now();
    let others = vec![Evidence::Gone { from: 0 }, report(1, 7001, 1), report(2, 7001, 1)];
    let (dead, signals, _) = run_at(flipped(), &q, Some(t0), others);
    assert!(signals.is_empty() && provisional(&dead), "not yet: {signals:?}");
    // (Left so for CONTRADICTED_FLIP, the flip is withdrawn without any event: see
    // `a_lost_event_leaves_no_provisional_flip_published`. The conversion comes first here.)
    let later = Some(t0 + CONTRADICTED_FLIP / 2);
    let (dead, signals, _) = run_at(dead, &q, later, vec![Evidence::Tick]);
    assert!(signals.is_empty() && provisional(&dead), "a moment alone withdraws nothing");
    // Who speaks, and toward where, decides: (name, evidence, withdrawn).
    let cases = [
        ("a reporting Sentinel converts it to the old primary", converted(1, 7002, 7001), true),
        ("the dead leader's word", converted(0, 7002, 7001), false),
        ("converted toward another node", converted(1, 7002, 7003), false),
        ("another node converted", converted(1, 7003, 7001), false),
        ("a plain -sdown of the node", Evidence::NodeBack { from: 1, node: node(7002) }, false),
    ];
    for (name, evidence, withdrawn) in cases {
        let (state, signals, actions) = run(dead.clone(), &q, vec![evidence]);
        if withdrawn {
            assert_eq!(published(&state), Some((7001, 1)), "{name}");
            assert!(!provisional(&state) && state.promotion.is_none(), "{name}");
            assert_eq!(signals, [S::Aborted], "{name}");
            assert!(actions.iter().any(|a| matches!(a, Action::Withdrawn { .. })), "{name}");
            let gave_up = actions
                .iter()
                .any(|a| matches!(a, Action::Signal(Signal::Aborted { gave_up: true, .. })));
            assert!(gave_up, "{name}: no Sentinel aborted, the fence is left to lapse");
        } else {
            assert!(provisional(&state) && published(&state) == Some((7002, 2)), "{name}");
            assert!(signals.is_empty(), "{name}: {signals:?}");
        }
    }
}

/// The same conversion is no evidence while the Sentinels do not agree on the old primary:
/// one stale or lying Sentinel cannot undo a flip (nor can a Sentinel reporting another).
#[test]
fn a_conversion_without_a_majority_for_the_old_primary_withdraws_nothing() {
    let q = quorum(2);
    let cases = [
        ("one Sentinel of three reports the old primary", vec![report(1, 7001, 1)]),
        ("the speaker reports the new one", vec![report(1, 7002, 2), report(2, 7001, 1)]),
    ];
    for (name, reports) in cases {
        let mut evidence = vec![Evidence::Gone { from: 0 }, Evidence::Gone { from: 2 }];
        evidence.extend(reports);
        evidence.push(converted(1, 7002, 7001));
        let (state, signals, _) = run(flipped(), &q, evidence);
        assert!(provisional(&state) && published(&state) == Some((7002, 2)), "{name}");
        assert!(!signals.contains(&S::Aborted), "{name}: {signals:?}");
    }
}

/// Regression (the abort's `CLIENT UNPAUSE`, docs/decisions.md D12): Sentinel 0 flipped 7002
/// provisionally, then Sentinel 1 was elected at a newer epoch and promotes 7003 (Sentinel runs
/// such attempts side by side until the higher epoch wins); then Sentinel 0 aborts its own, older
/// attempt. The abort names no epoch. It withdrew the flip, dropped Sentinel 1's promotion and
/// signalled a Sentinel abort, whose `CLIENT UNPAUSE` lifts every pause on the node, those other
/// polestars hold for Sentinel 1's failover, which did not abort. Now the flip is withdrawn, the
/// newer promotion stays watched, and what was fenced is left to lapse.
#[test]
fn an_abort_of_an_older_attempt_lifts_no_fence_of_the_newer_one() {
    let q = quorum(3);
    let newer = promoting(1, 7003, Some(3));
    let (state, signals, _) = run(flipped(), &q, vec![newer]);
    assert_eq!(signals, [S::Promoting { old: 7002, new: Some(7003) }]);
    let (state, signals, actions) = run(state, &q, vec![abort(0)]);
    assert_eq!(published(&state), Some((7001, 1)), "Sentinel 0's flip is withdrawn");
    assert!(actions.iter().any(|a| matches!(a, Action::Withdrawn { .. })), "{actions:?}");
    assert_eq!(signals, [S::Aborted]);
    let lifted =
        actions.iter().any(|a| matches!(a, Action::Signal(Signal::Aborted { gave_up: false, .. })));
    assert!(!lifted, "an abort of Sentinel 0's attempt lifted the fences of Sentinel 1's");
    let promotion = state.promotion.as_ref().expect("Sentinel 1's promotion is still under way");
    assert_eq!((promotion.leader, promotion.target.clone()), (1, Some(cand(7003, 3))));
    // Sentinel 1's replica answers master: the flip to it goes ahead as it would have.
    let (state, signals, _) = run(state, &q, vec![role(7003, 3, Role::Master)]);
    assert_eq!(signals, [S::Flipped { new: 7003, epoch: 3, provisional: true }]);
    assert_eq!(published(&state), Some((7003, 3)));
    // The leader's own abort still lifts its fences (the failover did abort).
    let (_, _, actions) = run(flipped(), &q, vec![abort(0)]);
    let lifted =
        actions.iter().any(|a| matches!(a, Action::Signal(Signal::Aborted { gave_up: false, .. })));
    assert!(lifted, "{actions:?}");
}

/// `from` reports `port` at `epoch` with a failover of it in progress.
fn failing(from: SentinelId, port: u16, epoch: u64) -> Evidence {
    match report(from, port, epoch) {
        Evidence::Report { from, primary, replicas, followers, .. } => {
            Evidence::Report { from, primary, failover_in_progress: true, replicas, followers }
        }
        other => other,
    }
}

/// Regression (withdrawal without the event: docs/deciding.md, "Withdrawal and giving up"): a
/// provisional flip was withdrawn only on an abort or a non-leader's `+convert-to-slave`. Events
/// can be lost: a flip whose leader is gone while a majority keeps reporting the old primary at the
/// old epoch, or whose node answers `ROLE` replica again, stayed published (DNS named a replica).
/// Each row starts from the flip to 7002 at epoch 2 (leader 0), applies its evidence at t0, then a
/// tick at t0 + `after`: what is published then, and whether it is still provisional.
#[test]
fn a_lost_event_leaves_no_provisional_flip_published() {
    let q = quorum(2);
    let grace = CONTRADICTED_FLIP;
    let old = Some((7001, 1));
    let new = Some((7002, 2));
    type Row = (&'static str, Vec<Evidence>, Duration, Option<(u16, u64)>, bool);
    let gone = |more: Vec<Evidence>| {
        let mut e = vec![Evidence::Gone { from: 0 }];
        e.extend(more);
        e
    };
    #[rustfmt::skip]
    let table: Vec<Row> = vec![
        ("leader gone, a majority at the old epoch, for the grace",
            gone(vec![report(1, 7001, 1), report(2, 7001, 1)]), grace, old, false),
        ("leader gone, a majority at the old epoch, not yet for the grace",
            gone(vec![report(1, 7001, 1), report(2, 7001, 1)]), grace / 2, new, true),
        ("leader gone, one of three at the old epoch",
            gone(vec![Evidence::Gone { from: 2 }, report(1, 7001, 1)]), grace * 4, new, true),
        ("leader alive and failing over, the others at the old epoch",
            vec![failing(0, 7001, 1), report(1, 7001, 1), report(2, 7001, 1)], grace * 4, new, true),
        ("the leader reports the old primary with no failover (its abort was lost)",
            vec![report(0, 7001, 1), report(1, 7001, 1), report(2, 7001, 1)], grace, old, false),
        ("leader gone, then back with the promotion",
            gone(vec![report(1, 7001, 1), report(2, 7001, 1), report(0, 7002, 2)]), grace * 4, new, true),
        ("leader gone, the others moved to the new primary: confirmed",
            gone(vec![report(1, 7002, 2), report(2, 7002, 2)]), grace * 4, new, false),
        ("the node answers ROLE replica again",
            vec![role(7002, 2, Role::Replica)], Duration::ZERO, old, false),
        ("the node does not answer",
            vec![role(7002, 2, Role::Other("no answer".into()))], grace * 4, new, true),
        ("another node answers replica",
            vec![role(7003, 2, Role::Replica)], grace * 4, new, true),
        ("the node answers replica at another epoch",
            vec![role(7002, 3, Role::Replica)], grace * 4, new, true),
    ];
    for (name, evidence, after, want, still_provisional) in table {
        let t0 = Instant::now();
        let (state, _, mut actions) = run_at(flipped(), &q, Some(t0), evidence);
        let (state, _, more) = run_at(state, &q, Some(t0 + after), vec![Evidence::Tick]);
        actions.extend(more);
        assert_eq!(published(&state), want, "{name}");
        assert_eq!(provisional(&state), still_provisional, "{name}");
        let withdrawn = actions.iter().any(|a| matches!(a, Action::Withdrawn { .. }));
        assert_eq!(withdrawn, want == old, "{name}: {actions:?}");
        if withdrawn {
            // No Sentinel aborted anything polestar heard: the fence is left to lapse.
            let gave_up = actions
                .iter()
                .any(|a| matches!(a, Action::Signal(Signal::Aborted { gave_up: true, .. })));
            assert!(gave_up, "{name}: {actions:?}");
        }
    }
}

/// While a flip is provisional its node is asked `ROLE` every tick (so that a replica again
/// is seen without any event); once confirmed, it is not.
#[test]
fn a_provisional_primary_is_asked_role_every_tick() {
    let checks = |actions: &[Action]| {
        actions
            .iter()
            .filter(|a| matches!(a, Action::CheckRole { target } if *target == cand(7002, 2)))
            .count()
    };
    let (state, _, actions) = run(flipped(), &quorum(2), vec![Evidence::Tick, Evidence::Tick]);
    assert_eq!(checks(&actions), 2, "{actions:?}");
    let promoted = Evidence::Promoted { from: 0, target: cand(7002, 2), at: Instant::now() };
    let (_, _, actions) = run(state, &quorum(2), vec![promoted, Evidence::Tick]);
    assert_eq!(checks(&actions), 0, "{actions:?}");
}

/// A node known by `hostname` at `127.0.0.<last>:<port>`.
fn named(hostname: &str, last: u8, port: u16) -> Node {
    Node { ip: [127, 0, 0, last].into(), port, hostname: Some(hostname.into()) }
}

/// Regression (docs/deciding.md, "Lineage and suspect"): "a new primary was a replica" compared
/// addresses, so a replica whose IP changed (a pod or VM back with a new address, its hostname
/// announced by the Sentinels) was refused as the new primary, and an address the Sentinels dropped
/// long ago passed forever, whoever holds it now. The lineage knows a node by its hostname too, and
/// forgets what no configured Sentinel has listed for `LINEAGE_TTL` while they report.
#[test]
fn was_a_replica_survives_a_changed_ip_and_an_old_address_does_not_pass_forever() {
    let q = quorum(2);
    let (r2, moved) = (named("r2.lan", 2, 7002), named("r2.lan", 9, 7002));
    let follows = |from, primary: &Node, node: &Node| Evidence::Report {
        from,
        primary: Candidate { node: primary.clone(), epoch: 1 },
        failover_in_progress: false,
        replicas: Vec::new(),
        followers: vec![Follower { node: node.clone(), upstream: addr(primary.port) }],
    };
    let (state, _, _) =
        run(State::default(), &q, (0..3).map(|s| follows(s, &node(7001), &r2)).collect());
    assert!(state.lineage.contains(&r2));
    // The Sentinels promote r2.lan, now at another address.
    let promoted = |s| Evidence::Report {
        from: s,
        primary: Candidate { node: moved.clone(), epoch: 2 },
        failover_in_progress: false,
        replicas: Vec::new(),
        followers: Vec::new(),
    };
    let (state, _, _) = run(state, &quorum(2), (0..2).map(promoted).collect());
    assert_eq!(state.publication.primary().map(|p| &p.node), Some(&moved), "{:?}", state.suspect);
    assert!(state.suspect.is_none());

    // 7003 joined the lineage once (settled: every node replicated from 7001); then the
    // Sentinels list only 7002 for LINEAGE_TTL.
    let t0 = Instant::now();
    let only_7002 = (0..3).map(|s| listing(s, 7001, 1, &[(7002, true)])).collect::<Vec<_>>();
    let (state, _, _) = run_at(settled(), &q, Some(t0 + LINEAGE_TTL / 2), only_7002.clone());
    let later = Some(t0 + LINEAGE_TTL + Duration::from_secs(1));
    // The lineage is pruned at the next reconciliation (not by time alone: an idle master is
    // not ticked).
    let (pruned, _, _) = run_at(state.clone(), &q, later, only_7002.clone());
    assert!(!pruned.lineage.contains(&node(7003)), "{:?}", pruned.lineage);
    assert!(pruned.lineage.contains(&node(7002)) && pruned.lineage.contains(&node(7001)));
    let forged = (0..3).map(|s| report_with(s, 7003, 2, &[])).collect();
    let (after, signals, _) = run_at(pruned, &q, later, forged);
    assert_eq!(published(&after), Some((7001, 1)), "an address long dropped passed");
    assert!(after.suspect.is_some() && signals.is_empty());
    // While the Sentinels do not report (polestar cut off from them), nothing is forgotten.
    let cut = (0..3).map(|s| Evidence::Gone { from: s }).collect();
    let (cut, _, _) = run_at(state, &q, Some(t0), cut);
    let (cut, _, _) = run_at(cut, &q, Some(t0 + LINEAGE_TTL * 3), vec![Evidence::Tick]);
    assert!(cut.lineage.contains(&node(7003)), "{:?}", cut.lineage);
    // The published primary stays, listed or not.
    assert!(after.lineage.contains(&node(7001)));
}
