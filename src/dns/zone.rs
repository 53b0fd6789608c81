//! The zone as DNS sees it: every record of one topology snapshot, built once per change and
//! never mutated, so a query reads it without a lock and never sees half of a change.
//!
//! Name layout (docs/using.md, "DNS"): `<label>.<zone>` A/AAAA (primary) and TXT (`epoch=`,
//! `state=`), `_redis._tcp.<label>.<zone>` SRV, `replicas.<label>.<zone>` A/AAAA (healthy
//! replicas), SOA and NS at the apex. A master without a known primary answers SERVFAIL for its A,
//! AAAA and SRV, never an empty answer that resolvers would cache.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use hickory_proto::rr::rdata::{A, AAAA, NS, SOA, SRV, TXT};
use hickory_proto::rr::{LowerName, Name, RData, Record, RecordType};

use crate::config;
use crate::topology::{Master, Snapshot};

use super::DnsError;

/// SOA timers handed to secondaries (seconds). They matter little: NOTIFY drives refreshes.
const SOA_REFRESH: i32 = 60;
const SOA_RETRY: i32 = 10;
const SOA_EXPIRE: i32 = 7 * 24 * 3600;

/// What the zone is built from besides the topology: fixed for the life of the server.
#[derive(Clone, Debug)]
pub struct ZoneSettings {
    origin: Name,
    ttl: u32,
    /// NS records at the apex; empty when none are configured (then no NS is served).
    nameservers: Vec<Name>,
    /// SOA MNAME: the first nameserver, or the apex itself when none is configured.
    mname: Name,
    rname: Name,
}

impl ZoneSettings {
    pub fn from_config(cfg: &config::Dns) -> Result<Self, DnsError> {
        let origin = parse_name(&cfg.zone)?;
        let nameservers =
            cfg.nameservers.iter().map(|n| parse_name(n)).collect::<Result<Vec<_>, _>>()?;
        let mname = nameservers.first().cloned().unwrap_or_else(|| origin.clone());
        let rname = child(&origin, "hostmaster").unwrap_or_else(|| origin.clone());
        let ttl = u32::try_from(cfg.ttl.as_secs()).unwrap_or(u32::MAX).max(1);
        Ok(Self { origin, ttl, nameservers, mname, rname })
    }

    pub fn origin(&self) -> &Name {
        &self.origin
    }
}

fn parse_name(text: &str) -> Result<Name, DnsError> {
    let mut name = Name::from_ascii(text)
        .map_err(|e| DnsError::Name { name: text.to_string(), reason: e.to_string() })?;
    name.set_fqdn(true);
    Ok(name)
}

/// `label.parent`, or `None` when the label is not a valid DNS label or the name gets too long.
fn child(parent: &Name, label: &str) -> Option<Name> {
    Name::from_ascii(label).ok()?.append_domain(parent).ok()
}

/// The records at one owner name.
#[derive(Clone, Debug, Default, PartialEq)]
struct NameEntry {
    /// One RRset per type, A/AAAA first (the RRset an ANY query gets, RFC 8482).
    rrsets: Vec<(RecordType, Vec<Record>)>,
    /// Types that exist but whose data is unknown right now: answered SERVFAIL.
    unknown: Vec<RecordType>,
}

impl NameEntry {
    /// Adds an RRset, its vector no longer than its records: a record is some 200 bytes, and
    /// the spare capacity a vector grows with was a third of a 1,000-master zone.
    fn push(&mut self, rtype: RecordType, mut records: Vec<Record>) {
        if !records.is_empty() {
            records.shrink_to_fit();
            self.rrsets.reserve_exact(1);
            self.rrsets.push((rtype, records));
        }
    }
}

/// The outcome of a lookup, borrowing the records from the zone.
#[derive(Debug, PartialEq)]
pub enum Answer<'z> {
    /// NOERROR with these records in the answer section.
    Records(&'z [Record]),
    /// NOERROR without answers: the name exists, the type does not (SOA in authority).
    NoData,
    /// The name does not exist in the zone (SOA in authority).
    NxDomain,
    /// The name exists but its data is unknown (a master without a known primary).
    ServFail,
    /// The name is outside the zone.
    Refused,
}

/// One immutable version of the zone.
#[derive(Clone, Debug, PartialEq)]
pub struct Zone {
    origin: LowerName,
    serial: u32,
    soa: Vec<Record>,
    names: HashMap<LowerName, NameEntry>,
}

