//! Response-rate limiting for UDP (RRL, as in BIND and Knot): the answers to one client
//! prefix (IPv4 /24, IPv6 /56) for one name and type are limited to `dns.rate_limit` a
//! second (by default [`DEFAULT_RATE_LIMIT`]; 0 turns the limit off). Past
//! it, every [`SLIP`]-th answer is sent as an empty truncated one (TC), which a real resolver
//! retries over TCP, and the others are dropped. A spoofed flood aimed at a victim is so
//! reflected at no more than the rate (with the truncated answers no larger than the
//! queries), while real clients keep their answers: over TCP, where a forged source cannot
//! complete a handshake.
//!
//! Keyed on the name and type as well as the prefix, a resolver that asks for many names
//! (one per master, every TTL) is not limited; only answers repeated to one prefix are. Each
//! UDP socket's task keeps its own table (no lock on the query path); the table's size is
//! bounded, and when it is full the answers to new keys are limited as if over the rate.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use hickory_proto::rr::{LowerName, RecordType};

#[cfg(doc)]
use crate::config::DEFAULT_RATE_LIMIT;

#[cfg(test)]
const RATE: u32 = crate::config::DEFAULT_RATE_LIMIT;
/// Past the rate, one answer in this many is sent truncated; the others are dropped.
pub const SLIP: u32 = 2;
const WINDOW: Duration = Duration::from_secs(1);
/// Keys tracked at once per socket (a few MB at most).
const MAX_KEYS: usize = 65_536;
const V4_PREFIX: u32 = 24;
const V6_PREFIX: u32 = 56;

/// What to do with one answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Answer,
    /// An empty answer with TC set, so the client retries over TCP.
    Slip,
    Drop,
}

/// The answers of one window to one key.
struct Bucket {
    since: Instant,
    count: u32,
}

pub struct Limiter {
    /// Answers a second per key; 0: no limit.
    rate: u32,
    buckets: HashMap<u64, Bucket>,
    /// Keys are hashed with a random seed, so collisions cannot be aimed.
    seed: RandomState,
    swept: Instant,
    /// Answers limited because the table was full (for the slip's one in `SLIP`).
    untracked: u32,
}

impl Limiter {
    pub fn new(rate: u32, now: Instant) -> Self {
        let seed = RandomState::new();
        Self { rate, buckets: HashMap::new(), seed, swept: now, untracked: 0 }
    }

    /// The verdict on answering `name`/`rtype` to `client` at `now`.
    pub fn check(
        &mut self,
        client: IpAddr,
        name: &LowerName,
        rtype: RecordType,
        now: Instant,
    ) -> Verdict {
        if self.rate == 0 {
            return Verdict::Answer;
        }
        if now.duration_since(self.swept) >= WINDOW {
            self.buckets.retain(|_, b| now.duration_since(b.since) < WINDOW);
            self.swept = now;
        }
        let key = self.key(client, name, rtype);
        if !self.buckets.contains_key(&key) && self.buckets.len() >= MAX_KEYS {
            self.untracked = self.untracked.wrapping_add(1);
            return past_the_rate(self.untracked);
        }
        let bucket = self.buckets.entry(key).or_insert(Bucket { since: now, count: 0 });
        if now.duration_since(bucket.since) >= WINDOW {
            *bucket = Bucket { since: now, count: 0 };
        }
        bucket.count = bucket.count.saturating_add(1);
        match bucket.count.checked_sub(self.rate) {
            None | Some(0) => Verdict::Answer,
            Some(over) => past_the_rate(over),
        }
    }

    fn key(&self, client: IpAddr, name: &LowerName, rtype: RecordType) -> u64 {
        let mut hasher = self.seed.build_hasher();
        prefix(client).hash(&mut hasher);
        name.hash(&mut hasher);
        u16::from(rtype).hash(&mut hasher);
        hasher.finish()
    }
}

