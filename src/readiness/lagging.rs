//! `dns.replica_max_lag`: the topology as `replicas.<label>` should serve it, with replicas
//! lagging more than the limit counted as unhealthy. A view derived from the published
//! topology and the readiness [`Board`]; the topology itself is left as Sentinel reports it.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Board, Reader};
use crate::topology::{Master, Snapshot, TopologyReader};

/// `snapshot` with every replica of a judged master that lags more than `max_lag`, or whose
/// lag is not known, marked unhealthy. A master not judged yet (no round finished) is left
/// as it is: the first round comes within `readiness.interval`.
pub fn filter(snapshot: &Snapshot, board: &Board, max_lag: u64) -> Snapshot {
    let mut out = snapshot.clone();
    for (name, master) in out.masters.iter_mut() {
        let Some(judged) = board.masters.get(name) else { continue };
        let mut m: Master = (**master).clone();
        for r in &mut m.replicas {
            let addr = std::net::SocketAddr::new(r.ip, r.port).to_string();
            let under = judged.lags.get(&addr).is_some_and(|lag| *lag <= max_lag);
            r.healthy &= under;
        }
        if m != **master {
            *master = Arc::new(m);
        }
    }
    out
}

/// A topology reader that follows `topology` and `board` through [`filter`], and the task
/// that feeds it until shutdown. The topology is the main input: its writer gone while the
/// daemon runs ends the task with an error. The board is a side input: if its writer went
/// away, the last verdicts stay in force and topology changes still pass.
pub fn follow(
    mut topology: TopologyReader,
    mut board: Reader,
    max_lag: u64,
    shutdown: CancellationToken,
) -> (TopologyReader, impl Future<Output = anyhow::Result<()>>) {
    let first = filter(&topology.borrow_and_update(), &board.borrow_and_update(), max_lag);
    let (tx, rx) = watch::channel(Arc::new(first));
    let feed = async move {
        let mut board_open = true;
        loop {
            tokio::select! {
                changed = topology.changed() => if changed.is_err() {
                    return crate::topology::input_closed("the replica lag filter", &shutdown);
                },
                changed = board.changed(), if board_open => board_open = changed.is_ok(),
                () = shutdown.cancelled() => return Ok(()),
            }
            let next = filter(&topology.borrow_and_update(), &board.borrow_and_update(), max_lag);
            tx.send_if_modified(|current| {
                let same = **current == next;
                if !same {
                    *current = Arc::new(next);
                }
                !same
            });
        }
    };
    (rx, feed)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::readiness::{MasterReadiness, Verdict};
    use crate::topology::{MasterState, Replica};

    fn snapshot() -> Snapshot {
        let replica = |port| Replica {
            ip: [10, 0, 0, 2].into(),
            port,
            hostname: None,
            healthy: true,
            down: false,
        };
        let master = Master {
            withdrawn: None,
            provisional: false,
            name: "m".into(),
            label: "m".into(),
            primary: None,
            epoch: Some(1),
            since: None,
            state: MasterState::Ok,
            replicas: vec![replica(1), replica(2), replica(3)],
            sentinels: Default::default(),
        };
        Snapshot {
            version: 1,
            masters: [("m".into(), Arc::new(master))].into(),
            source_reachable: true,
        }
    }

    fn healthy(s: &Snapshot) -> Vec<u16> {
        s.masters["m"].replicas.iter().filter(|r| r.healthy).map(|r| r.port).collect()
    }

    #[test]
    fn lagging_and_unknown_replicas_are_left_out_once_judged() {
        let lags = BTreeMap::from([("10.0.0.2:1".into(), 100), ("10.0.0.2:2".into(), 5000)]);
        let verdict = Verdict { ready: true, blockers: vec![] };
        let board = Board { masters: [("m".into(), MasterReadiness { verdict, lags })].into() };
        assert_eq!(healthy(&filter(&snapshot(), &board, 1000)), [1]);
        assert_eq!(healthy(&filter(&snapshot(), &board, 5000)), [1, 2]);
        assert_eq!(healthy(&filter(&snapshot(), &Board::default(), 0)), [1, 2, 3], "not judged");
    }

    /// The readiness poll gone (its board closed) leaves the last verdicts, not a frozen view.
    #[tokio::test]
    async fn topology_changes_pass_after_the_board_closed() {
        let (publisher, topology) = crate::topology::channel();
        let (board_tx, board) = crate::readiness::channel();
        let stop = CancellationToken::new();
        let (mut filtered, feed) = follow(topology, board, 1000, stop.clone());
        let feed = tokio::spawn(feed);
        drop(board_tx);
        publisher.replace(snapshot());
        filtered.wait_for(|s| s.masters.contains_key("m")).await.expect("fed");
        stop.cancel();
        feed.await.expect("no panic").expect("a clean end at shutdown");
    }
}
