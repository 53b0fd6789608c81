//! The other Sentinels each configured one lists for a master: shown (bounded), never trusted,
//! never contacted (docs/decisions.md D2, D25).

use super::*;

impl Decider {
    /// Records the peers `from` lists for `master`; logs the ones no configured Sentinel
    /// listed before.
    pub(super) fn set_peers(&mut self, master: &str, from: SentinelId, peers: Vec<PeerRecord>) {
        let Some(entry) = self.entry_mut(master) else { return };
        if entry.peers.get(&from) == Some(&peers) {
            return;
        }
        entry.peers.insert(from, peers);
        let after = self.discovered(master);
        let Some(entry) = self.masters.get_mut(master) else { return };
        self.dirty.master(master);
        let found = entry.discovered.update(after);
        if let Some(new) = entry.discovered.log_due(&found, std::time::Instant::now()) {
            let (by, total) = (&self.links[from].addr, entry.discovered.total());
            let first = found.first.unwrap_or_default();
            tracing::warn!(%master, sentinel = %first, new, total, listed_by = %by, "discovered Sentinels that are not configured: shown (at most 16) but never trusted; add them to sentinels.addresses if they are yours");
        }
        record_discovered(master, entry.discovered.total());
    }

    pub(super) fn forget_peers(&mut self, master: &str, from: SentinelId) {
        let Some(entry) = self.entry_mut(master) else { return };
        if entry.peers.remove(&from).is_some() {
            let now = self.discovered(master);
            record_discovered(master, now.len());
            if let Some(entry) = self.entry_mut(master) {
                entry.discovered.update(now);
            }
        }
    }

    /// The Sentinels the configured ones list for `master` that are not configured themselves
    /// (by address, or by the run id a configured address answered with).
    pub(super) fn discovered(&self, master: &str) -> BTreeSet<String> {
        let Some(entry) = self.masters.get(master) else { return BTreeSet::new() };
        let configured = |p: &PeerRecord| {
            self.links.iter().any(|l| {
                l.myid.as_deref() == Some(p.runid.as_str())
                    || (l.addr.host == p.addr.host && l.addr.port == p.addr.port)
            })
        };
        let peers = entry.peers.values().flatten().filter(|p| !configured(p));
        peers
            .map(|p| HostPort { host: p.addr.host.clone(), port: p.addr.port }.to_string())
            .collect()
    }
}

pub(super) fn record_discovered(master: &str, n: usize) {
    metrics::gauge!(m::SENTINELS_DISCOVERED, "master" => master.to_string()).set(n as f64);
}
