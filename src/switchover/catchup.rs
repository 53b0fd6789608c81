//! When the fenced primary's replicas have all of it: a pure verdict over one reading of the
//! offsets, table-tested; the shell in [`super::run`] takes readings until it is not `Wait`.

use std::net::SocketAddr;
use std::time::Duration;

/// One round of offsets: the primary's before and after asking the replicas (equal when the
/// fence holds: nothing new entered its stream meanwhile), and the best each replica showed
/// (its own `slave_repl_offset` or what it acknowledged to the primary; `None`: neither
/// answered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    pub primary_before: u64,
    pub primary_after: u64,
    pub replicas: Vec<(SocketAddr, Option<u64>)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every replica has the primary's whole stream, and the stream did not move.
    CaughtUp,
    /// The furthest behind, and by how many bytes; there is time left.
    Wait { replica: SocketAddr, lag: u64 },
    /// The same, but `max_wait` is over.
    GiveUp { replica: SocketAddr, lag: u64 },
}

impl Reading {
    /// The replica furthest behind the primary and its lag in bytes (`None`: no replicas). A
    /// replica *ahead* of the primary's offset has another replication history (it was read
    /// after the primary's second offset, so it cannot be ahead in this one): none of the
    /// primary's stream is known to be in it, and it counts as the whole offset behind.
    pub fn furthest(&self) -> Option<(SocketAddr, u64)> {
        let top = self.primary_before.max(self.primary_after);
        let lag = |offset: Option<u64>| match offset {
            Some(o) if o <= top => top - o,
            _ => top,
        };
        let behind = self.replicas.iter().map(|(addr, offset)| (*addr, lag(*offset)));
        behind.max_by_key(|(_, lag)| *lag)
    }
}

pub fn judge(reading: &Reading, elapsed: Duration, max_wait: Duration) -> Verdict {
    let Some((replica, lag)) = reading.furthest() else {
        return Verdict::GiveUp { replica: SocketAddr::from(([0, 0, 0, 0], 0)), lag: 0 };
    };
    let stable = reading.primary_before == reading.primary_after;
    match (lag, stable) {
        (0, true) => Verdict::CaughtUp,
        // The stream moved while we looked: the fence did not hold for a moment; look again.
        (0, false) => judge_time(replica, 1, elapsed, max_wait),
        (lag, _) => judge_time(replica, lag, elapsed, max_wait),
    }
}

fn judge_time(replica: SocketAddr, lag: u64, elapsed: Duration, max_wait: Duration) -> Verdict {
    if elapsed >= max_wait {
        Verdict::GiveUp { replica, lag }
    } else {
        Verdict::Wait { replica, lag }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use super::*;

    fn at(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 2], port))
    }

    fn reading(before: u64, after: u64, replicas: &[(u16, Option<u64>)]) -> Reading {
        let replicas = replicas.iter().map(|(p, o)| (at(*p), *o)).collect();
        Reading { primary_before: before, primary_after: after, replicas }
    }

    #[test]
    fn a_switchover_waits_until_every_candidate_has_the_whole_stream() {
        let s = Duration::from_secs;
        let table = [
            (reading(100, 100, &[(1, Some(100)), (2, Some(100))]), s(0), Verdict::CaughtUp),
            (
                reading(100, 100, &[(1, Some(100)), (2, Some(60))]),
                s(1),
                Verdict::Wait { replica: at(2), lag: 40 },
            ),
            (
                reading(100, 100, &[(1, Some(100)), (2, Some(60))]),
                s(5),
                Verdict::GiveUp { replica: at(2), lag: 40 },
            ),
            (reading(100, 100, &[(1, None)]), s(1), Verdict::Wait { replica: at(1), lag: 100 }),
            // A replica past the offset read first (the stream moved): never counted as done.
            (reading(100, 120, &[(1, Some(120))]), s(1), Verdict::Wait { replica: at(1), lag: 1 }),
            (reading(100, 120, &[(1, Some(110))]), s(1), Verdict::Wait { replica: at(1), lag: 10 }),
            // Ahead of the primary: another history, never caught up.
            (
                reading(100, 100, &[(1, Some(130))]),
                s(0),
                Verdict::Wait { replica: at(1), lag: 100 },
            ),
            (
                reading(100, 100, &[(1, Some(100)), (2, Some(130))]),
                s(5),
                Verdict::GiveUp { replica: at(2), lag: 100 },
            ),
        ];
        for (reading, elapsed, verdict) in table {
            assert_eq!(judge(&reading, elapsed, s(5)), verdict, "{reading:?} after {elapsed:?}");
        }
    }

    #[test]
    fn no_replica_is_never_caught_up() {
        assert!(matches!(
            judge(&reading(1, 1, &[]), Duration::ZERO, Duration::from_secs(5)),
            Verdict::GiveUp { .. }
        ));
    }
}
