//! Sentinel's wire text turned into typed values: pub/sub events and the replies of
//! `SENTINEL MASTERS`, `REPLICAS`, `SENTINELS` and `get-master-addr-by-name`.
//!
//! Nothing here trusts the peer: an odd reply is a `None` or an error, never a panic.

use std::borrow::Cow;
use std::collections::HashMap;

use redis::Value;

use crate::node::reply::Record;

/// `<host> <port>` as Sentinel reports an instance (an IP, or a hostname with
/// `announce-hostnames yes`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Addr {
    pub host: String,
    pub port: u16,
}

impl Addr {
    fn parse(host: &str, port: &str) -> Option<Self> {
        let port = port.parse().ok().filter(|p| *p != 0)?;
        (!host.is_empty()).then(|| Self { host: host.to_string(), port })
    }
}

/// The events polestar acts on, from the channel name and payload of a `PSUBSCRIBE *` message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// `+new-epoch <epoch>`: the Sentinel's current epoch grew (it starts a failover, right
    /// before its `+try-failover`, or it learnt of a higher epoch).
    NewEpoch(u64),
    /// `+vote-for-leader <runid> <epoch>`: it voted in the election of `epoch`, for any of its
    /// masters (the payload names none), so the epoch bounds what may be published but is
    /// never bound to a failover.
    Voted(u64),
    /// This Sentinel started a failover (`+try-failover`) or won its election and leads it
    /// (`+elected-leader`, `elected`: it selects the replica at its next timer tick).
    FailoverStarted { master: String, elected: bool },
    /// The leader chose the replica and is promoting it (`+selected-slave`,
    /// `+failover-state-send-slaveof-noone`): time to fence the old primary.
    /// `sent`: the leader has sent `SLAVEOF NO ONE` (`+failover-state-send-slaveof-noone`),
    /// so the replica may answer `ROLE` master before `+promoted-slave` is announced.
    Promoting { master: String, replica: Addr, sent: bool },
    /// `+promoted-slave`: the chosen replica confirmed it is a master.
    Promoted { master: String, replica: Addr },
    /// `+switch-master <name> <old-ip> <old-port> <new-ip> <new-port>`.
    Switched { master: String, old: Addr, new: Addr },
    /// The failover is over, finished or aborted.
    FailoverEnded { master: String, aborted: bool },
    /// A node of the master is back or changed role (`-sdown`, `+convert-to-slave`,
    /// `+role-change`, `+reboot` of a replica): an old primary may be returning.
    /// `converted_to`: for `+convert-to-slave`, the primary this Sentinel just told the node
    /// to replicate from (the `@ <master-name> <ip> <port>` part).
    NodeBack { master: String, node: Addr, converted_to: Option<Addr> },
    /// `+sdown`/`-sdown`/`+odown`/`-odown` of a master itself (`master <name> <ip> <port>`,
    /// `+odown` with `#quorum N/M`). Shown to subscribers; it also asks for a reconciliation,
    /// as [`Event::Changed`] does.
    MasterDown { master: String, node: Addr, down: Down },
    /// Anything else about a master that a reconciliation should look at.
    Changed { master: String },
    /// Something about this Sentinel as a whole (`+monitor`, `-monitor`, `+reset-master`).
    Topology,
}

/// Which of a master's down states began or ended, as Sentinel names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Down {
    /// `o_down` (the quorum agrees) rather than `s_down` (this Sentinel's own view).
    pub objective: bool,
    /// Began (`+`) or ended (`-`).
    pub began: bool,
    /// `+odown`'s `N/M` (`#quorum N/M`), when given.
    pub quorum: Option<String>,
}

impl Down {
    /// The channel name: `+sdown`, `-sdown`, `+odown` or `-odown`.
    pub fn channel(&self) -> &'static str {
        match (self.began, self.objective) {
            (true, false) => "+sdown",
            (false, false) => "-sdown",
            (true, true) => "+odown",
            (false, true) => "-odown",
        }
    }
}

/// `<type> <name> <ip> <port> [@ <master-name> <master-ip> <master-port>]`
#[derive(Debug, PartialEq, Eq)]
struct Instance<'a> {
    kind: &'a str,
    addr: Option<Addr>,
    /// The master this instance belongs to (itself for a master).
    master: &'a str,
    /// That master's address as this Sentinel knows it (for a replica, the `@` part).
    master_addr: Option<Addr>,
}

