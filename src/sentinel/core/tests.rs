//! Table tests of the publication rule: each case is a sequence of evidence and what must be
//! published, and signalled, after it.

use std::net::{IpAddr, Ipv4Addr};

use super::*;

fn node(port: u16) -> Node {
    Node { ip: IpAddr::V4(Ipv4Addr::LOCALHOST), port, hostname: None }
}

fn cand(port: u16, epoch: u64) -> Candidate {
    Candidate { node: node(port), epoch }
}

fn addr(port: u16) -> Addr {
    Addr { host: "127.0.0.1".into(), port }
}

/// Three configured Sentinels that answered, all at `epoch`.
fn quorum(epoch: u64) -> Quorum {
    Quorum { voters: (0..3).collect(), epochs: (0..3).map(|s| (s, epoch)).collect() }
}

/// `from` reports `port` at `epoch`, the lab's other nodes (7001 to 7003) replicating from it.
fn report(from: SentinelId, port: u16, epoch: u64) -> Evidence {
    let others = (7001..=7003).filter(|p| *p != port);
    let followers = others.map(|p| Follower { node: node(p), upstream: addr(port) }).collect();
    let primary = cand(port, epoch);
    Evidence::Report { from, primary, failover_in_progress: false, replicas: Vec::new(), followers }
}

fn promoting(from: SentinelId, port: u16, epoch: Option<u64>) -> Evidence {
    let target = epoch.map(|e| cand(port, e));
    Evidence::Promoting { from, replica: addr(port), target, at: Instant::now() }
}

fn role(port: u16, epoch: u64, role: Role) -> Evidence {
    Evidence::Role { target: cand(port, epoch), role, at: Instant::now() }
}

fn abort(from: SentinelId) -> Evidence {
    Evidence::FailoverEnded { from, aborted: true }
}

/// Signals, in a form a table can spell.
#[derive(Debug, PartialEq, Eq)]
enum S {
    Promoting { old: u16, new: Option<u16> },
    Flipped { new: u16, epoch: u64, provisional: bool },
    Confirmed { new: u16 },
    Aborted,
    Returning { node: u16, published: u16 },
}

fn signals(actions: &[Action]) -> Vec<S> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Signal(Signal::Promoting { old, new, .. }) => {
                Some(S::Promoting { old: old.port, new: new.as_ref().map(|n| n.port) })
            }
            Action::Signal(Signal::Flipped { new, epoch, provisional, .. }) => {
                Some(S::Flipped { new: new.port, epoch: *epoch, provisional: *provisional })
            }
            Action::Signal(Signal::Confirmed { new, .. }) => Some(S::Confirmed { new: new.port }),
            Action::Signal(Signal::Aborted { .. }) => Some(S::Aborted),
            Action::Signal(Signal::Returning { node, published, .. }) => {
                Some(S::Returning { node: node.port, published: published.port })
            }
            _ => None,
        })
        .collect()
}

/// Runs `evidence` through the rule, each piece applied as it comes; returns the state and
/// every signal, in order.
fn run(state: State, q: &Quorum, evidence: Vec<Evidence>) -> (State, Vec<S>, Vec<Action>) {
    run_at(state, q, None, evidence)
}

/// The same, every piece applied at `at` (`None`: as it comes).
fn run_at(
    state: State,
    q: &Quorum,
    at: Option<Instant>,
    evidence: Vec<Evidence>,
) -> (State, Vec<S>, Vec<Action>) {
    let (mut state, mut all, mut actions) = (state, Vec::new(), Vec::new());
    for e in evidence {
        let now = Now { at: at.unwrap_or_else(Instant::now), wall: std::time::SystemTime::now() };
        let (next, acts) = decide("m", state, q, e, now);
        state = next;
        all.extend(signals(&acts));
        actions.extend(acts);
    }
    (state, all, actions)
}

fn published(state: &State) -> Option<(u16, u64)> {
    state.publication.primary().map(|p| (p.node.port, p.epoch))
}

