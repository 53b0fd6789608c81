//! Response-rate limiting for UDP (RRL, as in BIND and Knot): the answers to one client
//! prefix (IPv4 /24, IPv6 /56) of one kind ([`Class`]) are limited to `dns.rate_limit` a
//! second (by default [`DEFAULT_RATE_LIMIT`]; 0 turns the limit off). Past it an answer
//! *slips*: it is sent empty and truncated (TC), the question alone, which a real resolver
//! retries over TCP at once, where a forged source cannot complete a handshake. By default
//! every limited answer slips (`dns.rate_limit_slip: 1`, [`DEFAULT_SLIP`]), so no client that
//! can retry over TCP is ever left without its answer (a reconnect storm of a whole fleet
//! included); `N` slips one in N and drops the others, 0 drops them all. A spoofed flood
//! aimed at a victim is so reflected with full answers at no more than the rate, and past it
//! with answers no larger than the queries (a reflection factor of at most 1).
//!
//! The kinds: an answer with records (or SERVFAIL) is keyed on its name and type, NODATA on
//! its name, NXDOMAIN on the zone and REFUSED (and the other errors) on the prefix alone, so
//! that random names or types cannot escape the limit while a resolver that asks for many
//! masters' names is not limited. polestar serves one zone, so "per zone" and "per client
//! prefix" are the same key for NXDOMAIN; a REFUSED name is outside the zone, with no zone of
//! ours to name, and shares its prefix's one key for errors whatever the name, as BIND's
//! `errors-per-second` does. Each UDP socket's task keeps its own table (no lock on the
//! query path); its size is bounded, and when it is full the oldest key is forgotten to make
//! room: a full table answers more, never less, so it cannot punish new honest clients.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use hickory_proto::rr::{LowerName, RecordType};

#[cfg(doc)]
use crate::config::{DEFAULT_RATE_LIMIT, DEFAULT_SLIP};

#[cfg(test)]
const RATE: u32 = crate::config::DEFAULT_RATE_LIMIT;
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

/// What an answer is limited as, besides the client's prefix.
#[derive(Clone, Copy, Debug)]
pub enum Class<'a> {
    /// Records, or SERVFAIL for a master without a primary: per name and type (names and
    /// types that exist: bounded by the zone).
    Records(&'a LowerName, RecordType),
    /// The name exists, not the type: per name, whatever the type.
    NoData(&'a LowerName),
    /// A name that does not exist: one key for the zone (polestar serves one).
    NxDomain,
    /// REFUSED (a name outside the zone), FORMERR, NOTIMP and the like.
    Error,
}

/// `dns.rate_limit` and `dns.rate_limit_slip`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Answers a second per key; 0: no limit.
    pub rate: u32,
    /// Past the rate, one answer in this many slips and the others are dropped; 1: every
    /// one slips; 0: every one is dropped.
    pub slip: u32,
}

/// The answers of one window to one key.
struct Bucket {
    since: Instant,
    count: u32,
}

pub struct Limiter {
    settings: Settings,
    buckets: HashMap<u64, Bucket>,
    /// The keys of `buckets`, oldest first: the first to go when the table is full.
    order: VecDeque<u64>,
    /// Keys are hashed with a random seed, so collisions cannot be aimed.
    seed: RandomState,
    swept: Instant,
}

/// What [`Limiter::check`] decided and what it cost the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checked {
    pub verdict: Verdict,
    /// Whether an older key was forgotten to make room for this one.
    pub evicted: bool,
}

impl Limiter {
    pub fn new(settings: Settings, now: Instant) -> Self {
        let seed = RandomState::new();
        let (buckets, order) = (HashMap::new(), VecDeque::new());
        Self { settings, buckets, order, seed, swept: now }
    }

