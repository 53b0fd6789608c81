//! Which replicas Sentinel may promote, read from `SENTINEL REPLICAS` the way Sentinel's own
//! `sentinelSelectSlave` reads its state: never one that is down or disconnected, that has not
//! answered a ping for 5 s or sent `INFO` within three periods, whose link to the primary has
//! been down too long, or whose `replica-priority` is 0; of the rest, the lowest priority wins,
//! then the highest replication offset, then the smallest run id.
//!
//! The offsets Sentinel compares are those of its last `INFO` of each replica: up to 10 s old,
//! and refreshed at its own pace while we wait. So among replicas of the same (best) priority
//! polestar cannot know which one Sentinel will pick when it fails over; it waits for all of
//! them ([`Choice::wait_for`]), and names the one Sentinel would pick now ([`Choice::likely`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

/// Sentinel skips a replica whose last ping reply is older than five ping periods.
const PING_VALIDITY: Duration = Duration::from_secs(5);
/// ... or whose last `INFO` is older than three info periods (of 10 s, the master not down).
const INFO_VALIDITY: Duration = Duration::from_secs(30);

/// One replica as a Sentinel describes it, with what the choice needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    pub addr: SocketAddr,
    pub flags: Vec<String>,
    pub priority: u64,
    /// `slave-repl-offset`: the offset Sentinel last read from the replica's `INFO`.
    pub offset: u64,
    pub runid: Option<String>,
    pub last_ping_reply: Duration,
    pub info_refresh: Duration,
    pub link_down: Duration,
}

impl Replica {
    /// Reads one `SENTINEL REPLICAS` record whose `ip` is an address; `None` for anything odd.
    pub fn from_record(r: &HashMap<String, String>) -> Option<Self> {
        let number = |keys: &[&str]| keys.iter().find_map(|k| r.get(*k)?.parse::<u64>().ok());
        let millis = |key: &str| Duration::from_millis(number(&[key]).unwrap_or(u64::MAX / 2));
        let ip = r.get("ip")?.parse().ok()?;
        let port = r.get("port")?.parse().ok()?;
        Some(Self {
            addr: SocketAddr::new(ip, port),
            flags: r.get("flags")?.split(',').map(str::to_string).collect(),
            priority: number(&["slave-priority", "replica-priority"])?,
            offset: number(&["slave-repl-offset", "replica-repl-offset"]).unwrap_or(0),
            runid: r.get("runid").filter(|id| !id.is_empty()).cloned(),
            last_ping_reply: millis("last-ok-ping-reply"),
            info_refresh: millis("info-refresh"),
            link_down: Duration::from_millis(number(&["master-link-down-time"]).unwrap_or(0)),
        })
    }

    /// Why Sentinel would not promote it, if it would not.
    pub fn unfit(&self, down_after: Duration) -> Option<&'static str> {
        let flagged = |f: &str| self.flags.iter().any(|x| x == f);
        if flagged("s_down") || flagged("o_down") {
            Some("down")
        } else if flagged("disconnected") {
            Some("disconnected")
        } else if self.priority == 0 {
            Some("replica-priority 0")
        } else if self.last_ping_reply > PING_VALIDITY {
            Some("no recent ping reply")
        } else if self.info_refresh > INFO_VALIDITY {
            Some("no recent INFO")
        } else if self.link_down > down_after * 10 {
            Some("its link to the primary is down")
        } else {
            None
        }
    }
}

/// The replicas a failover may promote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Sentinel's pick by what it knows now.
    pub likely: SocketAddr,
    /// Every replica Sentinel may pick by the time it fails over (the best priority's), the
    /// likely one first.
    pub wait_for: Vec<SocketAddr>,
}

/// The choice among `replicas`, or why there is none (every replica and why it is unfit).
pub fn choose(replicas: &[Replica], down_after: Duration) -> Result<Choice, String> {
    let mut fit: Vec<&Replica> =
        replicas.iter().filter(|r| r.unfit(down_after).is_none()).collect();
    if fit.is_empty() {
        return Err(why_none(replicas, down_after));
    }
    fit.sort_by(|a, b| {
        let runid = |r: &Replica| r.runid.clone().unwrap_or_else(|| "\u{10ffff}".into());
        a.priority.cmp(&b.priority).then(b.offset.cmp(&a.offset)).then(runid(a).cmp(&runid(b)))
    });
    let best = fit[0].priority;
    let wait_for = fit.iter().take_while(|r| r.priority == best).map(|r| r.addr).collect();
    Ok(Choice { likely: fit[0].addr, wait_for })
}

/// The first replica of `choice` Sentinel may promote that is being handed off (`out`): it is
/// about to be stopped, so a switchover now would promote a node on its way down. One that is
/// stopped already is no candidate (Sentinel finds it down or disconnected), and one with a
/// worse priority is never Sentinel's pick while a better one is fit.
pub fn handed_off_candidate(choice: &Choice, out: &[SocketAddr]) -> Option<SocketAddr> {
    choice.wait_for.iter().find(|r| out.contains(r)).copied()
}