fn provisional(state: &State) -> bool {
    matches!(state.publication, Publication::Provisional { .. })
}

/// 7001 published at epoch 1 by all three Sentinels.
fn settled() -> State {
    let (state, _, _) =
        run(State::default(), &quorum(1), (0..3).map(|s| report(s, 7001, 1)).collect());
    assert_eq!(published(&state), Some((7001, 1)));
    state
}

/// A table row: name, start, evidence, then what is published.
type Case = (&'static str, State, Vec<Evidence>, Option<(u16, u64)>);

#[test]
fn reports_publish_only_with_a_majority_at_a_higher_epoch() {
    let q = quorum(9);
    let cases: Vec<Case> = vec![
        ("one of three", State::default(), vec![report(0, 7001, 1)], None),
        (
            "two of three",
            State::default(),
            vec![report(0, 7001, 1), report(1, 7001, 1)],
            Some((7001, 1)),
        ),
        ("two disagree", State::default(), vec![report(0, 7001, 1), report(1, 7002, 1)], None),
        (
            "same node, other epochs",
            State::default(),
            vec![report(0, 7001, 1), report(1, 7001, 2)],
            None,
        ),
        (
            "lower epoch",
            settled(),
            vec![report(0, 7002, 0), report(1, 7002, 0), report(2, 7002, 0)],
            Some((7001, 1)),
        ),
        ("equal epoch", settled(), vec![report(0, 7002, 1), report(1, 7002, 1)], Some((7001, 1))),
        ("higher epoch", settled(), vec![report(0, 7002, 2), report(1, 7002, 2)], Some((7002, 2))),
        (
            "epoch raised in place",
            settled(),
            vec![report(0, 7001, 3), report(1, 7001, 3)],
            Some((7001, 3)),
        ),
        (
            "report withdrawn",
            State::default(),
            vec![report(0, 7001, 1), Evidence::Gone { from: 0 }, report(1, 7001, 1)],
            None,
        ),
    ];
    for (name, state, evidence, expected) in cases {
        let (state, _, _) = run(state, &q, evidence);
        assert_eq!(published(&state), expected, "{name}");
    }
}

/// Regression (a forged hello, docs/decisions.md D4): one Sentinel reporting an unrelated node at
/// an absurd epoch is one report, never a majority; it must not move nor freeze polestar.
#[test]
fn one_sentinel_at_an_absurd_epoch_neither_publishes_nor_freezes() {
    let q = Quorum { epochs: [(0, 1), (1, 1), (2, 999)].into(), ..quorum(1) };
    let (state, signals, actions) = run(settled(), &q, vec![report(2, 7009, 999)]);
    assert_eq!(published(&state), Some((7001, 1)));
    assert!(signals.is_empty(), "{signals:?}");
    assert!(!actions.iter().any(|a| matches!(a, Action::WatchRole { .. })), "no node is asked");
    let q = Quorum { epochs: [(0, 2), (1, 2), (2, 999)].into(), ..q };
    let (state, _, _) = run(state, &q, vec![report(0, 7002, 2), report(1, 7002, 2)]);
    assert_eq!(published(&state), Some((7002, 2)), "the real failover is followed");
}

#[test]
fn addresses_that_never_answered_do_not_raise_the_majority() {
    // Six addresses configured, three of them never answered as a Sentinel.
    let q = Quorum { voters: [0, 1, 2].into(), epochs: [(0, 1), (1, 1), (2, 1)].into() };
    let (state, _, _) = run(State::default(), &q, vec![report(0, 7001, 1), report(1, 7001, 1)]);
    assert_eq!(published(&state), Some((7001, 1)));
}

#[test]
fn a_leaders_promotion_fences_then_flips_provisionally_on_role_master() {
    let q = quorum(2);
    let evidence = vec![promoting(0, 7002, None), promoting(0, 7002, Some(2))];
    let (state, signals, actions) = run(settled(), &q, evidence);
    assert_eq!(
        signals,
        [S::Promoting { old: 7001, new: None }, S::Promoting { old: 7001, new: Some(7002) }]
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::WatchRole { target, .. } if *target == cand(7002, 2)))
    );
    assert_eq!(published(&state), Some((7001, 1)), "nothing flips before the node answers");
    let (state, signals, _) = run(state, &q, vec![role(7002, 2, Role::Replica)]);
    assert!(signals.is_empty() && published(&state) == Some((7001, 1)), "still a replica");
    let (state, signals, _) = run(state, &q, vec![role(7002, 2, Role::Master)]);
    assert_eq!(signals, [S::Flipped { new: 7002, epoch: 2, provisional: true }]);
    assert!(provisional(&state));
    assert_eq!(published(&state), Some((7002, 2)));
}

