use std::time::Duration;

use super::*;
use crate::readiness::facts::{MasterFacts, SentinelFacts};

fn replica(addr: &str) -> ReplicaFacts {
    ReplicaFacts {
        addr: addr.into(),
        flags: vec!["slave".into()],
        link_ok: true,
        priority: 100,
        down_for: None,
    }
}

fn answer(replicas: Vec<ReplicaFacts>) -> SentinelAnswer {
    SentinelAnswer {
        tilt: Ok(false),
        ckquorum: Ok(()),
        master: Ok(MasterFacts { primary: "10.0.0.1:6379".into(), epoch: 3 }),
        replicas: Ok(replicas),
    }
}

/// Three Sentinels that agree, two healthy replicas, no lag.
fn healthy() -> Facts {
    let replicas = vec![replica("10.0.0.2:6379"), replica("10.0.0.3:6379")];
    Facts {
        configured: 3,
        sentinels: (1..=3)
            .map(|i| SentinelFacts {
                addr: format!("10.0.0.{i}:26379"),
                answer: Ok(answer(replicas.clone())),
            })
            .collect(),
        lags: [("10.0.0.2:6379".into(), 0), ("10.0.0.3:6379".into(), 10)].into(),
        disagreeing_for: Duration::ZERO,
    }
}

fn settings() -> Readiness {
    Readiness {
        max_lag: 1 << 20,
        stale_after: Duration::from_secs(60),
        interval: Duration::from_secs(1),
    }
}

fn each_answer(facts: &mut Facts, f: impl Fn(&mut SentinelAnswer)) {
    for s in &mut facts.sentinels {
        if let Ok(a) = &mut s.answer {
            f(a);
        }
    }
}

fn each_replica(facts: &mut Facts, f: impl Fn(&mut ReplicaFacts)) {
    each_answer(facts, |a| a.replicas.iter_mut().flatten().for_each(&f));
}

fn reasons(facts: &Facts) -> Vec<Reason> {
    judge(facts, &settings()).blockers.iter().map(|b| b.reason).collect()
}

fn detail(facts: &Facts, reason: Reason) -> String {
    let verdict = judge(facts, &settings());
    let blocker = verdict.blockers.iter().find(|b| b.reason == reason);
    blocker.map(|b| b.detail.clone()).unwrap_or_else(|| panic!("no {reason} in {verdict:?}"))
}

#[test]
fn a_healthy_master_is_ready() {
    let verdict = judge(&healthy(), &settings());
    assert_eq!(verdict, Verdict { ready: true, blockers: vec![] });
}

#[test]
fn each_condition_sets_its_reason_alone() {
    type Inject = fn(&mut Facts);
    let table: [(&str, Inject, &[Reason]); 13] = [
        (
            "a disagreement as after every failover, not yet lasting",
            |f| {
                f.disagreeing_for = DISAGREE_GRACE - Duration::from_millis(1);
                if let Ok(a) = &mut f.sentinels[1].answer {
                    a.master = Ok(MasterFacts { primary: "10.0.0.2:6379".into(), epoch: 4 });
                }
            },
            &[],
        ),
        (
            "two of three Sentinels down",
            |f| {
                f.sentinels[1].answer = Err("connection refused".into());
                f.sentinels[2].answer = Err("no answer within 1s".into());
            },
            &[Reason::SentinelsUnreachable],
        ),
        (
            "one of three down is still a majority",
            |f| {
                f.sentinels[0].answer = Err("connection refused".into());
            },
            &[],
        ),
        (
            "CKQUORUM fails on one",
            |f| {
                if let Ok(a) = &mut f.sentinels[0].answer {
                    a.ckquorum = Err("NOQUORUM 1 usable Sentinels".into());
                }
            },
            &[Reason::Ckquorum],
        ),
        (
            "a Sentinel in TILT",
            |f| {
                if let Ok(a) = &mut f.sentinels[2].answer {
                    a.tilt = Ok(true);
                }
            },
            &[Reason::SentinelTilt],
        ),
        (
            "INFO garbage",
            |f| {
                if let Ok(a) = &mut f.sentinels[2].answer {
                    a.tilt = Err("no sentinel_tilt field in \"hello\"".into());
                }
            },
            &[Reason::SentinelTilt],
        ),
        (
            "another primary",
            |f| {
                f.disagreeing_for = DISAGREE_GRACE;
                if let Ok(a) = &mut f.sentinels[1].answer {
                    a.master = Ok(MasterFacts { primary: "10.0.0.2:6379".into(), epoch: 3 });
                }
            },
            &[Reason::SentinelsDisagree],
        ),
        (
            "another epoch",
            |f| {
                f.disagreeing_for = DISAGREE_GRACE;
                if let Ok(a) = &mut f.sentinels[1].answer {
                    a.master = Ok(MasterFacts { primary: "10.0.0.1:6379".into(), epoch: 4 });
                }
            },
            &[Reason::SentinelsDisagree],
        ),
        (
            "every replica down",
            |f| {
                each_replica(f, |r| {
                    r.flags = vec!["s_down".into(), "slave".into(), "disconnected".into()]
                });
            },
            &[Reason::NoPromotableReplica],
        ),
        (
            "every link err",
            |f| each_replica(f, |r| r.link_ok = false),
            &[Reason::NoPromotableReplica],
        ),
        (
            "priority 0 everywhere",
            |f| each_replica(f, |r| r.priority = 0),
            &[Reason::NoPromotableReplica],
        ),
        (
            "every replica lagging",
            |f| {
                f.lags.values_mut().for_each(|l| *l = 5 << 20);
            },
            &[Reason::NoPromotableReplica],
        ),
        (
            "a stale entry beside a good replica",
            |f| {
                each_answer(f, |a| {
                    if let Ok(r) = &mut a.replicas {
                        r.push(ReplicaFacts {
                            flags: vec!["s_down".into(), "slave".into(), "disconnected".into()],
                            down_for: Some(Duration::from_secs(61)),
                            ..replica("10.0.0.9:6379")
                        });
                    }
                });
            },
            &[Reason::StaleReplicas],
        ),
    ];
    for (what, inject, expected) in table {
        let mut facts = healthy();
        inject(&mut facts);
        assert_eq!(reasons(&facts), expected, "{what}");
        assert_eq!(judge(&facts, &settings()).ready, expected.is_empty(), "{what}");
    }
}

