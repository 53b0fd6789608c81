//! What the decider publishes: each master's view built from its rule's state, one snapshot
//! per loop turn with only the masters marked since the last, and the per-master gauges.

use super::*;

impl Decider {
    /// Builds the views of the masters marked since the last snapshot (every master after a
    /// change of the Sentinels' standing) and publishes them if any differs. At 1,000 idle
    /// masters, building every view on every tick of the loop was a tenth of polestar's idle
    /// CPU.
    pub(super) fn publish_snapshot(&mut self) {
        let reachable = self.links.iter().any(|l| l.up);
        if reachable != self.reachable {
            self.reachable = reachable;
            self.dirty.all();
            let kind = if reachable { Kind::Ok } else { Kind::Stale };
            if !reachable {
                tracing::warn!("no Sentinel reachable: serving the last confirmed primaries");
            }
            self.events.push(kind, None, json!({ "sentinels_reachable": reachable }));
        }
        let before = self.topology.current();
        let published = match std::mem::take(&mut self.dirty) {
            Dirty::Clean => None,
            Dirty::Masters(names) => {
                let view = |n: &String| self.masters.get(n).map(|e| self.view(n, e));
                let views: Vec<(Option<Master>, String)> =
                    names.into_iter().map(|n| (view(&n), n)).collect();
                self.topology.update(views, reachable)
            }
            Dirty::All => {
                let views = self.masters.iter().map(|(n, e)| self.view(n, e));
                self.topology.publish(views.collect::<Vec<_>>(), reachable)
            }
        };
        #[cfg(debug_assertions)]
        self.assert_views_published();
        if let Some(snapshot) = published {
            // A master that did not change kept its `Arc`, and so its gauges.
            let changed = |m: &&Arc<Master>| {
                before.masters.get(&m.name).is_none_or(|old| !Arc::ptr_eq(old, m))
            };
            for master in snapshot.masters.values().filter(changed) {
                record_gauges(master);
            }
        }
    }

    /// The published snapshot holds exactly the views a full rebuild gives: a master whose
    /// view changed without being marked would leave a stale answer in DNS. Debug builds (the
    /// tests) check it at every snapshot.
    #[cfg(debug_assertions)]
    pub(super) fn assert_views_published(&self) {
        let current = self.topology.current();
        let published: Vec<&Master> = current.masters.values().map(|m| m.as_ref()).collect();
        let views: Vec<Master> = self.masters.iter().map(|(n, e)| self.view(n, e)).collect();
        assert_eq!(published, views.iter().collect::<Vec<_>>(), "a view changed unmarked");
        assert_eq!(current.source_reachable, self.reachable, "reachability unpublished");
    }

    pub(super) fn view(&self, name: &str, e: &Entry) -> Master {
        let publication = &e.state.publication;
        let primary = publication.primary();
        let state = match () {
            _ if primary.is_none() => MasterState::Unknown,
            _ if !self.links.iter().any(|l| l.up) => MasterState::Stale,
            _ if e.state.suspect.is_some() => MasterState::Suspect,
            _ if e.state.failing_over_published(&self.quorum) => MasterState::Failover,
            _ => MasterState::Ok,
        };
        let sentinels = SentinelCounts {
            configured: self.links.len(),
            reachable: self.links.iter().filter(|l| l.up).count(),
            agreeing: primary.map(|p| e.state.agreeing(p)).unwrap_or(0),
            discovered: e.discovered.shown().cloned().collect(),
        };
        Master {
            name: name.to_string(),
            label: e.label.clone(),
            primary: primary.map(|p| p.node.clone()),
            epoch: primary.map(|p| p.epoch),
            since: publication.since(),
            state,
            replicas: e.state.replicas.clone(),
            sentinels,
            withdrawn: withdrawn(e.withdrawn.as_ref(), primary),
            provisional: matches!(publication, Publication::Provisional { .. }),
        }
    }
}

/// Which masters' published views may have changed since the last snapshot.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) enum Dirty {
    #[default]
    Clean,
    Masters(BTreeSet<String>),
    /// Every master (a Sentinel came or went, an epoch was reached, the first snapshot).
    All,
}

impl Dirty {
    pub(super) fn master(&mut self, name: &str) {
        match self {
            Self::All => {}
            Self::Masters(names) => {
                if !names.contains(name) {
                    names.insert(name.to_string());
                }
            }
            Self::Clean => *self = Self::Masters(BTreeSet::from([name.to_string()])),
        }
    }

    pub(super) fn all(&mut self) {
        *self = Self::All;
    }
}

pub(super) fn record_gauges(master: &Master) {
    let name = master.name.clone();
    metrics::gauge!(m::MASTER_EPOCH, "master" => name.clone())
        .set(master.epoch.unwrap_or(0) as f64);
    for state in MasterState::ALL {
        let value = if state == master.state { 1.0 } else { 0.0 };
        metrics::gauge!(m::MASTER_STATE, "master" => name.clone(), "state" => state.as_str())
            .set(value);
    }
}

/// A withdrawn flip is shown while it is above the published epoch (and so explains it).
pub(super) fn withdrawn(
    undone: Option<&Candidate>,
    published: Option<&Candidate>,
) -> Option<Withdrawn> {
    let undone = undone.filter(|u| published.is_none_or(|p| u.epoch > p.epoch))?;
    Some(Withdrawn { node: undone.node.clone(), epoch: undone.epoch })
}
