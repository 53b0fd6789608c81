//! An empty primary: one that keeps nothing over a restart, and one that just came back so.
//!
//! A primary with neither AOF nor RDB, restarted faster than the Sentinels' `down-after`
//! (a crash under systemd's `Restart=`, a container restarted in place), comes back empty as
//! the same master: no failover, and its replicas, which still hold the data, reconnect and
//! full-sync the empty dataset. Measured in this project's lab (kill -9, restarted 0.3 s
//! later, a fast writer running): 38,828 acknowledged writes lost, every one written before
//! the crash, no failover, and polestar said nothing. The Redis documentation warns against
//! exactly this ("Safety of replication when master has persistence turned off"); caches run
//! so on purpose. So the readiness verdict carries a warning ([`no_persistence`]) while the
//! published primary runs so, and a primary seen again with a new `run_id` and nothing loaded
//! at its start, after its replicas held its data ([`restarted_empty`]), is an event, a
//! metric and a log line. Both are pure functions of what the poll read ([`PrimaryFacts`]).
//!
//! polestar does not try to keep the replicas' data by failing over first: a replica
//! reconnects within a second of the crash (its replication cron) and has flushed its data as
//! soon as the empty full sync arrives, while polestar's poll looks at the primary once per
//! `readiness.interval` and a Sentinel failover takes longer than that (docs/operating.md,
//! "An empty primary", gives the race as measured and what the operator must configure).

use std::time::Duration;

use super::facts::PrimaryFacts;
use crate::config::duration;

/// The quickest restart a primary may get: systemd's default `RestartSec` (100 ms); a
/// redis-server without data answers within milliseconds of its start. Sentinels whose
/// `down-after-milliseconds` is shorter than this would notice the restart and fail over.
pub const QUICKEST_RESTART: Duration = Duration::from_millis(100);

/// Without `CONFIG GET save` (an ACL that does not grant it), a node that has not saved an RDB
/// in this long since it started, with writes since, is taken for one without save points:
/// `redis.conf`'s default rules save within an hour of any write.
pub const NO_SAVE_FOR: Duration = Duration::from_secs(3600);

/// The `no_persistence` warning's detail, when the published primary keeps nothing over a
/// restart and the Sentinels (`down_after`: the shortest of the reachable ones') would not
/// fail over before a quick restart brings it back empty.
pub fn no_persistence(primary: &PrimaryFacts, down_after: Option<Duration>) -> Option<String> {
    let p = &primary.persistence;
    if p.aof || p.save_points == Some(true) || down_after.is_some_and(|d| d < QUICKEST_RESTART) {
        return None;
    }
    let kept = match p.save_points {
        Some(_) => "has neither AOF nor RDB persistence (appendonly no, save \"\")".to_string(),
        None if p.saves == Some(0) && p.changes > 0 && primary.uptime >= NO_SAVE_FOR => format!(
            "has no AOF and has saved no RDB in the {} since it started, with {} writes since \
             (its save setting could not be read: CONFIG GET save was refused)",
            duration::format(primary.uptime),
            p.changes
        ),
        None => return None,
    };
    let within = match down_after {
        Some(d) => format!("within down-after-milliseconds ({})", duration::format(d)),
        None => "within down-after-milliseconds".to_string(),
    };
    Some(format!(
        "{} {kept}: a crash-restart {within} is no failover; it comes back empty and its \
         replicas full-sync the empty dataset",
        primary.addr
    ))
}

/// A published primary that came back empty: what was lost, and who held it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmptyRestart {
    pub primary: String,
    pub run_id_before: String,
    pub run_id: String,
    /// Keys when it was last seen before the restart, and now.
    pub keys_before: u64,
    pub keys: u64,
    /// The replicas that held its data when it was last seen before the restart.
    pub replicas: Vec<String>,
}

