//! The soak's figures per fault kind: recovery (fault -> every client served by the new
//! primary, and the Sentinels' switch -> that), acknowledged writes lost (the `RPUSH`ed ids
//! missing from the final list on the final primary), seconds during which polestar named a
//! node that no Sentinel had named within the grace, seconds without an answer, stuck clients.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use super::clients::Client;
use super::monitor::Sample;
use super::{Kind, Settings};

/// How long after the Sentinels stopped naming a node polestar may still name it (the drain
/// grace: `dns.ttl` 1 s + 0.5 s). Naming the promoted replica before the other Sentinels do is
/// no error: the leader Sentinel names it from the promotion on.
pub const GRACE: Duration = Duration::from_millis(1500);
/// How long before the Sentinels name a node polestar may already name it: polestar flips
/// when the promoted replica answers `ROLE` master, and the leader names it only after its next
/// `INFO` of that replica, up to about a second later.
pub const AHEAD: Duration = Duration::from_millis(1500);

pub struct Fault {
    pub kind: Kind,
    pub old: SocketAddr,
    pub new: SocketAddr,
    pub start: Instant,
    /// When the cluster was steady again.
    pub end: Instant,
    /// Per client: fault -> first success on the new primary; `None`: stuck.
    pub recovery: Vec<(String, Option<Duration>)>,
}

impl Fault {
    /// The slowest client's recovery, `None` if one is stuck.
    pub fn slowest(&self) -> Option<Duration> {
        self.recovery.iter().map(|(_, r)| *r).collect::<Option<Vec<_>>>()?.into_iter().max()
    }

    pub fn stuck(&self) -> Vec<&str> {
        self.recovery.iter().filter(|(_, r)| r.is_none()).map(|(n, _)| n.as_str()).collect()
    }

    pub fn line(&self) -> String {
        let each: Vec<String> = self
            .recovery
            .iter()
            .map(|(n, r)| match r {
                Some(d) => format!("{n} {:.2}s", d.as_secs_f64()),
                None => format!("{n} STUCK"),
            })
            .collect();
        format!("{} {} -> {}: {}", self.kind.name(), self.old, self.new, each.join(", "))
    }
}

#[derive(Default)]
struct Figures {
    count: usize,
    recovery: Vec<f64>,
    after_switch: Vec<f64>,
    acked: usize,
    lost: usize,
    /// Seconds wrong beyond the grace: central DNS, central HTTP, agent HTTP.
    wrong: [f64; 3],
    /// Seconds without an answer while the Sentinels answered.
    silent: [f64; 3],
    stuck: Vec<String>,
}

pub struct Report {
    pub seed: u64,
    pub elapsed: Duration,
    pub faults: Vec<Fault>,
    by_kind: BTreeMap<Option<Kind>, Figures>,
    incr_acked: u64,
    counter: u64,
    reconnects: u64,
    /// Why client sessions ended, summed over the clients.
    reasons: BTreeMap<String, u64>,
    /// Per client that caches DNS answers: its name, cache time, lost and acknowledged writes.
    caching: Vec<(String, Duration, usize, usize)>,
}

impl Report {
    pub fn new(
        settings: &Settings,
        elapsed: Duration,
        faults: Vec<Fault>,
        clients: &[Client],
        listing: &str,
        counter: u64,
        samples: &[Sample],
    ) -> Report {
        let mut by_kind: BTreeMap<Option<Kind>, Figures> = BTreeMap::new();
        for f in &faults {
            let fig = by_kind.entry(Some(f.kind)).or_default();
            fig.count += 1;
            fig.stuck.extend(f.stuck().iter().map(|s| s.to_string()));
            if let Some(r) = f.slowest() {
                fig.recovery.push(r.as_secs_f64());
                if let Some(switch) = switch_time(f, samples) {
                    fig.after_switch.push(r.as_secs_f64() - (switch - f.start).as_secs_f64());
                }
            }
        }
        let present: HashSet<&str> = listing.lines().map(str::trim).collect();
        let mut caching = Vec::new();
        for client in clients {
            let (mut lost, mut acked) = (0, 0);
            for (id, at) in client.log.acked() {
                let fig = by_kind.entry(window_by_end(&faults, at)).or_default();
                let missing = usize::from(!present.contains(id.as_str()));
                fig.acked += 1;
                fig.lost += missing;
                (lost, acked) = (lost + missing, acked + 1);
            }
            if !client.cache.is_zero() {
                caching.push((client.name.clone(), client.cache, lost, acked));
            }
        }
        answers(samples, &faults, &mut by_kind);
        let incr_acked = clients.iter().map(|c| c.log.incrs()).sum();
        let reconnects = clients.iter().map(|c| c.log.errors()).sum();
        let mut reasons = BTreeMap::new();
        for (reason, n) in clients.iter().flat_map(|c| c.log.reasons()) {
            *reasons.entry(reason).or_default() += n;
        }
        Report {
            seed: settings.seed,
            elapsed,
            faults,
            by_kind,
            incr_acked,
            counter,
            reconnects,
            reasons,
            caching,
        }
    }