impl Zone {
    /// Builds the zone of `snapshot` with the given SOA serial.
    pub fn build(snapshot: &Snapshot, settings: &ZoneSettings, serial: u32) -> Self {
        let mut names = HashMap::with_capacity(1 + 4 * snapshot.masters.len());
        let soa = vec![soa_record(settings, serial)];
        let mut apex = NameEntry::default();
        apex.push(RecordType::SOA, soa.clone());
        apex.push(RecordType::NS, ns_records(settings));
        names.insert(LowerName::new(&settings.origin), apex);
        let mut used: HashSet<&str> = HashSet::with_capacity(snapshot.masters.len());
        for master in snapshot.masters.values() {
            if !used.insert(master.label.as_str()) {
                tracing::warn!(master = %master.name, label = %master.label, "DNS label already served for another master; skipped");
                continue;
            }
            add_master(&mut names, settings, master);
        }
        Self { origin: LowerName::new(&settings.origin), serial, soa, names }
    }

    /// The same records under another SOA serial.
    pub fn with_serial(mut self, serial: u32) -> Self {
        for record in &mut self.soa {
            if let RData::SOA(soa) = &mut record.data {
                soa.serial = serial;
            }
        }
        if let Some(apex) = self.names.get_mut(&self.origin) {
            apex.rrsets.retain(|(t, _)| *t != RecordType::SOA);
            apex.rrsets.insert(0, (RecordType::SOA, self.soa.clone()));
        }
        self.serial = serial;
        self
    }

    pub fn serial(&self) -> u32 {
        self.serial
    }

    pub fn origin(&self) -> &LowerName {
        &self.origin
    }

    /// The apex SOA, as a one-record slice (for answers and authority sections).
    pub fn soa(&self) -> &[Record] {
        &self.soa
    }

    /// Every record but the SOA, in canonical order, for zone transfers. Put together for
    /// each transfer (rare) rather than kept beside the names (a second copy of every record).
    pub fn transfer_records(&self) -> Vec<&Record> {
        let mut names: Vec<(&LowerName, &NameEntry)> = self.names.iter().collect();
        names.sort_by(|a, b| a.0.cmp(b.0));
        let rrsets = names.into_iter().flat_map(|(_, e)| e.rrsets.iter());
        let rrsets = rrsets.filter(|(t, _)| *t != RecordType::SOA);
        rrsets.flat_map(|(_, records)| records.iter()).collect()
    }

    pub fn contains(&self, name: &LowerName) -> bool {
        self.origin.zone_of(name)
    }

    pub fn lookup(&self, name: &LowerName, rtype: RecordType) -> Answer<'_> {
        if !self.contains(name) {
            return Answer::Refused;
        }
        let Some(entry) = self.names.get(name) else {
            return Answer::NxDomain;
        };
        if rtype == RecordType::ANY {
            return entry.rrsets.first().map_or(Answer::NoData, |(_, r)| Answer::Records(r));
        }
        if entry.unknown.contains(&rtype) {
            return Answer::ServFail;
        }
        match entry.rrsets.iter().find(|(t, _)| *t == rtype) {
            Some((_, records)) => Answer::Records(records),
            None => Answer::NoData,
        }
    }
}

fn soa_record(settings: &ZoneSettings, serial: u32) -> Record {
    let soa = SOA::new(
        settings.mname.clone(),
        settings.rname.clone(),
        serial,
        SOA_REFRESH,
        SOA_RETRY,
        SOA_EXPIRE,
        settings.ttl,
    );
    Record::from_rdata(settings.origin.clone(), settings.ttl, RData::SOA(soa))
}

fn ns_records(settings: &ZoneSettings) -> Vec<Record> {
    let ns = |n: &Name| RData::NS(NS(n.clone()));
    settings
        .nameservers
        .iter()
        .map(|n| Record::from_rdata(settings.origin.clone(), settings.ttl, ns(n)))
        .collect()
}

/// Adds the names of one master; a label that does not make a valid name is skipped.
fn add_master(names: &mut HashMap<LowerName, NameEntry>, settings: &ZoneSettings, master: &Master) {
    let Some(owner) = child(&settings.origin, &master.label) else {
        tracing::warn!(master = %master.name, label = %master.label, "not a valid DNS label; master not served by DNS");
        return;
    };
    let (Some(tcp), Some(replicas)) = (child(&owner, "_tcp"), child(&owner, "replicas")) else {
        tracing::warn!(master = %master.name, "DNS names too long; master not served by DNS");
        return;
    };
    let Some(srv) = child(&tcp, "_redis") else {
        tracing::warn!(master = %master.name, "DNS names too long; master not served by DNS");
        return;
    };
    let ttl = settings.ttl;
    names.insert(LowerName::new(&owner), primary_entry(&owner, ttl, master));
    names.insert(LowerName::new(&tcp), NameEntry::default());
    names.insert(LowerName::new(&srv), srv_entry(&srv, &owner, ttl, master));
    names.insert(LowerName::new(&replicas), replicas_entry(&replicas, ttl, master));
}

