//! The per-master series, kept in one compact record per master.
//!
//! Every master has some 40 series from the start (docs/operating.md, Metrics). Kept by the
//! Prometheus exporter's registry, each costs a key (name, label vector, the master's name
//! copied), a hash-table slot and a shared handle: about 6 MB of a 1,000-master daemon's heap,
//! the largest part of it (bench/README.md, "Issue 24, RSS"). Here a master is one record
//! of plain atomics laid out once for every master ([`Layout`]), with its name stored once: the
//! same series, the same exposition, a tenth of the memory.
//!
//! The recorder ([`Recorder`]) routes every key of a per-master family here, and every other
//! key to the exporter. A per-master key must have the family's shape (`master` first, then the
//! family's one other label with one of its known values). polestar's own calls all do: their
//! values are the constants in `metrics.rs`, `Reason::ALL` and `MasterState::ALL`. One that did
//! not would be a bug; it is logged and not kept, because kept by the exporter it would make a
//! second block of the family, and Prometheus refuses a whole exposition over a family's second
//! `TYPE` line.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use metrics::{Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName};
use metrics::{Metadata, SharedString, Unit};
use metrics_exporter_prometheus::PrometheusRecorder;

use super::*;
use crate::readiness::Reason;
use crate::topology::MasterState;

/// What a family's series hold.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Type {
    Counter,
    Gauge,
    /// Bucket counts (not cumulative), then the count, then the sum's bits.
    Histogram(&'static [f64]),
}

impl Type {
    fn name(self) -> &'static str {
        match self {
            Type::Counter => "counter",
            Type::Gauge => "gauge",
            Type::Histogram(_) => "histogram",
        }
    }

    /// The slots one series takes.
    fn width(self) -> usize {
        match self {
            Type::Histogram(bounds) => bounds.len() + 2,
            _ => 1,
        }
    }
}

/// The label a family has besides `master`.
#[derive(Debug)]
enum Other {
    None,
    /// One series per value, all known in advance.
    Fixed(&'static str, Vec<&'static str>),
    /// `replica`: one series per replica ever seen (kept beside the fixed slots).
    Replica,
}

/// One per-master family and where its series live in a master's record.
#[derive(Debug)]
struct Family {
    name: &'static str,
    kind: Type,
    other: Other,
    /// The first slot of its first series.
    slot: usize,
    /// The presence bit of its first series.
    bit: usize,
}

impl Family {
    fn series(&self) -> usize {
        match &self.other {
            Other::None => 1,
            Other::Fixed(_, values) => values.len(),
            Other::Replica => 0,
        }
    }
}

/// The families and their slots: the same for every master.
#[derive(Debug)]
struct Layout {
    families: Vec<Family>,
    slots: usize,
}