fn why_none(replicas: &[Replica], down_after: Duration) -> String {
    if replicas.is_empty() {
        return "Sentinel lists no replica".into();
    }
    let each = replicas.iter().map(|r| format!("{} {}", r.addr, r.unfit(down_after).unwrap_or("")));
    each.collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use super::*;

    fn replica(port: u16, priority: u64, offset: u64, runid: &str) -> Replica {
        Replica {
            addr: SocketAddr::from(([10, 0, 0, 1], port)),
            flags: vec!["slave".into()],
            priority,
            offset,
            runid: Some(runid.into()),
            last_ping_reply: Duration::from_millis(200),
            info_refresh: Duration::from_secs(3),
            link_down: Duration::ZERO,
        }
    }

    const DOWN_AFTER: Duration = Duration::from_secs(5);

    fn ports(addrs: &[SocketAddr]) -> Vec<u16> {
        addrs.iter().map(|a| a.port()).collect()
    }

    #[test]
    fn sentinel_prefers_the_lowest_priority_then_the_offset_then_the_run_id() {
        let table = [
            (vec![replica(1, 100, 5, "b"), replica(2, 10, 1, "a")], 2, vec![2]),
            (vec![replica(1, 100, 5, "b"), replica(2, 100, 9, "a")], 2, vec![2, 1]),
            (vec![replica(1, 100, 9, "b"), replica(2, 100, 9, "a")], 2, vec![2, 1]),
            (vec![replica(1, 100, 9, "a"), replica(2, 100, 9, "b")], 1, vec![1, 2]),
        ];
        for (replicas, likely, wait_for) in table {
            let choice = choose(&replicas, DOWN_AFTER).unwrap();
            assert_eq!(choice.likely.port(), likely, "{replicas:?}");
            assert_eq!(ports(&choice.wait_for), wait_for, "{replicas:?}");
        }
    }

    #[test]
    fn down_disconnected_silent_and_priority_zero_replicas_are_never_candidates() {
        let mut down = replica(1, 1, 99, "a");
        down.flags.push("s_down".into());
        let mut gone = replica(2, 1, 99, "b");
        gone.flags.push("disconnected".into());
        let never = replica(3, 0, 99, "c");
        let mut silent = replica(4, 1, 99, "d");
        silent.last_ping_reply = Duration::from_secs(6);
        let mut stale = replica(5, 1, 99, "e");
        stale.info_refresh = Duration::from_secs(31);
        let mut unlinked = replica(6, 1, 99, "f");
        unlinked.link_down = Duration::from_secs(51);
        let fine = replica(7, 100, 1, "g");
        let all = vec![down, gone, never, silent, stale, unlinked, fine];
        let choice = choose(&all, DOWN_AFTER).unwrap();
        assert_eq!(ports(&choice.wait_for), vec![7]);
        let why = choose(&all[..6], DOWN_AFTER).unwrap_err();
        assert!(why.contains("10.0.0.1:1 down") && why.contains("replica-priority 0"), "{why}");
        assert_eq!(choose(&[], DOWN_AFTER).unwrap_err(), "Sentinel lists no replica");
    }

    #[test]
    fn a_switchover_never_waits_for_a_replica_about_to_be_stopped() {
        let at = |port| SocketAddr::from(([10, 0, 0, 1], port));
        let down = || {
            let mut r = replica(3, 100, 99, "c");
            r.flags.push("s_down".into());
            r
        };
        let table: [(Vec<Replica>, Vec<u16>, Option<u16>); 6] = [
            (vec![replica(1, 100, 5, "a"), replica(2, 100, 5, "b")], vec![], None),
            (vec![replica(1, 100, 5, "a"), replica(2, 100, 5, "b")], vec![2], Some(2)),
            (vec![replica(1, 100, 5, "a"), replica(2, 100, 9, "b")], vec![1], Some(1)),
            // A worse priority: never Sentinel's pick while the better one is fit.
            (vec![replica(1, 10, 5, "a"), replica(2, 100, 9, "b")], vec![2], None),
            // Stopped already: Sentinel finds it down, no candidate.
            (vec![replica(1, 100, 5, "a"), down()], vec![3], None),
            // Of another master, or gone from the list.
            (vec![replica(1, 100, 5, "a")], vec![7], None),
        ];
        for (replicas, out, expected) in table {
            let choice = choose(&replicas, DOWN_AFTER).unwrap();
            let out: Vec<SocketAddr> = out.into_iter().map(at).collect();
            assert_eq!(handed_off_candidate(&choice, &out), expected.map(at), "{out:?}");
        }
    }

    #[test]
    fn records_read_both_spellings_and_skip_odd_ones() {
        let record = |pairs: &[(&str, &str)]| {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>()
        };
        let redis = record(&[
            ("ip", "10.0.0.2"),
            ("port", "6379"),
            ("flags", "slave"),
            ("slave-priority", "100"),
            ("slave-repl-offset", "42"),
            ("runid", "abc"),
            ("last-ok-ping-reply", "300"),
            ("info-refresh", "1200"),
            ("master-link-down-time", "0"),
        ]);
        let r = Replica::from_record(&redis).unwrap();
        assert_eq!((r.priority, r.offset, r.runid.as_deref()), (100, 42, Some("abc")));
        assert!(r.unfit(DOWN_AFTER).is_none());
        let mut valkey = redis.clone();
        valkey.remove("slave-priority");
        valkey.insert("replica-priority".into(), "7".into());
        assert_eq!(Replica::from_record(&valkey).unwrap().priority, 7);
        let mut hostname = redis.clone();
        hostname.insert("ip".into(), "r1.lan".into());
        assert!(Replica::from_record(&hostname).is_none());
        let mut no_ping = redis;
        no_ping.remove("last-ok-ping-reply");
        assert_eq!(
            Replica::from_record(&no_ping).unwrap().unfit(DOWN_AFTER),
            Some("no recent ping reply")
        );
    }
}