    /// Where the run missed the soak's goals: a stuck client, a wrong answer beyond the
    /// grace, an acknowledged write lost on a planned failover.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (kind, fig) in &self.by_kind {
            let name = kind.map(Kind::name).unwrap_or("no fault");
            if !fig.stuck.is_empty() {
                out.push(format!("{name}: stuck clients {:?}", fig.stuck));
            }
            for (source, secs) in SOURCES.iter().zip(fig.wrong) {
                if secs > 0.0 {
                    out.push(format!("{name}: {source} wrong for {secs:.1}s beyond the grace"));
                }
            }
            let planned =
                matches!(kind, Some(Kind::Planned | Kind::SentinelDown | Kind::SentinelHung));
            if planned && fig.lost > 0 {
                out.push(format!("{name}: {} acknowledged writes lost", fig.lost));
            }
        }
        out
    }

    pub fn table(&self) -> String {
        let mut out = format!(
            "chaos soak: seed {} | {} faults in {:.0}s | INCRs acknowledged {}, final counter {} | \
             client reconnects {}\n",
            self.seed,
            self.faults.len(),
            self.elapsed.as_secs_f64(),
            self.incr_acked,
            self.counter,
            self.reconnects
        );
        let _ = writeln!(out, "client sessions ended by: {:?}", self.reasons);
        for (name, cache, lost, acked) in &self.caching {
            let cache = cache.as_secs();
            let _ = writeln!(
                out,
                "{name} (caches DNS {cache} s): lost {lost} of {acked} acknowledged writes"
            );
        }
        out.push_str(
            "kind              n  recovery med/max s  switch->ok med/max s  lost/acked    \
             wrong>grace s dns/http/agent  no answer s dns/http/agent  stuck\n",
        );
        for (kind, f) in &self.by_kind {
            let name = kind.map(Kind::name).unwrap_or("(between faults)");
            let _ = writeln!(
                out,
                "{name:<16} {:>2}  {:>18}  {:>20}  {:>11}   {:>26}  {:>26}  {}",
                f.count,
                med_max(&f.recovery),
                med_max(&f.after_switch),
                format!("{}/{}", f.lost, f.acked),
                triple(f.wrong),
                triple(f.silent),
                if f.stuck.is_empty() { "0".to_string() } else { f.stuck.join(",") }
            );
        }
        out
    }
}

const SOURCES: [&str; 3] = ["central DNS", "central HTTP", "agent HTTP"];

fn med_max(values: &[f64]) -> String {
    if values.is_empty() {
        return "-".to_string();
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    format!("{:.2} / {:.2}", v[v.len() / 2], v[v.len() - 1])
}

fn triple(v: [f64; 3]) -> String {
    format!("{:.1} / {:.1} / {:.1}", v[0], v[1], v[2])
}

/// A write acknowledged at `at` is at stake in the first fault that ended after it.
fn window_by_end(faults: &[Fault], at: Instant) -> Option<Kind> {
    faults.iter().find(|f| f.end >= at).map(|f| f.kind)
}

/// The fault running at `at` (from its start to the next one's).
fn window_by_start(faults: &[Fault], at: Instant) -> Option<Kind> {
    faults.iter().rev().find(|f| f.start <= at).map(|f| f.kind)
}

/// The first sample after the fault in which a Sentinel names another node than the old one.
fn switch_time(fault: &Fault, samples: &[Sample]) -> Option<Instant> {
    samples
        .iter()
        .filter(|s| s.at >= fault.start)
        .find(|s| s.sentinels.iter().flatten().any(|a| *a != fault.old))
        .map(|s| s.at)
}

/// Adds up, per fault window and source, the seconds polestar named a node no Sentinel named
/// within the grace before or `AHEAD` after, and the seconds it did not answer while a
/// Sentinel did.
fn answers(samples: &[Sample], faults: &[Fault], by_kind: &mut BTreeMap<Option<Kind>, Figures>) {
    let (mut from, mut to) = (0, 0);
    for (i, s) in samples.iter().enumerate().skip(1) {
        while samples[from].at + GRACE < s.at {
            from += 1;
        }
        while to + 1 < samples.len() && samples[to + 1].at <= s.at + AHEAD {
            to += 1;
        }
        let window = &samples[from..=to.max(i)];
        let recent: HashSet<SocketAddr> =
            window.iter().flat_map(|x| x.sentinels.iter().flatten().copied()).collect();
        if recent.is_empty() {
            continue;
        }
        let dt = (s.at - samples[i - 1].at).min(Duration::from_secs(1)).as_secs_f64();
        let named: [Option<IpAddr>; 3] = [s.dns, s.http.map(|a| a.ip()), s.agent.map(|a| a.ip())];
        let fig = by_kind.entry(window_by_start(faults, s.at)).or_default();
        for (k, answer) in named.iter().enumerate() {
            match answer {
                None => fig.silent[k] += dt,
                Some(ip) if !recent.iter().any(|a| a.ip() == *ip) => fig.wrong[k] += dt,
                Some(_) => {}
            }
        }
    }
}
