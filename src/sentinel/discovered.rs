//! The Sentinels the configured ones list for a master that are not configured themselves:
//! shown (`sentinels.discovered`), counted, logged, never trusted. Anyone who can publish on
//! a data node can make a Sentinel list a fake peer (a forged hello: 200 of them in under
//! 2 s), so what polestar keeps and says of them is bounded: the API shows the first
//! [`MAX_SHOWN`] (by address) and the gauge counts them all, a master's new ones are logged
//! once per [`crate::log_every::INTERVAL`], and no event is recorded for them (every event
//! makes every agent read the state again).

use std::collections::BTreeSet;
use std::time::Instant;

use crate::log_every::LogEvery;

/// Discovered Sentinels shown per master; a real deployment has a handful.
pub const MAX_SHOWN: usize = 16;

/// One master's discovered Sentinels.
#[derive(Debug, Default)]
pub struct Discovered {
    /// Every one, by `host:port` (as many as the configured Sentinels list, whose replies
    /// are bounded by the link).
    all: BTreeSet<String>,
    warned: LogEvery,
}

/// What an update found.
#[derive(Debug, PartialEq, Eq)]
pub struct Found {
    /// Discovered ones not listed before; their first one.
    pub new: usize,
    pub first: Option<String>,
}

impl Discovered {
    /// Replaces the set with `all`; what is new in it.
    pub fn update(&mut self, all: BTreeSet<String>) -> Found {
        let mut fresh = all.difference(&self.all);
        let first = fresh.next().cloned();
        let new = first.as_ref().map_or(0, |_| 1 + fresh.count());
        self.all = all;
        Found { new, first }
    }

    /// Whether new ones found at `now` are to be logged (once per interval per master), and
    /// how many were found since the last log.
    pub fn log_due(&self, found: &Found, now: Instant) -> Option<u64> {
        if found.new == 0 { None } else { self.warned.hits(found.new as u64, now) }
    }

    /// The ones shown: the first [`MAX_SHOWN`] by address.
    pub fn shown(&self) -> impl Iterator<Item = &String> {
        self.all.iter().take(MAX_SHOWN)
    }

    pub fn total(&self) -> usize {
        self.all.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fakes(n: u16) -> BTreeSet<String> {
        (0..n).map(|i| format!("10.0.0.1:{}", 20000 + i)).collect()
    }

    #[test]
    fn two_hundred_fakes_show_sixteen_count_all_and_log_once_per_interval() {
        let mut d = Discovered::default();
        let now = Instant::now();
        let mut logs = 0;
        for n in 1..=200 {
            let found = d.update(fakes(n));
            assert_eq!(found.new, 1);
            logs += usize::from(d.log_due(&found, now).is_some());
        }
        assert_eq!(logs, 1, "one log for a master within an interval");
        assert_eq!((d.shown().count(), d.total()), (MAX_SHOWN, 200));
        let found = d.update(fakes(210));
        let later = now + crate::log_every::INTERVAL;
        assert_eq!(d.log_due(&found, later), Some(199 + 10), "every one since counted");
        assert_eq!(d.update(fakes(210)), Found { new: 0, first: None });
    }
}