impl Layout {
    fn new() -> Self {
        let fixed = |label, values: &[&'static str]| Other::Fixed(label, values.to_vec());
        let reasons: Vec<&'static str> = Reason::ALL.map(Reason::as_str).to_vec();
        let states: Vec<&'static str> = MasterState::ALL.map(MasterState::as_str).to_vec();
        let families = [
            (PRIMARY_CHANGES, Type::Counter, Other::None),
            (OLD_PRIMARY_CLIENTS, Type::Gauge, Other::None),
            (OLD_PRIMARY_STALE_CLIENTS, Type::Counter, Other::None),
            (DRAIN_KILLED, Type::Counter, fixed("method", &KILL_METHODS)),
            (SWITCHOVERS, Type::Counter, fixed("outcome", &SWITCHOVER_OUTCOMES)),
            (SWITCHOVER_WAIT, Type::Histogram(&SWITCHOVER_WAIT_BUCKETS), Other::None),
            (FAILOVER_READY, Type::Gauge, Other::None),
            (FAILOVER_BLOCKED, Type::Gauge, Other::Fixed("reason", reasons)),
            (MASTER_EPOCH, Type::Gauge, Other::None),
            (MASTER_STATE, Type::Gauge, Other::Fixed("state", states)),
            (SENTINELS_DISCOVERED, Type::Gauge, Other::None),
            (REPLICA_LAG, Type::Gauge, Other::Replica),
        ];
        let (mut slot, mut bit) = (0, 0);
        let families = families.map(|(name, kind, other)| {
            let family = Family { name, kind, other, slot, bit };
            slot += family.series() * kind.width();
            bit += family.series();
            family
        });
        assert!(bit <= 64, "a master's presence bits fit one word");
        Self { families: families.into(), slots: slot }
    }

    fn family(&self, name: &str) -> Option<&Family> {
        self.families.iter().find(|f| f.name == name)
    }

    /// Where `key` of `family` lives, when it has the family's shape: (master, place).
    fn place<'k>(family: &Family, key: &'k Key) -> Option<(&'k str, Place<'k>)> {
        let mut labels = key.labels();
        let master = labels.next().filter(|l| l.key() == "master")?.value();
        let other = labels.next();
        if labels.next().is_some() {
            return None;
        }
        let place = match (&family.other, other) {
            (Other::None, None) => Place::Series(0),
            (Other::Fixed(name, values), Some(l)) if l.key() == *name => {
                Place::Series(values.iter().position(|v| *v == l.value())?)
            }
            (Other::Replica, Some(l)) if l.key() == "replica" => Place::Replica(l.value()),
            _ => return None,
        };
        Some((master, place))
    }
}

/// A series within its family.
enum Place<'k> {
    /// The n-th of the family's fixed series.
    Series(usize),
    Replica(&'k str),
}

/// One master's series.
#[derive(Debug)]
struct Record {
    slots: Box<[AtomicU64]>,
    /// Which fixed series exist (were registered): only those are exposed, as the exporter did.
    present: AtomicU64,
    /// `replica_lag_bytes` by replica, in the order first seen; a gauge's bits.
    replicas: RwLock<Vec<(Box<str>, AtomicU64)>>,
}

impl Record {
    fn new(layout: &Layout) -> Self {
        let slots = (0..layout.slots).map(|_| AtomicU64::new(0)).collect();
        Self { slots, present: AtomicU64::new(0), replicas: RwLock::default() }
    }

    fn has(&self, bit: usize) -> bool {
        self.present.load(Ordering::Relaxed) & (1 << bit) != 0
    }

    /// The index of `replica`'s lag, added when new.
    fn replica(&self, replica: &str) -> usize {
        let read = self.replicas.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = read.iter().position(|(r, _)| &**r == replica) {
            return at;
        }
        drop(read);
        let mut write = self.replicas.write().unwrap_or_else(PoisonError::into_inner);
        match write.iter().position(|(r, _)| &**r == replica) {
            Some(at) => at,
            None => {
                write.push((replica.into(), AtomicU64::new(0)));
                write.len() - 1
            }
        }
    }
}

/// Every master's record, the layout they share and the families' descriptions.
#[derive(Debug)]
pub struct PerMaster {
    layout: Layout,
    masters: RwLock<HashMap<Arc<str>, Arc<Record>>>,
    help: Mutex<HashMap<&'static str, String>>,
}

impl Default for PerMaster {
    fn default() -> Self {
        Self { layout: Layout::new(), masters: RwLock::default(), help: Mutex::default() }
    }
}

impl PerMaster {
    fn record(&self, master: &str) -> Arc<Record> {
        let masters = self.masters.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(record) = masters.get(master) {
            return record.clone();
        }
        drop(masters);
        let mut masters = self.masters.write().unwrap_or_else(PoisonError::into_inner);
        let record =
            masters.entry(master.into()).or_insert_with(|| Record::new(&self.layout).into());
        record.clone()
    }