/// The `over`-th answer past the rate: one in [`SLIP`] slips, the others are dropped.
fn past_the_rate(over: u32) -> Verdict {
    if over.is_multiple_of(SLIP) { Verdict::Slip } else { Verdict::Drop }
}

/// The client's prefix: its network, as a number (IPv4 and IPv6 apart).
fn prefix(ip: IpAddr) -> (bool, u128) {
    match ip.to_canonical() {
        IpAddr::V4(v4) => (false, u128::from(u32::from(v4) >> (32 - V4_PREFIX))),
        IpAddr::V6(v6) => (true, u128::from(v6) >> (128 - V6_PREFIX)),
    }
}

#[cfg(test)]
mod tests {
    use hickory_proto::rr::Name;

    use super::*;

    fn name(text: &str) -> LowerName {
        LowerName::new(&Name::from_ascii(text).expect("a name"))
    }

    fn verdicts(l: &mut Limiter, ip: [u8; 4], n: u32, now: Instant) -> Vec<Verdict> {
        let big = name("big.redis.internal.");
        (0..n).map(|_| l.check(ip.into(), &big, RecordType::A, now)).collect()
    }

    #[test]
    fn past_the_rate_one_in_slip_is_truncated_and_the_rest_dropped() {
        let now = Instant::now();
        let mut l = Limiter::new(RATE, now);
        let v = verdicts(&mut l, [10, 0, 0, 1], RATE + 10, now);
        assert!(v[..RATE as usize].iter().all(|v| *v == Verdict::Answer));
        let past = &v[RATE as usize..];
        assert_eq!(past.iter().filter(|v| **v == Verdict::Slip).count(), 5, "{past:?}");
        assert_eq!(past.iter().filter(|v| **v == Verdict::Drop).count(), 5, "{past:?}");
    }

    #[test]
    fn the_limit_is_per_prefix_name_and_type_and_per_second() {
        let now = Instant::now();
        let mut l = Limiter::new(RATE, now);
        verdicts(&mut l, [10, 0, 0, 1], RATE, now);
        assert_ne!(verdicts(&mut l, [10, 0, 0, 200], 1, now), [Verdict::Answer], "same /24");
        assert_eq!(verdicts(&mut l, [10, 0, 1, 1], 1, now), [Verdict::Answer], "another /24");
        let other = name("other.redis.internal.");
        assert_eq!(l.check([10, 0, 0, 1].into(), &other, RecordType::A, now), Verdict::Answer);
        let big = name("big.redis.internal.");
        assert_eq!(l.check([10, 0, 0, 1].into(), &big, RecordType::SRV, now), Verdict::Answer);
        let later = now + WINDOW;
        assert_eq!(verdicts(&mut l, [10, 0, 0, 1], 1, later), [Verdict::Answer], "a new second");
    }

    #[test]
    fn a_rate_of_zero_is_no_limit() {
        let now = Instant::now();
        let mut l = Limiter::new(0, now);
        let v = verdicts(&mut l, [10, 0, 0, 1], RATE * 3, now);
        assert!(v.iter().all(|v| *v == Verdict::Answer));
    }

    #[test]
    fn the_table_is_bounded_and_limits_new_keys_when_full() {
        let now = Instant::now();
        let mut l = Limiter::new(RATE, now);
        let big = name("big.redis.internal.");
        for i in 0..MAX_KEYS as u32 + 100 {
            let ip = IpAddr::from((i << 8).to_be_bytes());
            l.check(ip, &big, RecordType::A, now);
        }
        assert_eq!(l.buckets.len(), MAX_KEYS);
        let fresh = IpAddr::from([250, 250, 250, 1]);
        assert_ne!(l.check(fresh, &big, RecordType::A, now), Verdict::Answer);
        l.check(fresh, &big, RecordType::A, now + WINDOW);
        assert!(l.buckets.len() <= 1, "old keys are swept");
    }
}