    /// The verdict on an answer of `class` to `client` at `now`.
    pub fn check(&mut self, client: IpAddr, class: Class<'_>, now: Instant) -> Checked {
        if self.settings.rate == 0 {
            return Checked { verdict: Verdict::Answer, evicted: false };
        }
        self.sweep(now);
        let key = self.key(client, class);
        let evicted = !self.buckets.contains_key(&key) && self.make_room();
        let bucket = self.buckets.entry(key).or_insert_with(|| {
            self.order.push_back(key);
            Bucket { since: now, count: 0 }
        });
        if now.duration_since(bucket.since) >= WINDOW {
            *bucket = Bucket { since: now, count: 0 };
        }
        bucket.count = bucket.count.saturating_add(1);
        let verdict = match bucket.count.checked_sub(self.settings.rate) {
            None | Some(0) => Verdict::Answer,
            Some(over) => past_the_rate(over, self.settings.slip),
        };
        Checked { verdict, evicted }
    }

    /// Forgets the keys of past windows, once a window.
    fn sweep(&mut self, now: Instant) {
        if now.duration_since(self.swept) < WINDOW {
            return;
        }
        self.buckets.retain(|_, b| now.duration_since(b.since) < WINDOW);
        let buckets = &self.buckets;
        self.order.retain(|k| buckets.contains_key(k));
        self.swept = now;
    }

    /// Forgets the oldest key when the table is full; whether it did.
    fn make_room(&mut self) -> bool {
        if self.buckets.len() < MAX_KEYS {
            return false;
        }
        if let Some(oldest) = self.order.pop_front() {
            self.buckets.remove(&oldest);
        }
        true
    }

    fn key(&self, client: IpAddr, class: Class<'_>) -> u64 {
        let mut hasher = self.seed.build_hasher();
        prefix(client).hash(&mut hasher);
        match class {
            Class::Records(name, rtype) => (0u8, name, u16::from(rtype)).hash(&mut hasher),
            Class::NoData(name) => (1u8, name).hash(&mut hasher),
            Class::NxDomain => 2u8.hash(&mut hasher),
            Class::Error => 3u8.hash(&mut hasher),
        }
        hasher.finish()
    }
}