fn instance(payload: &str) -> Option<Instance<'_>> {
    let words: Vec<&str> = payload.split_whitespace().collect();
    let (kind, name) = (*words.first()?, *words.get(1)?);
    let addr = Addr::parse(words.get(2)?, words.get(3)?);
    let (master, master_addr) = match (kind, words.get(4)) {
        ("master", _) => (name, addr.clone()),
        (_, Some(&"@")) => {
            let at = words.get(6).zip(words.get(7)).and_then(|(h, p)| Addr::parse(h, p));
            (*words.get(5)?, at)
        }
        _ => return None,
    };
    Some(Instance { kind, addr, master, master_addr })
}

impl Event {
    /// Parses one event; `None` for channels polestar does not act on or malformed payloads.
    pub fn parse(channel: &str, payload: &str) -> Option<Self> {
        match channel {
            "+new-epoch" => payload.trim().parse().ok().map(Event::NewEpoch),
            "+vote-for-leader" => payload.split_whitespace().nth(1)?.parse().ok().map(Event::Voted),
            "+switch-master" => switched(payload),
            "+monitor" | "-monitor" | "+reset-master" => Some(Event::Topology),
            _ => instance_event(channel, payload, instance(payload)?),
        }
    }
}

/// The event an instance channel carries: one match over Sentinel's channels, as long as the
/// list of those polestar reads.
fn instance_event(channel: &str, payload: &str, i: Instance<'_>) -> Option<Event> {
    let master = i.master.to_string();
    let event = match channel {
        "+sdown" | "-sdown" | "+odown" | "-odown" if i.kind == "master" => {
            let quorum = payload.split_once("#quorum ").map(|(_, q)| q.trim().to_string());
            let (began, objective) = (channel.starts_with('+'), channel.ends_with("odown"));
            let down = Down { objective, began, quorum: quorum.filter(|q| !q.is_empty()) };
            match i.addr {
                Some(node) => Event::MasterDown { master, node, down },
                None => Event::Changed { master },
            }
        }
        "+try-failover" | "+elected-leader" => {
            Event::FailoverStarted { master, elected: channel == "+elected-leader" }
        }
        "+selected-slave" | "+failover-state-send-slaveof-noone" if i.kind == "slave" => {
            let sent = channel == "+failover-state-send-slaveof-noone";
            Event::Promoting { master, replica: i.addr?, sent }
        }
        "+promoted-slave" if i.kind == "slave" => Event::Promoted { master, replica: i.addr? },
        "+failover-end" | "+failover-end-for-timeout" => {
            Event::FailoverEnded { master, aborted: false }
        }
        c if c.starts_with("-failover-abort") => Event::FailoverEnded { master, aborted: true },
        "-sdown" | "+convert-to-slave" | "+role-change" | "+reboot" if i.kind == "slave" => {
            let converted = channel == "+convert-to-slave";
            let converted_to = i.master_addr.filter(|_| converted);
            Event::NodeBack { master, node: i.addr?, converted_to }
        }
        "+sdown"
        | "-sdown"
        | "+odown"
        | "-odown"
        | "+role-change"
        | "+config-update-from"
        | "+convert-to-slave"
        | "+slave"
        | "+sentinel"
        | "+failover-state-reconf-slaves"
        | "+slave-reconf-done"
        | "-role-change"
        | "+reboot" => Event::Changed { master },
        _ => return None,
    };
    Some(event)
}

fn switched(payload: &str) -> Option<Event> {
    let w: Vec<&str> = payload.split_whitespace().collect();
    let [name, old_host, old_port, new_host, new_port] = w.as_slice() else { return None };
    Some(Event::Switched {
        master: name.to_string(),
        old: Addr::parse(old_host, old_port)?,
        new: Addr::parse(new_host, new_port)?,
    })
}

/// The text of a reply element, whatever RESP type carried it.
pub fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

/// One instance record of `SENTINEL MASTERS/REPLICAS/SENTINELS`: a RESP3 map or a RESP2 flat
/// list of alternating keys and values.
pub fn record(value: &Value) -> Option<HashMap<String, String>> {
    let pairs: Vec<(&Value, &Value)> = match value {
        Value::Map(m) => m.iter().map(|(k, v)| (k, v)).collect(),
        Value::Array(a) if a.len() % 2 == 0 => a.chunks(2).map(|c| (&c[0], &c[1])).collect(),
        _ => return None,
    };
    pairs.into_iter().map(|(k, v)| Some((text(k)?, text(v).unwrap_or_default()))).collect()
}

