//! The questions of one poll round, each under [`DEADLINE`]: every configured Sentinel about
//! every master, then the primary (or, when it does not answer, the replicas polestar publishes)
//! about offsets.
//! Connections are kept between rounds and dropped on any failure.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use futures::future::join_all;
use redis::Value;
use tokio::time::timeout;

use super::facts::SentinelAnswer;
use super::heard::{Heard, Records};
use super::{lag, parse};
use crate::config::{Auth, HostPort};
use crate::node::reply::Reply;
use crate::node::{CONNECTION_NAME, Endpoint, RawConn};
use crate::topology::Replica;

/// The name of the poll's connections to the Sentinels (`CLIENT LIST` shows it).
pub const SENTINEL_CONNECTION_NAME: &str = "polestar-readiness";

/// How long a Sentinel has to answer all of a round's questions, and a node its one.
pub const DEADLINE: Duration = Duration::from_secs(1);

/// Open connections by `kind/host:port`, reused from round to round.
#[derive(Default)]
pub struct Connections {
    open: HashMap<String, RawConn>,
}

/// What one Sentinel answered: per master, or why it did not.
pub type SentinelReplies = Result<BTreeMap<String, SentinelAnswer>, String>;

impl Connections {
    /// Asks every Sentinel at once; the answers come in the order of `sentinels`.
    pub async fn sentinels(
        &mut self,
        sentinels: &[HostPort],
        auth: &Auth,
        masters: &[String],
        heard: &Heard,
    ) -> Vec<SentinelReplies> {
        let asks = sentinels.iter().map(|s| {
            let endpoint = Endpoint::new(s.host.clone(), s.port, auth);
            let conn = self.open.remove(&key("sentinel", &endpoint));
            let records = heard.of(&endpoint.name(), masters);
            async move {
                let ask = ask_sentinel(&endpoint, conn, masters, records);
                let asked = timeout(DEADLINE, ask).await;
                let (conn, replies) = asked.unwrap_or_else(|_| {
                    (
                        None,
                        Err(format!(
                            "no answer within {}",
                            crate::config::duration::format(DEADLINE)
                        )),
                    )
                });
                (key("sentinel", &endpoint), conn, replies)
            }
        });
        let answered = join_all(asks).await;
        answered.into_iter().map(|(k, conn, replies)| self.keep(k, conn, replies)).collect()
    }

    /// `INFO replication` of each node (`ip:port`), at once; `None` for one that does not answer.
    /// Node connections last one round: an idle polestar holds no connection to a data node
    /// (at 1,000 masters, kept ones were 1,000 idle connections and most of its memory;
    /// `discovery::an_idle_polestar_keeps_no_connection_to_data_nodes`).
    pub async fn infos(&self, nodes: &[String], auth: &Auth) -> Vec<Option<String>> {
        let asks = nodes.iter().map(|n| async move {
            let hp = HostPort::parse(n).ok()?;
            let endpoint = Endpoint::new(hp.host, hp.port, auth);
            timeout(DEADLINE, ask_node(&endpoint)).await.ok()?.ok()
        });
        join_all(asks).await
    }

    fn keep<T>(&mut self, key: String, conn: Option<RawConn>, v: T) -> T {
        if let Some(conn) = conn {
            self.open.insert(key, conn);
        }
        v
    }
}

fn key(kind: &str, endpoint: &Endpoint) -> String {
    format!("{kind}/{}", endpoint.name())
}

