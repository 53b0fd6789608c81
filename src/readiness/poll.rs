//! The thin async shell around [`super::verdict::judge`]: every `readiness.interval`, ask
//! (see [`super::ask`]), judge, publish the [`Board`] and set the series. Meanwhile (while a
//! round is asked too: a Sentinel that does not answer holds a round up to its deadline), a
//! master whose records a Sentinel link's reconciliation changed ([`Heard::news`]) is judged
//! again at once from those records and the last round's other answers (TILT, `CKQUORUM`,
//! lags), without asking anything. So what the links read (flags, priorities, `s-down-time`,
//! the primary and epoch) reaches the verdict one reconciliation after the Sentinels show it
//! (at once for an event, within the links' full reconciliation otherwise: 1 s up to 100
//! masters). A round asks the lags first and judges them at once, then the Sentinels (TILT,
//! `CKQUORUM`, reachability): the lags reach the verdict within one `readiness.interval` and
//! a node's answer, the Sentinels' answers within one interval and a round.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::ask::{self, Connections, SentinelReplies};
use super::facts::{Facts, SentinelFacts};
use super::heard::Records;
use super::{Board, Heard, MasterReadiness, Writer, changes, series, verdict};
use crate::config::{Config, Readiness, Sentinels};
use crate::reload::ConfigReader;
use crate::topology::{Replica, Snapshot, TopologyReader};

/// Polls until shutdown. Only with Sentinels as the source (an agent has none to ask): with
/// an upstream it publishes nothing and waits.
pub async fn run(
    live: ConfigReader,
    topology: TopologyReader,
    heard: Heard,
    writer: Writer,
    shutdown: CancellationToken,
) {
    let mut conns = Connections::default();
    let mut registered = BTreeSet::new();
    let mut memory = Memory::default();
    loop {
        let config = live.borrow().clone();
        let settings = &config.readiness;
        let mut next = Instant::now() + settings.interval;
        if let Some(sentinels) = config.sentinels() {
            let snapshot = topology.borrow().clone();
            let masters = master_names(&config, &snapshot);
            next = Instant::now() + every(settings.interval, masters.len());
            register(&mut registered, &masters);
            // Lags first, of the replicas each master was last judged with, and judged at
            // once: a Sentinel that does not answer holds the rest of the round up to its
            // deadline, but not the lags.
            let known = memory.replicas(&masters);
            let lags = ask_lags(&mut conns, &config, &snapshot, known);
            let news = Judging { memory: &mut memory, heard: &heard, writer: &writer, settings };
            let Some((lags, _)) = news.until(lags, &shutdown).await else { return };
            rejudge_lags(&mut memory, &writer, settings, &lags);
            let round = ask_all(&mut conns, &heard, &config, sentinels, &snapshot, &masters, lags);
            let news = Judging { memory: &mut memory, heard: &heard, writer: &writer, settings };
            let Some((mut facts, judged)) = news.until(round, &shutdown).await else { return };
            refresh_judged(&heard, &mut facts, &judged);
            publish(&writer, memory.round(facts, settings));
        }
        let news = Judging { memory: &mut memory, heard: &heard, writer: &writer, settings };
        if news.until(sleep_until(next), &shutdown).await.is_none() {
            return;
        }
    }
}

/// Judges again the masters whose records the links changed ([`Heard::news`]), while a round
/// is asked or the next one awaited.
struct Judging<'a> {
    memory: &'a mut Memory,
    heard: &'a Heard,
    writer: &'a Writer,
    settings: &'a Readiness,
}

impl Judging<'_> {
    /// `work`'s output and every master judged again meanwhile; `None` at shutdown.
    async fn until<T>(
        self,
        work: impl std::future::Future<Output = T>,
        shutdown: &CancellationToken,
    ) -> Option<(T, BTreeSet<String>)> {
        let mut judged = BTreeSet::new();
        tokio::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return Some((out, judged)),
                news = self.heard.news() => {
                    rejudge(self.memory, self.heard, self.writer, self.settings, &news);
                    judged.extend(news);
                }
                () = shutdown.cancelled() => return None,
            }
        }
    }
}