/// A list of records; records that do not parse are skipped.
pub fn records(value: &Value) -> Vec<HashMap<String, String>> {
    match value {
        Value::Array(items) | Value::Set(items) => items.iter().filter_map(record).collect(),
        _ => Vec::new(),
    }
}

/// A record's fields by name: a [`record`]'s map, or a [`Borrowed`] view of the reply.
pub trait Fields {
    fn field(&self, name: &str) -> Option<Cow<'_, str>>;
}

impl Fields for HashMap<String, String> {
    fn field(&self, name: &str) -> Option<Cow<'_, str>> {
        self.get(name).map(|v| Cow::Borrowed(v.as_str()))
    }
}

/// One record read in place from a [`RawConn`](crate::node::RawConn)'s replies, without
/// copying it into a map: `SENTINEL MASTERS` lists some 40 fields of every master, and a full
/// reconciliation reads it for a thousand masters every ten seconds on each link; only a
/// handful of the fields are ever read. Reads as [`record`] does (a value that is no text
/// reads as empty), except that a record with a key that is no text is not refused as a whole
/// (that key is skipped).
impl Fields for Record<'_> {
    fn field(&self, name: &str) -> Option<Cow<'_, str>> {
        Some(self.get(name)?.field_text().unwrap_or_default())
    }
}

/// One master as a Sentinel describes it (`SENTINEL MASTERS`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasterRecord {
    pub name: String,
    pub addr: Addr,
    pub epoch: u64,
    pub failover_in_progress: bool,
    /// `num-slaves`: how many replicas `SENTINEL REPLICAS` lists (unknown: not shown).
    pub replicas: Option<usize>,
    /// `num-other-sentinels`: how many peers `SENTINEL SENTINELS` lists.
    pub peers: Option<usize>,
}

impl MasterRecord {
    pub fn from_record(r: &impl Fields) -> Option<Self> {
        let flags = r.field("flags")?;
        let count = |field: &str| r.field(field).and_then(|n| n.parse().ok());
        Some(Self {
            name: r.field("name")?.into_owned(),
            addr: Addr::parse(&r.field("ip")?, &r.field("port")?)?,
            epoch: r.field("config-epoch")?.parse().ok()?,
            failover_in_progress: flags.split(',').any(|f| f == "failover_in_progress"),
            replicas: count("num-slaves"),
            peers: count("num-other-sentinels"),
        })
    }
}

/// Whether a master record (`SENTINEL MASTER <name>`) shows this Sentinel running Valkey 9's
/// coordinated failover of it (`SENTINEL FAILOVER <name> COORDINATED`): Valkey's Sentinel
/// flags the master `coordinated_failover` from the command until the failover ends or
/// aborts, on the Sentinel that runs it only (the others merely vote). Its events are those
/// of any failover (`+selected-slave`, `+failover-state-send-slaveof-noone`), and the old
/// primary's `master_failover_state` changes only once the leader's `FAILOVER TO` runs
/// there, after the promotion is announced: this flag is the one sign polestar can read in
/// time, from the leader itself.
pub fn coordinated_failover(r: &HashMap<String, String>) -> bool {
    r.get("flags").is_some_and(|f| f.split(',').any(|f| f == "coordinated_failover"))
}

/// One replica as a Sentinel describes it (`SENTINEL REPLICAS <name>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaRecord {
    pub addr: Addr,
    pub healthy: bool,
    /// `s_down` or `o_down` (what Sentinel's `+sdown` of a replica follows).
    pub down: bool,
    /// The primary this replica itself says it replicates from (its `INFO`, as Sentinel
    /// relays it in `master-host`/`master-port`), when it is up and reports the replica
    /// role; `None` for a node that reports itself master or was never heard from (an
    /// unrelated node a forged hello put in the list).
    pub upstream: Option<Addr>,
    /// The replica this Sentinel selected and promotes (`promoted`, the leader's flag from
    /// `+selected-slave` to the end of the failover): it answers master from `SLAVEOF NO ONE`
    /// on, so it has no `upstream`, yet it is a replica of the master it is listed under.
    pub promoted: bool,
}