/// Every question to one Sentinel, in one exchange; the connection comes back when it is
/// still good. With `records` (what its link read of each master, see [`Heard`]) only `INFO`
/// and `CKQUORUM`.
async fn ask_sentinel(
    endpoint: &Endpoint,
    conn: Option<RawConn>,
    masters: &[String],
    records: Option<Vec<Option<Records>>>,
) -> (Option<RawConn>, SentinelReplies) {
    let mut conn = match conn {
        Some(c) => c,
        None => match RawConn::open(endpoint, SENTINEL_CONNECTION_NAME).await {
            Ok(c) => c,
            Err(e) => return (None, Err(e.to_string())),
        },
    };
    let heard: Vec<Option<Option<Records>>> = match records {
        Some(records) => records.into_iter().map(Some).collect(),
        None => vec![None; masters.len()],
    };
    let commands = questions(masters, &heard);
    let replies = match conn.ask(&commands).await {
        Ok(replies) => replies,
        Err(e) => return (None, Err(e.to_string())),
    };
    let mut replies = replies.iter().map(|r| match r {
        Reply::Error(e) => Err(String::from_utf8_lossy(e).into_owned()),
        r => Ok(r.to_value()),
    });
    // A refused `INFO` is read as its text: the TILT blocker shows it.
    let info = replies.next().unwrap_or_else(|| Err("no reply".to_string()));
    let tilt = parse::tilt(&info.unwrap_or_else(Value::SimpleString));
    let mut out = BTreeMap::new();
    for (master, heard) in masters.iter().zip(heard) {
        let mut next = || replies.next().unwrap_or_else(|| Err("no reply".to_string()));
        out.insert(master.clone(), answer(heard, tilt.clone(), &mut next));
    }
    (Some(conn), Ok(out))
}

/// One master's answer: what the link heard of it (`Some`; `Some(None)`: not listed), the
/// replicas asked again when [`asks_replicas`] says so and `CKQUORUM`; or, with nothing
/// heard, every question's reply (`next`, in the order [`ask_masters`] asked).
fn answer(
    heard: Option<Option<Records>>,
    tilt: Result<bool, String>,
    next: &mut impl FnMut() -> Result<Value, String>,
) -> SentinelAnswer {
    let fresh = asks_replicas(&heard);
    match heard {
        Some(records) => {
            let Records { master: record, replicas } = records.unwrap_or_else(|| {
                let not = || "SENTINEL MASTERS does not list this master".to_string();
                Records { master: Err(not()), replicas: Err(not()) }
            });
            let replicas = if fresh { next().and_then(|v| parse::replicas(&v)) } else { replicas };
            let ckquorum = next().and_then(|v| parse::ckquorum(&v));
            SentinelAnswer { tilt, ckquorum, master: record, replicas }
        }
        None => SentinelAnswer {
            tilt,
            ckquorum: next().and_then(|v| parse::ckquorum(&v)),
            master: next().and_then(|v| parse::master(&v)),
            replicas: next().and_then(|v| parse::replicas(&v)),
        },
    }
}

/// Whether a round asks a Sentinel for a master's replicas itself: always unless its link's
/// records say the master has none (or that the Sentinel does not monitor it). The replica
/// records a link read at an event stay until its next reconciliation, and the event that
/// ends a failover is the moment Sentinel lists the new primary's replicas afresh, with
/// `master-link-status err` until their first `INFO`: taken from the link, that passing state
/// outlived the next round (`readiness::planned_failovers_raise_no_false_blocker` failed 2 runs
/// in 4). The master's record (address and epoch) is taken from the link.
fn asks_replicas(heard: &Option<Option<Records>>) -> bool {
    match heard {
        None => true,
        Some(None) => false,
        Some(Some(records)) => !matches!(&records.replicas, Ok(r) if r.is_empty()),
    }
}

/// `INFO sentinel`, then for every master, in this order: where the link's records are
/// current (`heard`: `Some`), `REPLICAS` when [`asks_replicas`], then `CKQUORUM`; where they
/// are not, `CKQUORUM`, `MASTER` and `REPLICAS`. At 1,000 masters this was 1,000 commands in
/// flight at once, one future each: a tenth of the idle CPU and 11 MB of memory at the peak
/// of every round; then one pipeline of the redis crate, whose replies, a value each, were
/// a tenth again; now one exchange read in place.
fn questions<'a>(masters: &'a [String], heard: &[Option<Option<Records>>]) -> Vec<Vec<&'a str>> {
    let mut commands = vec![vec!["INFO", "sentinel"]];
    for (master, heard) in masters.iter().zip(heard) {
        let subs: &[&'static str] = match (heard.is_some(), asks_replicas(heard)) {
            (false, _) => &["CKQUORUM", "MASTER", "REPLICAS"],
            (true, true) => &["REPLICAS", "CKQUORUM"],
            (true, false) => &["CKQUORUM"],
        };
        commands.extend(subs.iter().map(|sub| vec!["SENTINEL", sub, master.as_str()]));
    }
    commands
}