/// Whether each `Signal::Promoting` among `actions` said the failover is coordinated.
fn coordinated(actions: &[Action]) -> Vec<bool> {
    let of = |a: &Action| match a {
        Action::Signal(Signal::Promoting { coordinated, .. }) => Some(*coordinated),
        _ => None,
    };
    actions.iter().filter_map(of).collect()
}

#[test]
fn a_promotion_is_coordinated_only_when_its_own_leader_said_so_at_the_start() {
    let q = quorum(2);
    let started =
        |from, coordinated| Evidence::FailoverStarted { from, coordinated, elected: false };
    let ended = Evidence::FailoverEnded { from: 0, aborted: true };
    let not_failing = report(0, 7001, 1);
    let cases: Vec<(&str, Vec<Evidence>, Vec<bool>)> = vec![
        ("the leader says so", vec![started(0, true), promoting(0, 7002, None)], vec![true]),
        ("a plain one", vec![started(0, false), promoting(0, 7002, None)], vec![false]),
        ("no word at the start", vec![promoting(0, 7002, None)], vec![false]),
        ("another Sentinel's word", vec![started(1, true), promoting(0, 7002, None)], vec![false]),
        (
            "both promotion events",
            vec![started(0, true), promoting(0, 7002, None), promoting(0, 7002, Some(2))],
            vec![true, true],
        ),
        (
            "a later plain failover by the same leader",
            vec![started(0, true), ended, started(0, false), promoting(0, 7002, None)],
            vec![false],
        ),
        (
            "a later failover whose start was missed",
            vec![started(0, true), not_failing, promoting(0, 7002, None)],
            vec![false],
        ),
    ];
    for (name, evidence, expected) in cases {
        let (_, _, actions) = run(settled(), &q, evidence);
        assert_eq!(coordinated(&actions), expected, "{name}");
    }
}

fn elected(from: SentinelId) -> Evidence {
    Evidence::FailoverStarted { from, coordinated: false, elected: true }
}