/// Registers the series of the masters not seen before.
fn register(registered: &mut BTreeSet<String>, masters: &[String]) {
    for m in masters.iter().filter(|m| registered.insert((*m).clone())) {
        series::register_master(m);
    }
}

/// The links' records of a master judged meanwhile (`judged`) are newer than the round's.
fn refresh_judged(heard: &Heard, facts: &mut [(String, Facts)], judged: &BTreeSet<String>) {
    for (master, facts) in facts.iter_mut().filter(|(m, _)| judged.contains(m)) {
        *facts = current(heard, master, facts);
    }
}

/// Each master costs a round several commands to every Sentinel and a connection to its
/// primary: with many masters a round is stretched to this much per master.
const PER_MASTER: Duration = Duration::from_millis(10);

/// How long one round lasts at the least: `interval`, or [`PER_MASTER`] per master when that is
/// longer (10 s at 1,000 masters, the Sentinel links' full reconciliation period). Measured at
/// 1,000 masters with a round every second: 29 % of a core at idle, and 9 % of each Sentinel's.
fn every(interval: Duration, masters: usize) -> Duration {
    let masters = u32::try_from(masters).unwrap_or(u32::MAX);
    interval.max(PER_MASTER.saturating_mul(masters))
}

/// The configured masters, or every master in the topology.
fn master_names(config: &Config, snapshot: &Snapshot) -> Vec<String> {
    match &config.masters {
        Some(masters) => masters.iter().map(|m| m.name.clone()).collect(),
        None => snapshot.masters.keys().cloned().collect(),
    }
}

/// Since when the Sentinels of each master have disagreed without a break.
#[derive(Default)]
struct Disagreements(BTreeMap<String, Instant>);

impl Disagreements {
    fn lasting(&mut self, master: &str, now: bool) -> Duration {
        if !now {
            self.0.remove(master);
            return Duration::ZERO;
        }
        self.0.entry(master.to_string()).or_insert_with(Instant::now).elapsed()
    }
}

/// What the poll keeps between judgements: the facts each master was last judged on (for
/// judging it again when its records change) and how long its Sentinels have disagreed.
#[derive(Default)]
struct Memory {
    facts: BTreeMap<String, Facts>,
    disagreeing: Disagreements,
}

impl Memory {
    fn judge(&mut self, master: &str, mut facts: Facts, settings: &Readiness) -> MasterReadiness {
        facts.disagreeing_for = self.disagreeing.lasting(master, verdict::disagreeing(&facts));
        let verdict = verdict::judge(&facts, settings);
        let judged = MasterReadiness { verdict, lags: facts.lags.clone() };
        self.facts.insert(master.to_string(), facts);
        judged
    }

    /// The replicas each of `masters` was last judged with (those judged before).
    fn replicas(&self, masters: &[String]) -> BTreeMap<String, Vec<String>> {
        let known = masters.iter().filter_map(|m| self.facts.get(m).map(|f| (m, f)));
        known.map(|(m, f)| (m.clone(), replica_addrs(f))).collect()
    }

    /// Judges a round: only its masters are remembered.
    fn round(&mut self, facts: Vec<(String, Facts)>, settings: &Readiness) -> Board {
        self.facts.clear();
        let judged = facts.into_iter().map(|(m, f)| {
            let judged = self.judge(&m, f, settings);
            (m, judged)
        });
        Board { masters: judged.collect() }
    }
}

/// Lags of each master's replicas, by master, with the replicas they were asked of.
type Lags = BTreeMap<String, (Vec<String>, BTreeMap<String, u64>)>;

/// Asks each master's primary (or replicas) for the lags of `known` replicas.
async fn ask_lags(
    conns: &mut Connections,
    config: &Config,
    snapshot: &Snapshot,
    known: BTreeMap<String, Vec<String>>,
) -> Lags {
    let mut lags = Lags::new();
    for (master, replicas) in known {
        let primary = primary_of(snapshot, &master);
        let published = published_of(snapshot, &master);
        let got = ask::lags(conns, primary.as_deref(), &replicas, published, &config.nodes).await;
        lags.insert(master, (replicas, got));
    }
    lags
}

fn primary_of(snapshot: &Snapshot, master: &str) -> Option<String> {
    snapshot.master(master).and_then(|m| m.primary.as_ref()).map(|p| p.to_string())
}