    /// The handle of `key`'s series (registering it); `None` when `key` is not per-master.
    fn handle(&self, key: &Key) -> Option<Route> {
        let family = self.layout.family(key.name())?;
        let Some((master, place)) = Layout::place(family, key) else {
            tracing::error!(key = %key, "a per-master series without its family's labels (a bug); not kept");
            return Some(Route::Dropped);
        };
        let record = self.record(master);
        let at = match place {
            Place::Series(n) => {
                record.present.fetch_or(1 << (family.bit + n), Ordering::Relaxed);
                let first = family.slot + n * family.kind.width();
                match family.kind {
                    Type::Histogram(bounds) => At::Histogram(first, bounds),
                    _ => At::Value(first),
                }
            }
            Place::Replica(replica) => At::Replica(record.replica(replica)),
        };
        Some(Route::Kept(Slot { record, at }))
    }

    /// Keeps the description of a per-master family; false for any other name.
    fn describe(&self, name: &KeyName, description: &SharedString) -> bool {
        let Some(family) = self.layout.family(name.as_str()) else { return false };
        let mut help = self.help.lock().unwrap_or_else(PoisonError::into_inner);
        help.insert(family.name, description.to_string());
        true
    }

    /// Appends the exposition of every registered per-master series: families in a fixed
    /// order, masters by name.
    pub fn render(&self, out: &mut String) {
        let masters = self.masters.read().unwrap_or_else(PoisonError::into_inner);
        let mut masters: Vec<(String, &Record)> =
            masters.iter().map(|(name, record)| (label_value(name), &**record)).collect();
        masters.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let help = self.help.lock().unwrap_or_else(PoisonError::into_inner);
        for family in &self.layout.families {
            let mut lines = String::new();
            for (master, record) in &masters {
                render_series(&mut lines, family, master, record);
            }
            if lines.is_empty() {
                continue;
            }
            if let Some(text) = help.get(family.name) {
                let _ = writeln!(out, "# HELP {} {text}", family.name);
            }
            let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind.name());
            out.push_str(&lines);
            out.push('\n');
        }
    }
}

/// The lines of one master's series of `family`.
fn render_series(out: &mut String, family: &Family, master: &str, record: &Record) {
    let name = family.name;
    let value = |slot: usize| record.slots[slot].load(Ordering::Relaxed);
    if let Other::Replica = family.other {
        let replicas = record.replicas.read().unwrap_or_else(PoisonError::into_inner);
        for (replica, lag) in replicas.iter() {
            let gauge = f64::from_bits(lag.load(Ordering::Relaxed));
            let replica = label_value(replica);
            let _ = writeln!(out, "{name}{{master=\"{master}\",replica=\"{replica}\"}} {gauge}");
        }
        return;
    }
    for n in 0..family.series() {
        if !record.has(family.bit + n) {
            continue;
        }
        let labels = match &family.other {
            Other::Fixed(label, values) => format!("master=\"{master}\",{label}=\"{}\"", values[n]),
            _ => format!("master=\"{master}\""),
        };
        let first = family.slot + n * family.kind.width();
        match family.kind {
            Type::Counter => {
                let _ = writeln!(out, "{name}{{{labels}}} {}", value(first));
            }
            Type::Gauge => {
                let _ = writeln!(out, "{name}{{{labels}}} {}", f64::from_bits(value(first)));
            }
            Type::Histogram(bounds) => {
                let mut cumulative = 0;
                for (i, bound) in bounds.iter().enumerate() {
                    cumulative += value(first + i);
                    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
                }
                let count = value(first + bounds.len());
                let sum = f64::from_bits(value(first + bounds.len() + 1));
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
                let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
                let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
            }
        }
    }
}

/// A label value as the exposition format writes it: `\`, `"` and newlines escaped.
fn label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Where a per-master key's handle writes.
enum Route {
    Kept(Slot),
    Dropped,
}