/// The leader's `+elected-leader` fences the confirmed primary it reports, one Sentinel tick
/// earlier than `+selected-slave` would (a starved polestar's late fence lost writes); an
/// abort before the selection lifts it, a `+try-failover` fences nothing, and neither does an
/// election while the leader names another node or while a promotion is under way.
#[test]
fn the_leaders_election_fences_the_primary_it_reports_and_an_abort_lifts_it() {
    let q = quorum(2);
    let tried = Evidence::FailoverStarted { from: 0, coordinated: false, elected: false };
    let fence = || S::Promoting { old: 7001, new: None };
    let cases: Vec<(&str, Vec<Evidence>, Vec<S>)> = vec![
        ("elected", vec![elected(0)], vec![fence()]),
        ("only tried", vec![tried], vec![]),
        ("elected, then the selection", vec![elected(0), promoting(0, 7002, None)], {
            vec![fence(), fence()]
        }),
        ("elected, then an abort (no good replica)", vec![elected(0), abort(0)], {
            vec![fence(), S::Aborted]
        }),
        (
            "elected, the selection, then an abort",
            vec![elected(0), promoting(0, 7002, None), abort(0)],
            { vec![fence(), fence(), S::Aborted] },
        ),
        ("another Sentinel's abort", vec![elected(0), abort(1)], vec![fence()]),
        ("the leader names another node", vec![report(0, 7003, 1), elected(0)], vec![]),
        ("during another leader's promotion", vec![promoting(1, 7002, None), elected(0)], {
            vec![fence()]
        }),
    ];
    for (name, evidence, expected) in cases {
        let (state, signals, _) = run(settled(), &q, evidence);
        let lifted = expected.last() == Some(&S::Aborted);
        assert!(!lifted || state.elected.is_none(), "{name}: the abort ends it");
        assert_eq!(signals, expected, "{name}");
    }
    let (_, signals, _) = run(flipped(), &q, vec![elected(0)]);
    assert!(signals.is_empty(), "a provisional primary is never fenced at an election");
    let (state, signals, _) = run(settled(), &q, vec![elected(0), abort(0), abort(0)]);
    assert_eq!(signals.len(), 2, "one lift per fence: {signals:?}");
    assert_eq!(state.elected, None);
    // A coordinated failover's election is signalled as such: the drain side sets no fence.
    let coordinated_start = Evidence::FailoverStarted { from: 0, coordinated: true, elected: true };
    let (_, _, actions) = run(settled(), &q, vec![coordinated_start]);
    assert_eq!(coordinated(&actions), [true]);
}

fn flipped() -> State {
    let q = quorum(2);
    let (state, _, _) =
        run(settled(), &q, vec![promoting(0, 7002, Some(2)), role(7002, 2, Role::Master)]);
    assert!(provisional(&state));
    state
}

#[test]
fn a_provisional_flip_is_confirmed_by_the_leader_or_a_majority() {
    let q = quorum(2);
    let promoted = Evidence::Promoted { from: 0, target: cand(7002, 2), at: Instant::now() };
    let majority = vec![report(1, 7002, 2), report(2, 7002, 2)];
    let ended = vec![Evidence::FailoverEnded { from: 0, aborted: false }];
    let cases =
        [("+promoted-slave", vec![promoted]), ("majority", majority), ("+failover-end", ended)];
    for (name, evidence) in cases {
        let (state, signals, _) = run(flipped(), &q, evidence);
        assert_eq!(signals, [S::Confirmed { new: 7002 }], "{name}");
        assert!(!provisional(&state) && published(&state) == Some((7002, 2)), "{name}");
        let (state, signals, _) = run(state, &q, vec![abort(0)]);
        assert_eq!(published(&state), Some((7002, 2)), "{name}: a late abort changes nothing");
        assert!(signals.is_empty(), "{name}: {signals:?}");
    }
}

#[test]
fn an_abort_withdraws_a_provisional_flip_and_lifts_the_fence() {
    let q = quorum(2);
    let (state, signals, actions) = run(flipped(), &q, vec![abort(0)]);
    assert_eq!(published(&state), Some((7001, 1)), "back to the confirmed primary");
    assert!(!provisional(&state));
    assert_eq!(signals, [S::Aborted]);
    assert!(actions.iter().any(|a| matches!(a, Action::Withdrawn { .. })));
    assert_eq!(state.promotion, None);
}

#[test]
fn an_abort_before_any_flip_lifts_the_fence_only() {
    let q = quorum(2);
    let (state, signals, _) = run(settled(), &q, vec![promoting(0, 7002, None), abort(0)]);
    assert_eq!(signals, [S::Promoting { old: 7001, new: None }, S::Aborted]);
    assert_eq!(published(&state), Some((7001, 1)));
    let (_, signals, _) = run(settled(), &q, vec![promoting(0, 7002, None), abort(1)]);
    assert_eq!(signals, [S::Promoting { old: 7001, new: None }], "another Sentinel's abort");
}