/// `INFO replication` of one node, over a connection of its own, named (drains spare it): at 1,000 masters, opening a link of the redis crate (`HELLO`,
/// `CLIENT SETINFO`, the naming and `CLIENT ID`) for each primary every round was a tenth of
/// an idle polestar's CPU.
async fn ask_node(endpoint: &Endpoint) -> Result<String, String> {
    let mut conn = RawConn::open(endpoint, CONNECTION_NAME).await.map_err(|e| e.to_string())?;
    let replies = conn.ask(&[vec!["INFO", "replication"]]).await.map_err(|e| e.to_string())?;
    match replies.iter().next() {
        Some(Reply::Error(e)) => Err(String::from_utf8_lossy(e).into_owned()),
        Some(reply) => {
            reply.text().map(str::to_string).ok_or_else(|| parse::quote(&reply.to_value()))
        }
        None => Err("no reply".to_string()),
    }
}

/// Lags of a master's replicas: from the primary's `INFO`, or when it does not answer (or is
/// unknown) from the replicas' own offsets. `replicas`: every replica a Sentinel lists; of
/// those, only the ones `published` (named by a majority of the configured Sentinels, the
/// rule of `sentinel::core`) are asked, since the question carries the node credentials.
pub async fn lags(
    conns: &mut Connections,
    primary: Option<&str>,
    replicas: &[String],
    published: &[Replica],
    auth: &Auth,
) -> BTreeMap<String, u64> {
    // No Sentinel lists a replica: no lag to learn, and no connection to the primary (at
    // 1,000 masters, most of them without replicas, that was 100 connections a second).
    if replicas.is_empty() {
        return BTreeMap::new();
    }
    if let Some(primary) = primary {
        let info = conns.infos(&[primary.to_string()], auth).await;
        if let Some(Some(text)) = info.first()
            && let Ok(lags) = lag::from_primary(text)
        {
            return lags;
        }
    }
    let askable = of_published(replicas, published);
    let infos = conns.infos(&askable, auth).await;
    let offsets: Vec<(String, u64)> = askable
        .iter()
        .zip(infos)
        .filter_map(|(r, info)| Some((r.clone(), lag::replica_offset(&info?)?)))
        .collect();
    lag::from_replicas(&offsets)
}

/// The replicas of `listed` (`ip:port`, or `hostname:port` where the Sentinels announce
/// hostnames) that are `published`.
fn of_published(listed: &[String], published: &[Replica]) -> Vec<String> {
    let names = |r: &Replica, listed: &str| {
        listed.parse::<SocketAddr>().is_ok_and(|a| a == SocketAddr::new(r.ip, r.port))
            || r.hostname.as_ref().is_some_and(|h| listed == format!("{h}:{}", r.port))
    };
    let kept = listed.iter().filter(|l| published.iter().any(|r| names(r, l)));
    kept.cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(ip: &str, port: u16, hostname: Option<&str>) -> Replica {
        let ip = ip.parse().expect("an address");
        let hostname = hostname.map(str::to_string);
        Replica { ip, port, hostname, healthy: true, down: false }
    }

    /// Only published replicas are asked (with the node credentials): one Sentinel's list is
    /// not enough. Addresses compare as addresses; a hostname-announcing Sentinel's list names
    /// a published replica by its hostname.
    #[test]
    fn only_published_replicas_are_asked() {
        let published = [
            replica("10.0.0.2", 6379, None),
            replica("::1", 6380, None),
            replica("10.0.0.4", 6379, Some("r4.example")),
        ];
        let listed: Vec<String> = [
            "10.0.0.2:6379",
            "10.0.0.9:6379",
            "[0:0:0:0:0:0:0:1]:6380",
            "r4.example:6379",
            "r4.example:6380",
        ]
        .map(String::from)
        .into();
        let want = ["10.0.0.2:6379", "[0:0:0:0:0:0:0:1]:6380", "r4.example:6379"];
        assert_eq!(of_published(&listed, &published), want);
        assert!(of_published(&listed, &[]).is_empty());
    }
}