#[test]
fn one_promotable_replica_is_enough() {
    let mut facts = healthy();
    each_replica(&mut facts, |r| {
        if r.addr == "10.0.0.2:6379" {
            r.priority = 0;
        }
    });
    assert_eq!(reasons(&facts), []);
    facts.lags.insert("10.0.0.3:6379".into(), (1 << 20) + 1);
    assert_eq!(reasons(&facts), [Reason::NoPromotableReplica]);
    let why = detail(&facts, Reason::NoPromotableReplica);
    assert!(why.contains("10.0.0.2:6379 has replica-priority 0"), "{why}");
    assert!(why.contains("10.0.0.3:6379 lags 1048577 bytes (readiness.max_lag is 1MB)"), "{why}");
}

#[test]
fn a_replica_promotable_in_one_sentinels_view_counts() {
    let mut facts = healthy();
    each_replica(&mut facts, |r| r.link_ok = false);
    if let Ok(a) = &mut facts.sentinels[0].answer
        && let Ok(r) = &mut a.replicas
    {
        r[0].link_ok = true;
    }
    assert_eq!(reasons(&facts), []);
}

#[test]
fn an_s_down_entry_is_stale_only_after_the_window() {
    let mut facts = healthy();
    each_replica(&mut facts, |r| {
        if r.addr == "10.0.0.3:6379" {
            r.flags = vec!["s_down".into(), "slave".into(), "disconnected".into()];
            r.down_for = Some(Duration::from_secs(59));
        }
    });
    assert_eq!(reasons(&facts), []);
    each_replica(&mut facts, |r| r.down_for = r.down_for.map(|_| Duration::from_secs(60)));
    assert_eq!(detail(&facts, Reason::StaleReplicas), "10.0.0.3:6379 has been s_down for 60s");
}

#[test]
fn details_name_the_sentinels_and_what_they_said() {
    let mut facts = healthy();
    facts.sentinels[1].answer = Err("connection refused".into());
    facts.sentinels[2].answer = Err("no answer within 1s".into());
    assert_eq!(
        detail(&facts, Reason::SentinelsUnreachable),
        "1 of 3 configured Sentinels reachable (a majority is 2): 10.0.0.2:26379: connection \
         refused; 10.0.0.3:26379: no answer within 1s"
    );
    let mut facts = Facts { disagreeing_for: DISAGREE_GRACE, ..healthy() };
    if let Ok(a) = &mut facts.sentinels[1].answer {
        a.master = Err("ERR No such master with that name".into());
    }
    assert_eq!(
        detail(&facts, Reason::SentinelsDisagree),
        "10.0.0.1:26379, 10.0.0.3:26379 say 10.0.0.1:6379 at epoch 3; 10.0.0.2:26379 say no \
         primary (ERR No such master with that name)"
    );
}

#[test]
fn several_blockers_are_listed_in_a_stable_order() {
    let mut facts = healthy();
    each_answer(&mut facts, |a| {
        a.tilt = Ok(true);
        a.ckquorum = Err("NOQUORUM".into());
    });
    each_replica(&mut facts, |r| r.priority = 0);
    assert_eq!(
        reasons(&facts),
        [Reason::Ckquorum, Reason::SentinelTilt, Reason::NoPromotableReplica]
    );
}

#[test]
fn no_replicas_at_all_is_no_promotable_replica() {
    let mut facts = healthy();
    each_answer(&mut facts, |a| a.replicas = Ok(vec![]));
    assert_eq!(detail(&facts, Reason::NoPromotableReplica), "no replicas");
}

#[test]
fn no_sentinel_reachable_is_one_blocker_not_six() {
    let mut facts = healthy();
    facts.sentinels.iter_mut().for_each(|s| s.answer = Err("refused".into()));
    assert_eq!(reasons(&facts), [Reason::SentinelsUnreachable]);
}