#[test]
fn a_fence_that_no_flip_follows_is_lifted_within_seconds() {
    let q = quorum(2);
    let (state, _, _) = run(settled(), &q, vec![promoting(0, 7002, None)]);
    let started = state.promotion.as_ref().map(|p| p.started).expect("a promotion");
    let soon = Some(started + FENCE_WITHOUT_FLIP / 2);
    let (state, signals, _) = run_at(state, &q, soon, vec![Evidence::Tick]);
    assert!(signals.is_empty(), "{signals:?}");
    let late = Some(started + FENCE_WITHOUT_FLIP);
    let (state, signals, actions) = run_at(state, &q, late, vec![Evidence::Tick]);
    assert_eq!(signals, [S::Aborted]);
    assert_eq!(state.promotion, None);
    // Given up by polestar, not aborted by a Sentinel: its fence lapses (no UNPAUSE).
    let gave_up =
        actions.iter().any(|a| matches!(a, Action::Signal(Signal::Aborted { gave_up: true, .. })));
    assert!(gave_up, "{actions:?}");
    // A provisional flip is not given up by the clock: it waits for confirmation or an abort.
    let state = flipped();
    let started = state.promotion.as_ref().map(|p| p.started).expect("a promotion");
    let tick = Some(started + FENCE_WITHOUT_FLIP * 2);
    let (state, signals, _) = run_at(state, &q, tick, vec![Evidence::Tick]);
    assert!(signals.is_empty() && provisional(&state));
}

#[test]
fn an_epoch_beyond_the_sentinels_reach_is_not_flipped_to() {
    // Only the leader (Sentinel 0) claims epoch 3: the others are still at 1.
    let q = Quorum { epochs: [(0, 3), (1, 1), (2, 1)].into(), ..quorum(1) };
    let evidence = vec![promoting(0, 7002, Some(3)), role(7002, 3, Role::Master)];
    let (state, signals, _) = run(settled(), &q, evidence);
    assert_eq!(published(&state), Some((7001, 1)));
    assert_eq!(signals, [S::Promoting { old: 7001, new: Some(7002) }]);
}

/// `SENTINEL FAILOVER` skips the election: the leader is one epoch ahead of the others until
/// its hello reaches them, after the promotion. That is within reach.
#[test]
fn a_forced_failover_one_epoch_ahead_flips_early() {
    let q = Quorum { epochs: [(0, 2), (1, 1), (2, 1)].into(), ..quorum(1) };
    let evidence = vec![promoting(0, 7002, Some(2)), role(7002, 2, Role::Master)];
    let (state, signals, _) = run(settled(), &q, evidence);
    assert_eq!(published(&state), Some((7002, 2)));
    assert!(signals.contains(&S::Flipped { new: 7002, epoch: 2, provisional: true }));
}

#[test]
fn role_answers_count_only_for_the_target_a_leader_promotes() {
    let q = quorum(5);
    let cases = vec![
        ("no promotion", vec![role(7002, 2, Role::Master)]),
        ("another node", vec![promoting(0, 7002, Some(2)), role(7003, 2, Role::Master)]),
        ("another epoch", vec![promoting(0, 7002, Some(2)), role(7002, 5, Role::Master)]),
        ("lower epoch", vec![promoting(0, 7002, Some(0)), role(7002, 0, Role::Master)]),
        ("the published node", vec![promoting(0, 7001, Some(2)), role(7001, 2, Role::Master)]),
    ];
    for (name, evidence) in cases {
        let (state, _, _) = run(settled(), &q, evidence);
        assert_eq!(published(&state), Some((7001, 1)), "{name}");
    }
}

/// Lost events: a `+promoted-slave` without the promotion before it still publishes, on the
/// node's own `ROLE`, confirmed at once.
#[test]
fn a_promoted_slave_alone_publishes_on_role_master() {
    let q = quorum(2);
    let promoted = Evidence::Promoted { from: 1, target: cand(7002, 2), at: Instant::now() };
    let (state, signals, actions) = run(settled(), &q, vec![promoted]);
    assert!(signals.is_empty());
    assert!(actions.iter().any(|a| matches!(a, Action::WatchRole { .. })));
    let (state, signals, _) = run(state, &q, vec![role(7002, 2, Role::Master)]);
    assert_eq!(signals, [S::Flipped { new: 7002, epoch: 2, provisional: false }]);
    assert!(!provisional(&state) && state.promotion.is_none());
}