/// Whether two snapshots give the same zone: the same masters with the same label, primary,
/// epoch, state and healthy replicas (what [`add_master`] reads).
pub fn same_records(a: &Snapshot, b: &Snapshot) -> bool {
    fn healthy(m: &Master) -> impl Iterator<Item = IpAddr> + '_ {
        m.replicas.iter().filter(|r| r.healthy).map(|r| r.ip)
    }
    let same = |x: &Master, y: &Master| {
        x.label == y.label
            && x.primary == y.primary
            && x.epoch == y.epoch
            && x.state == y.state
            && healthy(x).eq(healthy(y))
    };
    a.masters.len() == b.masters.len()
        && a.masters
            .iter()
            .zip(&b.masters)
            .all(|((na, x), (nb, y))| na == nb && (std::sync::Arc::ptr_eq(x, y) || same(x, y)))
}

fn primary_entry(owner: &Name, ttl: u32, master: &Master) -> NameEntry {
    let mut entry = NameEntry::default();
    match &master.primary {
        Some(node) => push_addresses(&mut entry, owner, ttl, [node.ip]),
        None => entry.unknown = vec![RecordType::A, RecordType::AAAA],
    }
    entry.push(RecordType::TXT, txt_records(owner, ttl, master));
    entry
}

fn txt_records(owner: &Name, ttl: u32, master: &Master) -> Vec<Record> {
    let epoch = format!("epoch={}", master.epoch.unwrap_or(0));
    let state = format!("state={}", master.state);
    [epoch, state]
        .into_iter()
        .map(|s| Record::from_rdata(owner.clone(), ttl, RData::TXT(TXT::new(vec![s]))))
        .collect()
}

fn srv_entry(srv: &Name, target: &Name, ttl: u32, master: &Master) -> NameEntry {
    let mut entry = NameEntry::default();
    match &master.primary {
        Some(node) => {
            let data = RData::SRV(SRV::new(0, 0, node.port, target.clone()));
            entry.push(RecordType::SRV, vec![Record::from_rdata(srv.clone(), ttl, data)]);
        }
        None => entry.unknown = vec![RecordType::SRV],
    }
    entry
}

fn replicas_entry(owner: &Name, ttl: u32, master: &Master) -> NameEntry {
    let mut ips: Vec<IpAddr> = master.replicas.iter().filter(|r| r.healthy).map(|r| r.ip).collect();
    ips.sort();
    ips.dedup();
    let mut entry = NameEntry::default();
    push_addresses(&mut entry, owner, ttl, ips);
    entry
}

/// Pushes the A and AAAA RRsets (A first) for these addresses.
fn push_addresses(
    entry: &mut NameEntry,
    owner: &Name,
    ttl: u32,
    ips: impl IntoIterator<Item = IpAddr>,
) {
    let (mut a, mut aaaa) = (Vec::new(), Vec::new());
    for ip in ips {
        match ip {
            IpAddr::V4(v4) => a.push(Record::from_rdata(owner.clone(), ttl, RData::A(A(v4)))),
            IpAddr::V6(v6) => {
                aaaa.push(Record::from_rdata(owner.clone(), ttl, RData::AAAA(AAAA(v6))))
            }
        }
    }
    entry.push(RecordType::A, a);
    entry.push(RecordType::AAAA, aaaa);
}

/// The serial of the next version: the current Unix time in seconds, or one more than the
/// previous serial when several changes fall in the same second (RFC 1982 arithmetic).
///
/// Deriving it from the clock keeps it growing across restarts; it runs ahead of the clock
/// only while more than one change per second is published, and falls back to the clock after.
pub fn next_serial(previous: u32, now_unix: u64) -> u32 {
    let candidate = now_unix as u32; // truncation is RFC 1982 wrap-around, by design
    if serial_gt(candidate, previous) { candidate } else { previous.wrapping_add(1) }
}

/// The serial for the first version served by this process.
pub fn initial_serial() -> u32 {
    now_unix() as u32 // wraps in 2106, which RFC 1982 comparison tolerates
}

pub fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `a > b` in RFC 1982 serial number arithmetic.
pub fn serial_gt(a: u32, b: u32) -> bool {
    a != b && (a.wrapping_sub(b) as i32) > 0
}

#[cfg(test)]
mod tests;