impl ReplicaRecord {
    pub fn from_record(r: &HashMap<String, String>) -> Option<Self> {
        let flags = r.get("flags")?;
        let flag = |names: &[&str]| flags.split(',').any(|f| names.contains(&f));
        // Sentinel's `+sdown`: a replica entry it has just made (after a switch) is
        // `disconnected` until its link is up, and is not down for that.
        let sdown = flag(&["s_down", "o_down"]);
        let down = sdown || flag(&["disconnected"]);
        let linked = r.get("master-link-status").is_none_or(|s| s == "ok");
        let addr = Addr::parse(r.get("ip")?, r.get("port")?)?;
        let upstream = if down { None } else { upstream(r) };
        let promoted = !down && flags.split(',').any(|f| f == "promoted");
        Some(Self { addr, healthy: !down && linked, down: sdown, upstream, promoted })
    }

    /// The node this replica replicates from, as far as the listing Sentinel shows it: its
    /// own `upstream`, or `master` (the address the record is listed under) for the replica
    /// the Sentinel is promoting. A polestar started in the middle of a failover reads the
    /// promoted replica only as a master, and without this it would refuse the switch to it
    /// as a node that never replicated from the master (a forged hello's mark).
    pub fn follows(&self, master: &Addr) -> Option<Addr> {
        self.upstream.clone().or_else(|| self.promoted.then(|| master.clone()))
    }
}

/// `master-host:master-port` of a replica record that reports the replica role.
fn upstream(r: &HashMap<String, String>) -> Option<Addr> {
    if r.get("role-reported").is_some_and(|role| role != "slave") {
        return None;
    }
    let host = r.get("master-host").filter(|h| h.as_str() != "?")?;
    Addr::parse(host, r.get("master-port")?)
}

/// Another Sentinel of the same master (`SENTINEL SENTINELS <name>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerRecord {
    pub addr: Addr,
    pub runid: String,
}

impl PeerRecord {
    pub fn from_record(r: &impl Fields) -> Option<Self> {
        Some(Self {
            addr: Addr::parse(&r.field("ip")?, &r.field("port")?)?,
            runid: r.field("runid")?.into_owned(),
        })
    }
}