#[test]
fn returning_nodes_are_signalled_only_outside_a_failover() {
    let q = quorum(2);
    let back = |port| Evidence::NodeBack { from: 1, node: node(port) };
    let (_, signals, _) = run(settled(), &q, vec![back(7003)]);
    assert_eq!(signals, [S::Returning { node: 7003, published: 7001 }]);
    let (_, signals, _) = run(settled(), &q, vec![back(7001)]);
    assert!(signals.is_empty(), "the published primary is not returning");
    let tried = Evidence::FailoverStarted { from: 0, coordinated: false, elected: false };
    let during = vec![tried, back(7003)];
    let (_, signals, _) = run(settled(), &q, during);
    assert!(signals.is_empty(), "a failover is in progress: {signals:?}");
    // The replica being promoted changes role: it is never taken for a returning primary.
    let promoting_it = vec![promoting(0, 7002, Some(2)), back(7002)];
    let (_, signals, _) = run(settled(), &q, promoting_it);
    assert_eq!(signals, [S::Promoting { old: 7001, new: Some(7002) }]);
    let (_, signals, _) = run(flipped(), &q, vec![back(7001)]);
    assert!(signals.is_empty(), "nothing returns while a flip is provisional");
}

#[test]
fn a_promotion_of_the_published_node_fences_nothing() {
    let (state, signals, _) = run(settled(), &quorum(2), vec![promoting(0, 7001, None)]);
    assert!(signals.is_empty(), "{signals:?}");
    assert!(state.promotion.as_ref().is_some_and(|p| p.fenced.is_none()));
}

#[test]
fn a_majority_of_another_node_replaces_a_provisional_flip() {
    let q = quorum(3);
    let (state, signals, _) = run(flipped(), &q, vec![report(1, 7003, 3), report(2, 7003, 3)]);
    assert_eq!(published(&state), Some((7003, 3)));
    assert!(!provisional(&state));
    assert_eq!(signals, [S::Flipped { new: 7003, epoch: 3, provisional: false }]);
}

/// Found with node-redis 5 (docs/decisions.md D6): after polestar's flip the master stayed in state
/// `failover` until Sentinel's `+switch-master`, so the Sentinel endpoint flagged the new
/// primary `failover_in_progress`, and node-redis, which skips such a master, came back 2.5 s
/// after the flip instead of at once.
#[test]
fn a_failover_is_of_the_published_primary_only_until_polestar_flips() {
    let failing = |from, port, epoch| Evidence::Report {
        from,
        primary: cand(port, epoch),
        failover_in_progress: true,
        replicas: Vec::new(),
        followers: Vec::new(),
    };
    let at = |epoch| quorum(epoch);
    assert!(!settled().failing_over_published(&at(1)), "no failover reported");
    // The leader (0) started a failover at epoch 2 (its +new-epoch).
    let mut q = at(1);
    q.epochs.insert(0, 2);
    let (state, _, _) = run(settled(), &q, vec![failing(0, 7001, 1)]);
    assert!(state.failing_over_published(&q), "the leader fails the published primary over");
    let (state, _, _) = run(state, &q, vec![promoting(0, 7002, Some(2))]);
    assert!(state.failing_over_published(&q), "promoting, not yet flipped");
    let (state, _, _) = run(state, &q, vec![role(7002, 2, Role::Master), failing(0, 7001, 1)]);
    assert_eq!(published(&state), Some((7002, 2)));
    assert!(!state.failing_over_published(&q), "flipped: the leader still names the old one");
    let evidence = vec![failing(0, 7002, 2), report(1, 7002, 2), report(2, 7002, 2)];
    let (state, _, _) = run(state, &q, evidence);
    assert!(!state.failing_over_published(&q), "the leader finishing, the others followed");
    // A failover-reporting Sentinel whose epoch is not known yet counts as one of the primary.
    let (state, _, _) = run(settled(), &at(1), vec![failing(0, 7001, 1)]);
    let mut unknown = at(1);
    unknown.epochs.remove(&0);
    assert!(state.failing_over_published(&unknown));
}

