//! `drain.rate`: at most that many kills per second per node, whoever is killing.
//!
//! Kills go out in small batches (a twentieth of the rate, so every 50 ms) rather than all at
//! once and then a pause, so that a node with many clients is not asked to close thousands of
//! sockets in one event-loop turn, and the reconnect storm reaching the new primary is spread
//! evenly. One [`Pacer`] per node address is shared by the automatic drain, its sweeps and the
//! manual drain, so running them together never exceeds the rate.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// Batches per second at full rate.
const BATCHES_PER_SECOND: u32 = 20;

pub struct Pacer {
    rate: u32,
    /// The earliest moment the next batch may start.
    next: Mutex<Instant>,
}

impl Pacer {
    pub fn new(rate: u32) -> Self {
        Self { rate: rate.max(1), next: Mutex::new(Instant::now()) }
    }

    /// How many kills go out together.
    pub fn batch_size(&self) -> usize {
        (self.rate / BATCHES_PER_SECOND).max(1) as usize
    }

    /// Reserves a slot for `kills` kills and returns when they may start.
    pub fn reserve(&self, kills: usize) -> Instant {
        let cost = Duration::from_secs_f64(kills as f64 / f64::from(self.rate));
        // The lock only guards an `Instant`; a poisoned one still holds a valid value.
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let start = (*next).max(Instant::now());
        *next = start + cost;
        start
    }
}

/// One pacer per node.
#[derive(Default)]
pub struct Pacers {
    rate: u32,
    by_node: Mutex<HashMap<SocketAddr, Arc<Pacer>>>,
}

impl Pacers {
    pub fn new(rate: u32) -> Self {
        Self { rate, by_node: Mutex::default() }
    }

    pub fn of(&self, node: SocketAddr) -> Arc<Pacer> {
        // Held for one map operation that cannot panic; a poisoned map is still consistent.
        let mut map = self.by_node.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(node).or_insert_with(|| Arc::new(Pacer::new(self.rate))).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn batches_are_spread_over_a_second_per_rate() {
        let pacer = Pacer::new(100);
        assert_eq!(pacer.batch_size(), 5);
        let t0 = Instant::now();
        let starts: Vec<_> = (0..60).map(|_| pacer.reserve(5) - t0).collect();
        assert_eq!(starts[0], Duration::ZERO);
        assert_eq!(starts[1], Duration::from_millis(50));
        assert_eq!(starts[59], Duration::from_millis(2950));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_pacer_does_not_bank_credit() {
        let pacer = Pacer::new(20);
        assert_eq!(pacer.batch_size(), 1);
        pacer.reserve(1);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let now = Instant::now();
        assert_eq!(pacer.reserve(1), now);
        assert_eq!(pacer.reserve(1) - now, Duration::from_millis(50));
    }

    #[test]
    fn a_low_rate_still_kills_one_at_a_time() {
        assert_eq!(Pacer::new(1).batch_size(), 1);
        assert_eq!(Pacer::new(0).batch_size(), 1);
        assert_eq!(Pacer::new(2000).batch_size(), 100);
    }

    #[test]
    fn pacers_are_shared_per_node() {
        let pacers = Pacers::new(100);
        let a: SocketAddr = "127.0.0.1:1".parse().expect("literal");
        let b: SocketAddr = "127.0.0.1:2".parse().expect("literal");
        assert!(Arc::ptr_eq(&pacers.of(a), &pacers.of(a)));
        assert!(!Arc::ptr_eq(&pacers.of(a), &pacers.of(b)));
    }
}