/// Whether `now` is `before` (the same published primary, seen a round earlier) come back with
/// a new `run_id` and nothing loaded at its start, after it had keys and replicas that held
/// them. Without `rdb_last_load_keys_loaded` (before 7.0), fewer keys than before stand for it.
pub fn restarted_empty(before: &PrimaryFacts, now: &PrimaryFacts) -> Option<EmptyRestart> {
    let empty = now.loaded_keys.map_or(now.keys < before.keys, |loaded| loaded == 0);
    let same_node = before.addr == now.addr && now.master;
    let held = before.keys > 0 && !before.fed_replicas.is_empty();
    (same_node && before.run_id != now.run_id && held && empty).then(|| EmptyRestart {
        primary: now.addr.clone(),
        run_id_before: before.run_id.clone(),
        run_id: now.run_id.clone(),
        keys_before: before.keys,
        keys: now.keys,
        replicas: before.fed_replicas.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readiness::facts::Persistence;

    fn primary(aof: bool, save_points: Option<bool>) -> PrimaryFacts {
        PrimaryFacts {
            addr: "10.0.0.1:6379".into(),
            master: true,
            run_id: "a".repeat(40),
            uptime: Duration::from_secs(600),
            keys: 5000,
            loaded_keys: Some(0),
            persistence: Persistence { aof, save_points, saves: Some(0), changes: 9000 },
            fed_replicas: vec!["10.0.0.2:6379".into(), "10.0.0.3:6379".into()],
        }
    }

    #[test]
    fn a_primary_that_keeps_nothing_is_a_warning_unless_a_restart_would_fail_over() {
        let s = Duration::from_secs;
        let long_up = |mut p: PrimaryFacts| {
            p.uptime = NO_SAVE_FOR;
            p
        };
        let table: [(&str, PrimaryFacts, Option<Duration>, bool); 10] = [
            ("no AOF, save \"\"", primary(false, Some(false)), Some(s(30)), true),
            ("down-after unknown", primary(false, Some(false)), None, true),
            ("AOF", primary(true, Some(false)), Some(s(30)), false),
            ("RDB save points", primary(false, Some(true)), Some(s(30)), false),
            ("AOF and RDB", primary(true, Some(true)), Some(s(30)), false),
            (
                "down-after shorter than any restart",
                primary(false, Some(false)),
                Some(Duration::from_millis(50)),
                false,
            ),
            ("save unreadable, up 10 minutes", primary(false, None), Some(s(30)), false),
            ("save unreadable, up an hour, never saved", long_up(primary(false, None)), None, true),
            (
                "save unreadable, up an hour, saved",
                long_up(PrimaryFacts {
                    persistence: Persistence { saves: Some(3), ..primary(false, None).persistence },
                    ..primary(false, None)
                }),
                None,
                false,
            ),
            (
                "save unreadable, no rdb_saves (6.2)",
                long_up(PrimaryFacts {
                    persistence: Persistence { saves: None, ..primary(false, None).persistence },
                    ..primary(false, None)
                }),
                None,
                false,
            ),
        ];
        for (what, facts, down_after, warned) in table {
            let got = no_persistence(&facts, down_after);
            assert_eq!(got.is_some(), warned, "{what}: {got:?}");
        }
        let detail = no_persistence(&primary(false, Some(false)), Some(s(30))).expect("warned");
        assert!(detail.starts_with("10.0.0.1:6379 has neither AOF nor RDB"), "{detail}");
        assert!(detail.contains("(30s)") && detail.contains("full-sync the empty"), "{detail}");
        let inferred = no_persistence(&long_up(primary(false, None)), None).expect("warned");
        assert!(inferred.contains("CONFIG GET save was refused"), "{inferred}");
    }

    #[test]
    fn a_new_run_id_with_nothing_loaded_after_replicas_held_the_data_is_an_empty_restart() {
        let before = primary(false, Some(false));
        let restarted = |loaded: Option<u64>, keys: u64| PrimaryFacts {
            run_id: "b".repeat(40),
            keys,
            loaded_keys: loaded,
            uptime: Duration::from_secs(1),
            fed_replicas: vec![],
            ..before.clone()
        };
        let no_replicas = PrimaryFacts { fed_replicas: vec![], ..before.clone() };
        let no_keys = PrimaryFacts { keys: 0, ..before.clone() };
        let elsewhere = PrimaryFacts { addr: "10.0.0.2:6379".into(), ..restarted(Some(0), 3) };
        let replica_now = PrimaryFacts { master: false, ..restarted(Some(0), 3) };
        let table: [(&str, &PrimaryFacts, PrimaryFacts, bool); 9] = [
            ("empty, writes already coming in", &before, restarted(Some(0), 120), true),
            ("loaded its dump", &before, restarted(Some(4990), 4990), false),
            ("the same process", &before, PrimaryFacts { keys: 0, ..before.clone() }, false),
            ("6.2: fewer keys than before", &before, restarted(None, 120), true),
            ("6.2: as many keys", &before, restarted(None, 5000), false),
            ("no replica held the data", &no_replicas, restarted(Some(0), 0), false),
            ("nothing to lose", &no_keys, restarted(Some(0), 0), false),
            ("another node published since", &before, elsewhere, false),
            ("it follows another node now", &before, replica_now, false),
        ];
        for (what, before, now, event) in table {
            let got = restarted_empty(before, &now);
            assert_eq!(got.is_some(), event, "{what}: {got:?}");
        }
        let got = restarted_empty(&before, &restarted(Some(0), 120)).expect("an empty restart");
        assert_eq!((got.keys_before, got.keys), (5000, 120));
        assert_eq!(got.replicas, ["10.0.0.2:6379", "10.0.0.3:6379"]);
        assert_eq!((got.run_id_before.len(), got.run_id.as_str()), (40, "b".repeat(40).as_str()));
    }
}
