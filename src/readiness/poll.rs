//! The thin async shell around [`super::verdict::judge`]: every `readiness.interval`, ask
//! (see [`super::ask`]), judge, publish the [`Board`] and set the series.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::ask::{self, Connections, SentinelReplies};
use super::facts::{Facts, SentinelFacts};
use super::{Board, Heard, MasterReadiness, Writer, series, verdict};
use crate::config::{Config, Sentinels};
use crate::reload::ConfigReader;
use crate::topology::{Snapshot, TopologyReader};

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
    let mut disagreeing = Disagreements::default();
    loop {
        let config = live.borrow().clone();
        let mut next = Instant::now() + config.readiness.interval;
        if let Some(sentinels) = config.sentinels() {
            let snapshot = topology.borrow().clone();
            let masters = master_names(&config, &snapshot);
            next = Instant::now() + every(config.readiness.interval, masters.len());
            for m in masters.iter().filter(|m| registered.insert((*m).clone())) {
                series::register_master(m);
            }
            let round = tokio::select! {
                board = judge_all(&mut conns, &heard, &mut disagreeing, &config, sentinels, &snapshot, &masters) => board,
                () = shutdown.cancelled() => return,
            };
            publish(&writer, round);
        }
        tokio::select! {
            () = sleep_until(next) => {}
            () = shutdown.cancelled() => return,
        }
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

async fn judge_all(
    conns: &mut Connections,
    heard: &Heard,
    disagreeing: &mut Disagreements,
    config: &Config,
    sentinels: &Sentinels,
    snapshot: &Snapshot,
    masters: &[String],
) -> Board {
    let replies = conns.sentinels(&sentinels.addresses, &sentinels.auth, masters, heard).await;
    let mut board = Board::default();
    for master in masters {
        let mut facts = facts_of(master, sentinels, &replies);
        let primary =
            snapshot.master(master).and_then(|m| m.primary.as_ref()).map(|p| p.to_string());
        let published = snapshot.master(master).map_or(&[][..], |m| &m.replicas);
        let replicas = replica_addrs(&facts);
        facts.lags =
            ask::lags(conns, primary.as_deref(), &replicas, published, &config.nodes).await;
        facts.disagreeing_for = disagreeing.lasting(master, verdict::disagreeing(&facts));
        let verdict = verdict::judge(&facts, &config.readiness);
        board.masters.insert(master.clone(), MasterReadiness { verdict, lags: facts.lags });
    }
    board
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

/// Publishes the round and sets the series (lags that vanished since the last round too).
fn publish(writer: &Writer, board: Board) {
    let before = writer.borrow().clone();
    for (name, now) in &board.masters {
        series::set(name, now, before.masters.get(name).map(|m| &m.lags));
    }
    for (name, verdict) in board.masters.iter().map(|(n, m)| (n, &m.verdict)) {
        // Logged when the reasons change, not when a detail does (a count of seconds, say).
        let reasons = |v: &super::Verdict| v.blockers.iter().map(|b| b.reason).collect::<Vec<_>>();
        let was = before.masters.get(name).map(|m| reasons(&m.verdict));
        if was != Some(reasons(verdict)) {
            log_change(name, verdict);
        }
    }
    writer.send_replace(Arc::new(board));
}

fn log_change(master: &str, verdict: &super::Verdict) {
    if verdict.ready {
        tracing::info!(%master, "failover possible");
    } else {
        let blockers: Vec<String> =
            verdict.blockers.iter().map(|b| format!("{}: {}", b.reason, b.detail)).collect();
        tracing::warn!(%master, blockers = %blockers.join(" | "), "failover not possible");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