/// The `over`-th answer past the rate: one in `slip` slips, the others are dropped.
fn past_the_rate(over: u32, slip: u32) -> Verdict {
    match slip {
        0 => Verdict::Drop,
        slip if over.is_multiple_of(slip) => Verdict::Slip,
        _ => Verdict::Drop,
    }
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

    const DEFAULTS: Settings = Settings { rate: RATE, slip: crate::config::DEFAULT_SLIP };

    fn name(text: &str) -> LowerName {
        LowerName::new(&Name::from_ascii(text).expect("a name"))
    }

    fn verdict(l: &mut Limiter, ip: [u8; 4], class: Class<'_>, now: Instant) -> Verdict {
        l.check(ip.into(), class, now).verdict
    }

    fn verdicts(l: &mut Limiter, ip: [u8; 4], n: u32, now: Instant) -> Vec<Verdict> {
        let big = name("big.redis.internal.");
        (0..n).map(|_| verdict(l, ip, Class::Records(&big, RecordType::A), now)).collect()
    }

    fn count(v: &[Verdict], which: Verdict) -> usize {
        v.iter().filter(|v| **v == which).count()
    }

    #[test]
    fn past_the_rate_every_answer_slips_by_default() {
        let now = Instant::now();
        let mut l = Limiter::new(DEFAULTS, now);
        let v = verdicts(&mut l, [10, 0, 0, 1], RATE + 10, now);
        assert!(v[..RATE as usize].iter().all(|v| *v == Verdict::Answer));
        assert_eq!(count(&v[RATE as usize..], Verdict::Slip), 10, "{v:?}");
    }

    #[test]
    fn a_slip_of_n_truncates_one_in_n_and_zero_drops_all() {
        let now = Instant::now();
        let mut l = Limiter::new(Settings { rate: RATE, slip: 2 }, now);
        let past = verdicts(&mut l, [10, 0, 0, 1], RATE + 10, now).split_off(RATE as usize);
        assert_eq!((count(&past, Verdict::Slip), count(&past, Verdict::Drop)), (5, 5));
        let mut l = Limiter::new(Settings { rate: RATE, slip: 0 }, now);
        let past = verdicts(&mut l, [10, 0, 0, 1], RATE + 10, now).split_off(RATE as usize);
        assert_eq!(count(&past, Verdict::Drop), 10, "{past:?}");
    }

    #[test]
    fn the_limit_is_per_prefix_name_and_type_and_per_second() {
        let now = Instant::now();
        let mut l = Limiter::new(DEFAULTS, now);
        verdicts(&mut l, [10, 0, 0, 1], RATE, now);
        assert_ne!(verdicts(&mut l, [10, 0, 0, 200], 1, now), [Verdict::Answer], "same /24");
        assert_eq!(verdicts(&mut l, [10, 0, 1, 1], 1, now), [Verdict::Answer], "another /24");
        let other = name("other.redis.internal.");
        let other_a = Class::Records(&other, RecordType::A);
        assert_eq!(verdict(&mut l, [10, 0, 0, 1], other_a, now), Verdict::Answer);
        let big = name("big.redis.internal.");
        let big_srv = Class::Records(&big, RecordType::SRV);
        assert_eq!(verdict(&mut l, [10, 0, 0, 1], big_srv, now), Verdict::Answer);
        let later = now + WINDOW;
        assert_eq!(verdicts(&mut l, [10, 0, 0, 1], 1, later), [Verdict::Answer], "a new second");
    }

    /// Regression (docs/decisions.md D22): NXDOMAIN was keyed by name, so random names escaped the
    /// limit.
    #[test]
    fn nxdomain_and_refused_are_limited_per_zone_not_per_name() {
        let now = Instant::now();
        let mut l = Limiter::new(Settings { rate: RATE, slip: 0 }, now);
        let ip = [10, 0, 0, 1];
        let answered =
            (0..RATE * 2).filter(|_| verdict(&mut l, ip, Class::NxDomain, now) == Verdict::Answer);
        assert_eq!(answered.count(), RATE as usize, "random names share one key");
        let refused =
            (0..RATE * 2).filter(|_| verdict(&mut l, ip, Class::Error, now) == Verdict::Answer);
        assert_eq!(refused.count(), RATE as usize);
        let cache = name("cache.redis.internal.");
        let nodata = (0..RATE * 2)
            .filter(|_| verdict(&mut l, ip, Class::NoData(&cache), now) == Verdict::Answer);
        assert_eq!(nodata.count(), RATE as usize, "every missing type of a name shares its key");
        let cache_a = Class::Records(&cache, RecordType::A);
        assert_eq!(verdict(&mut l, ip, cache_a, now), Verdict::Answer, "answers are apart");
    }

    #[test]
    fn a_rate_of_zero_is_no_limit() {
        let now = Instant::now();
        let mut l = Limiter::new(Settings { rate: 0, slip: 0 }, now);
        let v = verdicts(&mut l, [10, 0, 0, 1], RATE * 3, now);
        assert!(v.iter().all(|v| *v == Verdict::Answer));
    }

    /// Regression (docs/decisions.md D22): a full table limited every new key, so a flood of many
    /// prefixes made honest new clients lose answers.
    #[test]
    fn a_full_table_forgets_its_oldest_key_and_answers_a_new_client() {
        let now = Instant::now();
        let mut l = Limiter::new(Settings { rate: RATE, slip: 0 }, now);
        let big = name("big.redis.internal.");
        let big_a = Class::Records(&big, RecordType::A);
        for i in 0..MAX_KEYS as u32 + 100 {
            let ip = IpAddr::from((i << 8).to_be_bytes());
            l.check(ip, big_a, now);
        }
        assert_eq!(l.buckets.len(), MAX_KEYS);
        assert_eq!(l.order.len(), MAX_KEYS);
        let fresh = IpAddr::from([250, 250, 250, 1]);
        let checked = l.check(fresh, big_a, now);
        assert_eq!(checked, Checked { verdict: Verdict::Answer, evicted: true });
        l.check(fresh, big_a, now + WINDOW);
        assert!(l.buckets.len() <= 1, "old keys are swept");
        assert_eq!(l.order.len(), l.buckets.len());
    }
}
