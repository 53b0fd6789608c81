//! Long-polling: hold a request until a master's epoch passes a floor. It wakes on the topology
//! `watch` change itself (no polling interval), so a waiting client hears of a switch as soon
//! as the writer publishes it.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::ApiError;
use crate::topology::{Master, TopologyReader};

/// How a wait ended; each carries the master as published at that moment.
#[derive(Debug)]
pub enum Waited {
    /// The epoch passed the floor.
    Moved(Arc<Master>),
    TimedOut(Arc<Master>),
    /// The daemon is stopping (or the writer is gone): answer now rather than hold shutdown.
    Stopping(Arc<Master>),
}

/// Waits up to `limit` until master `name` has an epoch above `floor` (`None` is below every
/// epoch, so `floor: None` waits for a first one). 404 if the master is not (or no longer)
/// published.
pub async fn epoch_above(
    topology: &TopologyReader,
    name: &str,
    floor: Option<u64>,
    limit: Duration,
    shutdown: &CancellationToken,
) -> Result<Waited, ApiError> {
    let mut topology = topology.clone();
    let deadline = tokio::time::sleep(limit);
    tokio::pin!(deadline);
    loop {
        let master = current(&mut topology, name)?;
        if master.epoch > floor {
            return Ok(Waited::Moved(master));
        }
        tokio::select! {
            changed = topology.changed() => if changed.is_err() {
                return Ok(Waited::Stopping(master));
            },
            () = &mut deadline => return Ok(Waited::TimedOut(master)),
            () = shutdown.cancelled() => return Ok(Waited::Stopping(master)),
        }
    }
}

/// The master in the newest snapshot, marking that snapshot seen so `changed()` waits for the
/// next one.
fn current(topology: &mut TopologyReader, name: &str) -> Result<Arc<Master>, ApiError> {
    let snapshot = topology.borrow_and_update();
    snapshot.master(name).cloned().ok_or_else(|| ApiError::unknown_master(name))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::topology::{self, MasterState, Snapshot};

    fn snapshot(state: MasterState, epoch: Option<u64>) -> Snapshot {
        let master = Master {
            withdrawn: None,
            provisional: false,
            name: "m".into(),
            label: "m".into(),
            primary: None,
            epoch,
            since: None,
            state,
            replicas: vec![],
            sentinels: Default::default(),
        };
        let masters = BTreeMap::from([("m".to_string(), Arc::new(master))]);
        Snapshot { version: 0, masters, source_reachable: true }
    }

    #[tokio::test(start_paused = true)]
    async fn wakes_when_the_epoch_passes_the_floor() {
        let (publisher, reader) = topology::channel();
        publisher.replace(snapshot(MasterState::Unknown, Some(4)));
        let publishing = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            publisher.replace(snapshot(MasterState::Ok, Some(4)));
            tokio::time::sleep(Duration::from_secs(1)).await;
            publisher.replace(snapshot(MasterState::Ok, Some(5)));
        };
        let token = CancellationToken::new();
        let wait = epoch_above(&reader, "m", Some(4), Duration::from_secs(10), &token);
        let (waited, ()) = tokio::join!(wait, publishing);
        assert!(matches!(waited, Ok(Waited::Moved(m)) if m.epoch == Some(5)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_epoch_passes_an_empty_floor() {
        let (publisher, reader) = topology::channel();
        publisher.replace(snapshot(MasterState::Unknown, Some(0)));
        let token = CancellationToken::new();
        let waited = epoch_above(&reader, "m", None, Duration::from_secs(1), &token).await;
        assert!(matches!(waited, Ok(Waited::Moved(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn times_out_and_stops_at_shutdown() {
        let (publisher, reader) = topology::channel();
        publisher.replace(snapshot(MasterState::Unknown, Some(4)));
        let token = CancellationToken::new();
        let waited = epoch_above(&reader, "m", Some(4), Duration::from_secs(1), &token).await;
        assert!(matches!(waited, Ok(Waited::TimedOut(_))));
        token.cancel();
        let waited = epoch_above(&reader, "m", Some(4), Duration::from_secs(60), &token).await;
        assert!(matches!(waited, Ok(Waited::Stopping(_))));
    }

    #[tokio::test]
    async fn an_unknown_master_is_404() {
        let (_publisher, reader) = topology::channel();
        let token = CancellationToken::new();
        let waited = epoch_above(&reader, "x", None, Duration::from_secs(1), &token).await;
        assert_eq!(waited.err().map(|e| e.status.as_u16()), Some(404));
    }
}