/// Where a handle writes.
enum At {
    Value(usize),
    /// The first slot of a histogram with these bucket bounds.
    Histogram(usize, &'static [f64]),
    Replica(usize),
}

/// A handle to one series of one master's record.
struct Slot {
    record: Arc<Record>,
    at: At,
}

impl Slot {
    /// Applies `f` to the gauge's value (stored as bits).
    fn update(&self, f: impl Fn(f64) -> f64) {
        let update = |cell: &AtomicU64| {
            let step = |bits| Some(f(f64::from_bits(bits)).to_bits());
            let _ = cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, step);
        };
        match self.at {
            At::Value(slot) => update(&self.record.slots[slot]),
            At::Replica(n) => {
                let replicas = self.record.replicas.read().unwrap_or_else(PoisonError::into_inner);
                update(&replicas[n].1);
            }
            At::Histogram(..) => {}
        }
    }

    fn counter(&self) -> Option<&AtomicU64> {
        match self.at {
            At::Value(slot) => Some(&self.record.slots[slot]),
            _ => None,
        }
    }
}

impl CounterFn for Slot {
    fn increment(&self, value: u64) {
        if let Some(cell) = self.counter() {
            cell.fetch_add(value, Ordering::Relaxed);
        }
    }

    fn absolute(&self, value: u64) {
        if let Some(cell) = self.counter() {
            cell.fetch_max(value, Ordering::Relaxed);
        }
    }
}

impl GaugeFn for Slot {
    fn increment(&self, value: f64) {
        self.update(|v| v + value);
    }

    fn decrement(&self, value: f64) {
        self.update(|v| v - value);
    }

    fn set(&self, value: f64) {
        self.update(|_| value);
    }
}

impl HistogramFn for Slot {
    fn record(&self, value: f64) {
        let At::Histogram(first, bounds) = self.at else { return };
        let slots = &self.record.slots;
        if let Some(bucket) = bounds.iter().position(|bound| value <= *bound) {
            slots[first + bucket].fetch_add(1, Ordering::Relaxed);
        }
        slots[first + bounds.len()].fetch_add(1, Ordering::Relaxed);
        let sum = &slots[first + bounds.len() + 1];
        let add = |bits| Some((f64::from_bits(bits) + value).to_bits());
        let _ = sum.fetch_update(Ordering::Relaxed, Ordering::Relaxed, add);
    }
}

/// The daemon's recorder: per-master series kept here, every other series by the exporter.
pub struct Recorder {
    pub(super) exporter: PrometheusRecorder,
    pub(super) per_master: Arc<PerMaster>,
}

impl Recorder {
    /// What renders every series this recorder keeps.
    pub(super) fn handle(&self) -> super::Handle {
        super::Handle { exporter: self.exporter.handle(), per_master: self.per_master.clone() }
    }
}

impl metrics::Recorder for Recorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        if !self.per_master.describe(&key, &description) {
            self.exporter.describe_counter(key, unit, description);
        }
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        if !self.per_master.describe(&key, &description) {
            self.exporter.describe_gauge(key, unit, description);
        }
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        if !self.per_master.describe(&key, &description) {
            self.exporter.describe_histogram(key, unit, description);
        }
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        match self.per_master.handle(key) {
            Some(Route::Kept(slot)) => Counter::from_arc(Arc::new(slot)),
            Some(Route::Dropped) => Counter::noop(),
            None => self.exporter.register_counter(key, metadata),
        }
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        match self.per_master.handle(key) {
            Some(Route::Kept(slot)) => Gauge::from_arc(Arc::new(slot)),
            Some(Route::Dropped) => Gauge::noop(),
            None => self.exporter.register_gauge(key, metadata),
        }
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        match self.per_master.handle(key) {
            Some(Route::Kept(slot)) => Histogram::from_arc(Arc::new(slot)),
            Some(Route::Dropped) => Histogram::noop(),
            None => self.exporter.register_histogram(key, metadata),
        }
    }
}

#[cfg(test)]
mod tests;