/// The reply of `SENTINEL get-master-addr-by-name`: `[ip, port]` or nil.
pub fn master_addr(value: &Value) -> Option<Addr> {
    match value {
        Value::Array(a) if a.len() == 2 => Addr::parse(&text(&a[0])?, &text(&a[1])?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::reply::Replies;

    fn addr(host: &str, port: u16) -> Addr {
        Addr { host: host.into(), port }
    }

    #[test]
    fn promotion_events() {
        let p = "slave 127.0.0.1:7002 127.0.0.1 7002 @ mymaster 127.0.0.1 7001";
        assert_eq!(
            Event::parse("+promoted-slave", p),
            Some(Event::Promoted { master: "mymaster".into(), replica: addr("127.0.0.1", 7002) })
        );
        assert_eq!(
            Event::parse("+selected-slave", p),
            Some(Event::Promoting {
                master: "mymaster".into(),
                replica: addr("127.0.0.1", 7002),
                sent: false
            })
        );
        assert_eq!(Event::parse("+new-epoch", "7"), Some(Event::NewEpoch(7)));
        assert_eq!(Event::parse("+vote-for-leader", "6a4e12b3c 8"), Some(Event::Voted(8)));
    }

    #[test]
    fn master_events() {
        let m = "master mymaster 127.0.0.1 7001";
        assert_eq!(
            Event::parse("+elected-leader", m),
            Some(Event::FailoverStarted { master: "mymaster".into(), elected: true })
        );
        assert_eq!(
            Event::parse("+try-failover", m),
            Some(Event::FailoverStarted { master: "mymaster".into(), elected: false })
        );
        assert_eq!(
            Event::parse("-failover-abort-no-good-slave", m),
            Some(Event::FailoverEnded { master: "mymaster".into(), aborted: true })
        );
        assert_eq!(
            Event::parse("+switch-master", "mymaster 127.0.0.1 7001 127.0.0.1 7002"),
            Some(Event::Switched {
                master: "mymaster".into(),
                old: addr("127.0.0.1", 7001),
                new: addr("127.0.0.1", 7002),
            })
        );
        assert_eq!(
            Event::parse("+sdown", "slave h2.internal:7002 h2.internal 7002 @ m h1.internal 7001"),
            Some(Event::Changed { master: "m".into() })
        );
        assert_eq!(
            Event::parse(
                "+convert-to-slave",
                "slave 10.0.0.1:7001 10.0.0.1 7001 @ m 10.0.0.2 7002"
            ),
            Some(Event::NodeBack {
                master: "m".into(),
                node: addr("10.0.0.1", 7001),
                converted_to: Some(addr("10.0.0.2", 7002)),
            })
        );
        // Only +convert-to-slave says whom the node was told to follow.
        assert_eq!(
            Event::parse("-sdown", "slave 10.0.0.1:7001 10.0.0.1 7001 @ m 10.0.0.2 7002"),
            Some(Event::NodeBack {
                master: "m".into(),
                node: addr("10.0.0.1", 7001),
                converted_to: None,
            })
        );
        // A new peer Sentinel of one master: that master is looked at again (new Sentinels
        // are discovered by the next full reconciliation), not every master at once.
        let peer = "sentinel 5b3c8e 10.0.0.3 26379 @ m 10.0.0.2 7002";
        assert_eq!(Event::parse("+sentinel", peer), Some(Event::Changed { master: "m".into() }));
        assert_eq!(
            Event::parse("+monitor", "master m 10.0.0.2 7002 quorum 2"),
            Some(Event::Topology)
        );
    }

    #[test]
    fn a_masters_own_sdown_and_odown_are_typed() {
        let down = |objective, began, quorum: Option<&str>| Down {
            objective,
            began,
            quorum: quorum.map(str::to_string),
        };
        let m = |down| {
            Some(Event::MasterDown { master: "m".into(), node: addr("10.0.0.1", 7001), down })
        };
        assert_eq!(Event::parse("+sdown", "master m 10.0.0.1 7001"), m(down(false, true, None)));
        assert_eq!(Event::parse("-sdown", "master m 10.0.0.1 7001"), m(down(false, false, None)));
        assert_eq!(
            Event::parse("+odown", "master m 10.0.0.1 7001 #quorum 2/2"),
            m(down(true, true, Some("2/2")))
        );
        assert_eq!(Event::parse("-odown", "master m 10.0.0.1 7001"), m(down(true, false, None)));
        assert_eq!(down(true, true, None).channel(), "+odown");
        assert_eq!(down(false, false, None).channel(), "-sdown");
        // Without a usable address, or of a replica: a reconciliation only, as before.
        assert_eq!(
            Event::parse("+odown", "master m 10.0.0.1 0 #quorum 2/2"),
            Some(Event::Changed { master: "m".into() })
        );
        assert_eq!(
            Event::parse("+odown", "slave a:1 a 1 @ m 10.0.0.1 7001"),
            Some(Event::Changed { master: "m".into() })
        );
    }

    #[test]
    fn odd_events_are_ignored_not_fatal() {
        for (channel, payload) in [
            ("+promoted-slave", ""),
            ("+promoted-slave", "slave x"),
            ("+promoted-slave", "slave a b c @"),
            ("+promoted-slave", "slave a h 99999 @ m h 1"),
            ("+switch-master", "m 1 2 3"),
            ("+new-epoch", "seven"),
            ("__sentinel__:hello", "127.0.0.1,26379,abc,1,m,127.0.0.1,7001,0"),
            ("+sdown", "\u{0}\u{ffff}"),
        ] {
            assert!(
                !matches!(Event::parse(channel, payload), Some(Event::Promoted { .. })),
                "{channel} {payload}"
            );
        }
        assert_eq!(Event::parse("+switch-master", "m 1 2 3"), None);
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn records_in_resp2_and_resp3() {
        let fields = [
            ("name", "m"),
            ("ip", "10.0.0.1"),
            ("port", "6379"),
            ("flags", "master,failover_in_progress"),
            ("config-epoch", "4"),
        ];
        let resp2 = Value::Array(fields.iter().flat_map(|(k, v)| [bulk(k), bulk(v)]).collect());
        let resp3 = Value::Map(fields.iter().map(|(k, v)| (bulk(k), bulk(v))).collect());
        let want = MasterRecord {
            name: "m".into(),
            addr: addr("10.0.0.1", 6379),
            epoch: 4,
            failover_in_progress: true,
            replicas: None,
            peers: None,
        };
        for v in [resp2, resp3] {
            assert_eq!(record(&v).as_ref().and_then(MasterRecord::from_record), Some(want.clone()));
        }
        // Read in place from the bytes, the same.
        let mut wire = format!("*{}\r\n", fields.len() * 2);
        for (k, v) in fields {
            wire += &format!("${}\r\n{k}\r\n${}\r\n{v}\r\n", k.len(), v.len());
        }
        wire += "*4\r\n$10\r\nnum-slaves\r\n:3\r\n$5\r\nflags\r\n*0\r\n";
        let mut scan = crate::node::reply::Scan::default();
        let ends =
            [scan.next(wire.as_bytes()), scan.next(wire.as_bytes())].map(|e| e.expect("valid"));
        let replies = Replies::new(wire.into_bytes(), ends.into_iter().flatten().collect());
        let mut replies = replies.iter();
        let first = replies.next().and_then(|r| r.record()).expect("a record");
        assert_eq!(MasterRecord::from_record(&first), Some(want), "read in place, the same");
        let second = replies.next().and_then(|r| r.record()).expect("a record");
        assert_eq!(second.field("num-slaves").as_deref(), Some("3"), "an integer reads as text");
        assert_eq!(second.field("flags").as_deref(), Some(""), "a list reads as empty");
        assert_eq!(second.field("name"), None);
        assert_eq!(record(&Value::Array(vec![bulk("odd")])), None);
        assert_eq!(records(&Value::Nil), Vec::new());
    }

    #[test]
    fn only_the_coordinated_flag_marks_a_coordinated_failover() {
        let flags = |f: &str| HashMap::from([("flags".to_string(), f.to_string())]);
        let table = [
            ("master,failover_in_progress,coordinated_failover", true),
            ("s_down,master,failover_in_progress,coordinated_failover", true),
            // Valkey 9's plain SENTINEL FAILOVER, an automatic failover, none at all.
            ("s_down,master,failover_in_progress,force_failover", false),
            ("s_down,o_down,master,failover_in_progress", false),
            ("master", false),
            ("master,coordinated_failover_x", false),
            ("", false),
        ];
        for (f, expected) in table {
            assert_eq!(coordinated_failover(&flags(f)), expected, "{f}");
        }
        assert!(!coordinated_failover(&HashMap::new()), "no flags field");
    }

    #[test]
    fn replica_health() {
        let r = |flags: &str, link: &str| {
            let m = HashMap::from([
                ("ip".to_string(), "10.0.0.2".to_string()),
                ("port".to_string(), "6379".to_string()),
                ("flags".to_string(), flags.to_string()),
                ("master-link-status".to_string(), link.to_string()),
            ]);
            ReplicaRecord::from_record(&m).map(|r| r.healthy)
        };
        assert_eq!(r("slave", "ok"), Some(true));
        assert_eq!(r("s_down,slave", "ok"), Some(false));
        assert_eq!(r("slave", "err"), Some(false));
        assert_eq!(r("slave,disconnected", "ok"), Some(false));
    }

    #[test]
    fn a_replica_follows_its_own_upstream_or_the_master_promoting_it() {
        let master = addr("10.0.0.1", 6379);
        let r = |flags: &str, role: &str, host: &str| {
            let m = HashMap::from([
                ("ip".to_string(), "10.0.0.2".to_string()),
                ("port".to_string(), "6379".to_string()),
                ("flags".to_string(), flags.to_string()),
                ("role-reported".to_string(), role.to_string()),
                ("master-host".to_string(), host.to_string()),
                ("master-port".to_string(), "6379".to_string()),
            ]);
            ReplicaRecord::from_record(&m).and_then(|r| r.follows(&master))
        };
        let other = addr("10.0.0.9", 6379);
        assert_eq!(r("slave", "slave", "10.0.0.9"), Some(other.clone()), "its own word");
        assert_eq!(r("slave", "master", "10.0.0.9"), None, "a master follows nobody");
        assert_eq!(r("slave,promoted", "master", "?"), Some(master.clone()), "being promoted");
        assert_eq!(r("slave,promoted", "slave", "10.0.0.9"), Some(other), "not yet promoted");
        assert_eq!(r("s_down,slave,promoted", "master", "?"), None, "down: no word of it");
        assert_eq!(r("slave,disconnected", "slave", "10.0.0.1"), None);
    }

    #[test]
    fn master_addr() {
        let v = Value::Array(vec![bulk("10.0.0.1"), bulk("6379")]);
        assert_eq!(super::master_addr(&v), Some(addr("10.0.0.1", 6379)));
        assert_eq!(super::master_addr(&Value::Nil), None);
    }
}
