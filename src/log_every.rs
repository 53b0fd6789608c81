//! Logging a limit being hit, once per interval: a limit hit by a flood is hit thousands of
//! times a second, and a warning for each would cost more than the flood. The counter metric
//! beside each limit counts every hit; the log says that it happens, and how often.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a limit that keeps being hit is logged.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// The hits of one limit since it was last logged. Shared by every task that can hit it.
#[derive(Debug, Default)]
pub struct LogEvery {
    /// When the last log was due, and the hits since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogEvery {
    pub const fn new() -> Self {
        Self { state: Mutex::new((None, 0)) }
    }

    /// Counts one hit at `now`; `Some(hits)` (this one included) when it is the first since
    /// the last log was due, so the caller logs now.
    pub fn hit(&self, now: Instant) -> Option<u64> {
        self.hits(1, now)
    }

    /// Counts `n` hits at once (see [`Self::hit`]).
    pub fn hits(&self, n: u64, now: Instant) -> Option<u64> {
        // Only counts are behind the lock: a panic cannot leave them inconsistent.
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (last, hits) = &mut *state;
        *hits = hits.saturating_add(n);
        if last.is_some_and(|l| now.saturating_duration_since(l) < INTERVAL) {
            return None;
        }
        *last = Some(now);
        Some(std::mem::take(hits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_hit_of_each_interval_is_logged_with_the_hits_before_it() {
        let every = LogEvery::new();
        let start = Instant::now();
        assert_eq!(every.hit(start), Some(1));
        assert_eq!(every.hit(start + Duration::from_secs(1)), None);
        assert_eq!(every.hit(start + Duration::from_secs(2)), None);
        assert_eq!(every.hit(start + INTERVAL), Some(3));
        assert_eq!(every.hit(start + INTERVAL), None);
    }
}
