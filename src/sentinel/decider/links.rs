//! The configured Sentinels' links: one task each, started when the decider runs (its
//! constructor spawns nothing, so its tests need no sockets), restarted if one ends on its own;
//! a link's coming up, going down or proving to be no Sentinel, as the majority counts it.

use super::*;

impl Decider {
    /// A link for each configured address, down until it comes up; every one votes until it
    /// is shown to be no Sentinel.
    pub(super) fn add_links(&mut self, addresses: Vec<HostPort>) {
        for addr in addresses {
            metrics::gauge!(m::SENTINEL_UP, "sentinel" => addr.to_string()).set(0.0);
            let link = LinkState { addr, up: false, reconciled: false, myid: None, task: None };
            self.links.push(link);
        }
        self.quorum.voters = (0..self.links.len()).collect();
    }

    /// Starts every link's task.
    pub(super) fn start_links(&mut self) {
        for id in 0..self.links.len() {
            self.links[id].task = Some(self.spawn_link(id, &self.links[id].addr));
        }
    }

    /// Restarts, with a log line, a link whose task ended before shutdown (a panic).
    pub(super) fn restart_ended_links(&mut self) {
        for id in 0..self.links.len() {
            let ended = self.links[id].task.as_ref().is_some_and(JoinHandle::is_finished);
            if ended && !self.shutdown.is_cancelled() {
                tracing::error!(sentinel = %self.links[id].addr, "Sentinel link task ended unexpectedly: restarting it");
                self.observe(Observation::Down { from: id, reason: "link task ended".into() });
                self.links[id].task = Some(self.spawn_link(id, &self.links[id].addr));
            }
        }
    }

    /// Waits for every link's task to end (they stop with the decider's token).
    pub(super) async fn join_links(&mut self) {
        for link in self.links.drain(..) {
            let Some(task) = link.task else { continue };
            if let Err(e) = task.await {
                tracing::error!(sentinel = %link.addr, "the Sentinel link panicked: {e}");
            }
        }
    }

    fn spawn_link(&self, id: SentinelId, addr: &HostPort) -> JoinHandle<()> {
        let link = Link {
            id,
            endpoint: Endpoint::new(addr.host.clone(), addr.port, &self.sentinel_auth),
            masters: self.wanted_names.clone(),
            tx: self.tx.clone(),
            stop: self.links_stop.child_token(),
            heard: self.heard.clone(),
        };
        tokio::spawn(link.run())
    }

    pub(super) fn link_up(&mut self, id: SentinelId, myid: Option<String>) {
        // Every master's view counts the reachable Sentinels.
        self.dirty.all();
        let Some(link) = self.links.get_mut(id) else { return };
        link.up = true;
        link.reconciled = false;
        link.myid = myid;
        self.quorum.voters.insert(id);
        let name = link.addr.to_string();
        tracing::info!(sentinel = %name, "connected to Sentinel");
        metrics::gauge!(m::SENTINEL_UP, "sentinel" => name.clone()).set(1.0);
        self.events.push(Kind::SentinelUp, None, json!({ "sentinel": name }));
    }

    /// The configured address answered, and not as a Sentinel: it no longer counts towards
    /// the majority (until it answers as one).
    pub(super) fn not_a_sentinel(&mut self, id: SentinelId, reason: &str) {
        self.dirty.all();
        if self.quorum.voters.remove(&id) {
            let name = self.links.get(id).map(|l| l.addr.to_string()).unwrap_or_default();
            tracing::error!(sentinel = %name, %reason, "a configured Sentinel address is no Sentinel: it does not count towards the majority");
        }
        self.link_down(id, reason);
    }

    pub(super) fn link_down(&mut self, id: SentinelId, reason: &str) {
        self.dirty.all();
        let Some(link) = self.links.get_mut(id) else { return };
        let was_up = link.up;
        link.up = false;
        link.reconciled = false;
        let name = link.addr.to_string();
        let names: Vec<String> = self.masters.keys().cloned().collect();
        for master in names {
            self.forget_peers(&master, id);
            self.apply(&master, Evidence::Gone { from: id });
        }
        if was_up {
            tracing::warn!(sentinel = %name, %reason, "lost Sentinel");
            metrics::gauge!(m::SENTINEL_UP, "sentinel" => name.clone()).set(0.0);
            self.events.push(
                Kind::SentinelDown,
                None,
                json!({ "sentinel": name, "reason": reason }),
            );
        } else {
            tracing::debug!(sentinel = %name, %reason, "Sentinel unreachable");
        }
    }
}

/// One configured Sentinel.
pub(super) struct LinkState {
    pub(super) addr: HostPort,
    pub(super) up: bool,
    /// Reported a full reconciliation since it came up.
    pub(super) reconciled: bool,
    pub(super) myid: Option<String>,
    /// The link task, once the decider runs; restarted with a log line if it ever ends on its
    /// own (a panic).
    pub(super) task: Option<JoinHandle<()>>,
}