/// The replicas polestar publishes for `master` (a majority of the Sentinels' lists name
/// them): the only ones the lag fallback may send the node credentials to.
fn published_of<'a>(snapshot: &'a Snapshot, master: &str) -> &'a [Replica] {
    snapshot.master(master).map_or(&[][..], |m| &m.replicas)
}

/// Judges again, with their new lags, the masters whose lags changed; publishes when anything
/// did.
fn rejudge_lags(memory: &mut Memory, writer: &Writer, settings: &Readiness, lags: &Lags) {
    let before = writer.borrow().clone();
    let mut board = (*before).clone();
    for (master, (_, lags)) in lags {
        let Some(facts) = memory.facts.get(master).filter(|f| f.lags != *lags) else { continue };
        let facts = Facts { lags: lags.clone(), ..facts.clone() };
        board.masters.insert(master.clone(), memory.judge(master, facts, settings));
    }
    if board != *before {
        publish(writer, board);
    }
}

/// Asks every Sentinel about every master; each master's lags are `lags`' when they were asked
/// of the replicas the Sentinels list now, else asked now.
async fn ask_all(
    conns: &mut Connections,
    heard: &Heard,
    config: &Config,
    sentinels: &Sentinels,
    snapshot: &Snapshot,
    masters: &[String],
    mut lags: Lags,
) -> Vec<(String, Facts)> {
    let replies = conns.sentinels(&sentinels.addresses, &sentinels.auth, masters, heard).await;
    let mut all = Vec::with_capacity(masters.len());
    for master in masters {
        let mut facts = facts_of(master, sentinels, &replies);
        let replicas = replica_addrs(&facts);
        facts.lags = match lags.remove(master) {
            Some((asked, known)) if asked == replicas => known,
            _ => {
                let primary = primary_of(snapshot, master);
                let published = published_of(snapshot, master);
                ask::lags(conns, primary.as_deref(), &replicas, published, &config.nodes).await
            }
        };
        all.push((master.clone(), facts));
    }
    all
}

/// Judges again each master in `news` that the last round judged, on the records the links
/// hold now; publishes when anything changed.
fn rejudge(
    memory: &mut Memory,
    heard: &Heard,
    writer: &Writer,
    settings: &Readiness,
    news: &BTreeSet<String>,
) {
    let before = writer.borrow().clone();
    let mut board = (*before).clone();
    for master in news {
        let Some(facts) = memory.facts.get(master) else { continue };
        let facts = current(heard, master, facts);
        board.masters.insert(master.clone(), memory.judge(master, facts, settings));
    }
    if board != *before {
        publish(writer, board);
    }
}

/// `facts` of `master` with the records the links hold now.
fn current(heard: &Heard, master: &str, facts: &Facts) -> Facts {
    let one = [master.to_string()];
    let records =
        facts.sentinels.iter().map(|s| heard.of(&s.addr, &one).map(|mut r| r.pop().flatten()));
    refreshed(facts, records)
}

/// `facts` with each reachable Sentinel's master and replica records replaced by what its
/// link holds now (`records`, in the order of `facts.sentinels`: `None` when the link has no
/// current picture, `Some(None)` when that Sentinel no longer monitors the master). A
/// Sentinel the round could not reach stays unreachable: reachability is the poll's word.
fn refreshed(facts: &Facts, records: impl Iterator<Item = Option<Option<Records>>>) -> Facts {
    let mut facts = facts.clone();
    for (sentinel, records) in facts.sentinels.iter_mut().zip(records) {
        if let (Ok(answer), Some(records)) = (&mut sentinel.answer, records) {
            let Records { master, replicas } = Records::or_unmonitored(records);
            (answer.master, answer.replicas) = (master, replicas);
        }
    }
    facts
}

fn facts_of(master: &str, sentinels: &Sentinels, replies: &[SentinelReplies]) -> Facts {
    let answers = sentinels.addresses.iter().zip(replies).map(|(addr, reply)| SentinelFacts {
        addr: addr.to_string(),
        answer: reply.as_ref().map_err(Clone::clone).and_then(|per_master| {
            per_master.get(master).cloned().ok_or_else(|| "no answer for this master".to_string())
        }),
    });
    Facts {
        configured: sentinels.addresses.len(),
        sentinels: answers.collect(),
        lags: BTreeMap::new(),
        disagreeing_for: Duration::ZERO,
    }
}