#[path = "trust_tests.rs"]
mod trust;

/// `from` reports `port` at `epoch` with `replicas` (port, healthy).
fn listing(from: SentinelId, port: u16, epoch: u64, replicas: &[(u16, bool)]) -> Evidence {
    let replicas = replicas
        .iter()
        .map(|&(p, healthy)| Replica {
            ip: node(p).ip,
            port: p,
            hostname: None,
            healthy,
            down: !healthy,
        })
        .collect();
    let primary = cand(port, epoch);
    Evidence::Report { from, primary, failover_in_progress: false, replicas, followers: Vec::new() }
}

#[test]
fn the_replicas_published_are_those_a_majority_of_the_sentinels_lists_name() {
    let q = quorum(1);
    let healthy = [(7002, true), (7003, true)];
    // Name, evidence after `settled()` (7001 at epoch 1), the replicas published (port, healthy).
    type Listed = Vec<(u16, bool)>;
    let cases: Vec<(&str, Vec<Evidence>, Listed)> = vec![
        (
            "all three agree",
            (0..3).map(|s| listing(s, 7001, 1, &healthy)).collect(),
            vec![(7002, true), (7003, true)],
        ),
        (
            "the last to report lists one more: not yet published",
            vec![
                listing(0, 7001, 1, &healthy),
                listing(1, 7001, 1, &healthy),
                listing(2, 7001, 1, &[(7002, true), (7003, true), (7009, true)]),
            ],
            vec![(7002, true), (7003, true)],
        ),
        (
            "one calls 7003 down, the last word: still healthy",
            vec![
                listing(0, 7001, 1, &healthy),
                listing(1, 7001, 1, &healthy),
                listing(2, 7001, 1, &[(7002, true), (7003, false)]),
            ],
            vec![(7002, true), (7003, true)],
        ),
        (
            "two call 7003 down",
            vec![
                listing(0, 7001, 1, &[(7002, true), (7003, false)]),
                listing(1, 7001, 1, &healthy),
                listing(2, 7001, 1, &[(7002, true), (7003, false)]),
            ],
            vec![(7002, true), (7003, false)],
        ),
        (
            "a list below the published epoch is not read",
            (0..3)
                .map(|s| listing(s, 7001, 1, &healthy))
                .chain((1..3).map(|s| listing(s, 7001, 0, &[(7009, true)])))
                .collect(),
            vec![(7002, true), (7003, true)],
        ),
        (
            "a Sentinel gone no longer counts",
            vec![
                listing(2, 7001, 1, &healthy),
                listing(0, 7001, 1, &[(7002, true)]),
                listing(1, 7001, 1, &healthy),
                Evidence::Gone { from: 1 },
            ],
            vec![(7002, true)],
        ),
    ];
    for (name, evidence, want) in cases {
        let (state, _, _) = run(settled(), &q, evidence);
        let got: Vec<(u16, bool)> = state.replicas.iter().map(|r| (r.port, r.healthy)).collect();
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn the_published_primary_is_never_one_of_its_replicas() {
    let q = quorum(1);
    let listed = [(7002, true), (7003, true)];
    let evidence = (0..3).map(|s| listing(s, 7001, 1, &listed)).collect();
    let (state, _, _) = run(settled(), &q, evidence);
    // A provisional flip to 7002: the Sentinels still list it as a replica of 7001.
    let flip = vec![promoting(0, 7002, Some(2)), role(7002, 2, Role::Master)];
    let (state, _, _) = run(state, &quorum(2), flip);
    assert_eq!(published(&state), Some((7002, 2)));
    let ports: Vec<u16> = state.replicas.iter().map(|r| r.port).collect();
    assert_eq!(ports, vec![7003], "7002 is the primary now");
}