/// Every replica some reachable Sentinel lists.
fn replica_addrs(facts: &Facts) -> Vec<String> {
    let answers = facts.sentinels.iter().filter_map(|s| s.answer.as_ref().ok());
    let all: BTreeSet<String> =
        answers.flat_map(|a| a.replicas.iter().flatten().map(|r| r.addr.clone())).collect();
    all.into_iter().collect()
}

/// Publishes the board and sets the series of each master that changed (lags that vanished
/// since the last board too).
fn publish(writer: &Writer, board: Board) {
    let before = writer.borrow().clone();
    let reasons = |v: &super::Verdict| v.blockers.iter().map(|b| b.reason).collect::<Vec<_>>();
    let mut changed = Vec::new();
    for (name, now) in &board.masters {
        let was = before.masters.get(name);
        if was == Some(now) {
            continue;
        }
        series::set(name, now, was.map(|m| &m.lags));
        // Logged when the reasons change, not when a detail does (a count of seconds, say).
        if was.map(|m| reasons(&m.verdict)) != Some(reasons(&now.verdict)) {
            changed.push((name.as_str(), &now.verdict));
        }
    }
    changes::log(changed);
    writer.send_replace(Arc::new(board));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readiness::facts::{MasterFacts, ReplicaFacts, SentinelAnswer};
    use crate::readiness::{Reason, channel};

    fn records(priority: u64) -> Records {
        let replica = ReplicaFacts {
            addr: "10.0.0.2:6379".into(),
            flags: vec!["slave".into()],
            link_ok: true,
            priority,
            down_for: None,
        };
        Records {
            master: Ok(MasterFacts { primary: "10.0.0.1:6379".into(), epoch: 1 }),
            replicas: Ok(vec![replica]),
        }
    }

    /// Three Sentinels, the first unreachable, the others with `records`.
    fn facts(records: &Records) -> Facts {
        let answer = |r: &Records| SentinelAnswer {
            tilt: Ok(false),
            ckquorum: Ok(()),
            master: r.master.clone(),
            replicas: r.replicas.clone(),
        };
        let sentinel =
            |i: usize, answer| SentinelFacts { addr: format!("10.0.0.{i}:26379"), answer };
        Facts {
            configured: 3,
            sentinels: vec![
                sentinel(1, Err("refused".into())),
                sentinel(2, Ok(answer(records))),
                sentinel(3, Ok(answer(records))),
            ],
            lags: BTreeMap::from([("10.0.0.2:6379".into(), 0)]),
            disagreeing_for: Duration::ZERO,
        }
    }

    #[test]
    fn refreshed_facts_take_the_links_records_of_reachable_sentinels_only() {
        let was = facts(&records(100));
        let links = [Some(Some(records(0))), Some(Some(records(0))), None];
        let now = refreshed(&was, links.into_iter());
        assert_eq!(now.sentinels[0], was.sentinels[0], "unreachable stays unreachable");
        assert_eq!(now.sentinels[1], facts(&records(0)).sentinels[1], "the link's records");
        assert_eq!(now.sentinels[2], was.sentinels[2], "no current picture: as the round saw it");
        assert_eq!((now.lags, now.configured), (was.lags.clone(), 3));
        let gone = refreshed(&was, [None, Some(None), None].into_iter());
        let answer = gone.sentinels[1].answer.as_ref().expect("still reachable");
        assert!(answer.master.as_ref().is_err_and(|e| e.contains("does not list")), "{answer:?}");
    }

    fn settings() -> Readiness {
        Readiness {
            max_lag: 1 << 20,
            stale_after: Duration::from_secs(60),
            interval: Duration::from_secs(1),
        }
    }

    /// A master judged ready, published; links that now list its replica at priority 0.
    fn judged_then_priority_zero() -> (Memory, Writer, crate::readiness::Reader, Heard) {
        let (writer, reader) = channel();
        let mut memory = Memory::default();
        let judged = memory.judge("m", facts(&records(100)), &settings());
        assert!(judged.verdict.ready, "{judged:?}");
        publish(&writer, Board { masters: BTreeMap::from([("m".into(), judged)]) });
        let heard = Heard::default();
        for s in ["10.0.0.2:26379", "10.0.0.3:26379"] {
            heard.all(s, std::collections::HashMap::from([("m".into(), records(0))]));
        }
        (memory, writer, reader, heard)
    }

    /// The 2 s promise by construction: a reconciliation that brings new records is judged
    /// without waiting for the next round, and news about a master the round did not judge is
    /// ignored.
    #[test]
    fn changed_records_are_judged_at_once_and_published() {
        let (mut memory, writer, reader, heard) = judged_then_priority_zero();
        let news = BTreeSet::from(["m".to_string(), "other".to_string()]);
        rejudge(&mut memory, &heard, &writer, &settings(), &news);
        let board = reader.borrow().clone();
        let verdict = &board.masters["m"].verdict;
        assert!(verdict.blocked_by(Reason::NoPromotableReplica), "{verdict:?}");
        assert_eq!(board.masters.len(), 1, "{board:?}");
    }

    /// Lags asked at the start of a round are judged before the Sentinels answer; a master
    /// whose lags did not change is not judged again.
    #[test]
    fn new_lags_are_judged_at_once() {
        let (writer, mut reader) = channel();
        let mut memory = Memory::default();
        let judged = memory.judge("m", facts(&records(100)), &settings());
        publish(&writer, Board { masters: BTreeMap::from([("m".into(), judged)]) });
        reader.borrow_and_update();
        let replicas = memory.replicas(&["m".to_string(), "gone".to_string()]);
        assert_eq!(replicas, BTreeMap::from([("m".into(), vec!["10.0.0.2:6379".to_string()])]));
        let same = Lags::from([("m".into(), (replicas["m"].clone(), facts(&records(100)).lags))]);
        rejudge_lags(&mut memory, &writer, &settings(), &same);
        assert!(!reader.has_changed().expect("a writer"), "unchanged lags publish nothing");
        let behind = BTreeMap::from([("10.0.0.2:6379".to_string(), 2 << 20)]);
        let lags = Lags::from([("m".into(), (replicas["m"].clone(), behind.clone()))]);
        rejudge_lags(&mut memory, &writer, &settings(), &lags);
        let board = reader.borrow().clone();
        let verdict = &board.masters["m"].verdict;
        assert!(verdict.blocked_by(Reason::NoPromotableReplica), "{verdict:?}");
        assert_eq!(board.masters["m"].lags, behind);
    }

    /// News is judged while a round is under way (a round held by a silent Sentinel's deadline
    /// must not hold the links' news): here the round ends only once the verdict changed.
    #[tokio::test]
    async fn news_is_judged_while_a_round_is_under_way() {
        let (mut memory, writer, mut reader, heard) = judged_then_priority_zero();
        reader.borrow_and_update();
        let round = async {
            let changed = reader.changed().await;
            changed.map(|()| reader.borrow().clone())
        };
        let settings = settings();
        let judging =
            Judging { memory: &mut memory, heard: &heard, writer: &writer, settings: &settings };
        let shutdown = CancellationToken::new();
        let until = judging.until(round, &shutdown);
        let done = tokio::time::timeout(Duration::from_secs(5), until).await;
        let (board, judged) = done.expect("the round ended").expect("no shutdown");
        let board = board.expect("a board published while the round was under way");
        assert!(board.masters["m"].verdict.blocked_by(Reason::NoPromotableReplica), "{board:?}");
        assert_eq!(judged, BTreeSet::from(["m".to_string()]));
    }

    #[test]
    fn a_round_is_stretched_by_the_number_of_masters() {
        let second = Duration::from_secs(1);
        assert_eq!(every(second, 1), second);
        assert_eq!(every(second, 100), second);
        assert_eq!(every(Duration::from_millis(250), 50), Duration::from_millis(500));
        assert_eq!(every(second, 1000), Duration::from_secs(10));
        assert_eq!(every(Duration::from_secs(30), 1000), Duration::from_secs(30));
        assert!(every(second, usize::MAX) > Duration::from_secs(3600));
    }
}
