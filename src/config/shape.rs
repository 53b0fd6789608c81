//! What a configuration will do, in an operator's words: the one line `polestar check` prints
//! ("follows 3 Sentinels; serves DNS for redis.internal. on 10.0.0.1:53; drains old
//! primaries"), and the problems of a configuration that would run and do nothing useful.
//!
//! A polestar acts through its sections: it serves DNS, HTTP or the Sentinel protocol, sweeps
//! sockets, or (following Sentinels) drains old primaries. One that does none of these would
//! start, say `ready`, and serve no one: that is refused, naming every section that cannot act.

use super::walk::Problems;
use super::{Config, Source, Sweep, join};

/// Whether `sweep` destroys anything at all.
fn sweeps(sweep: &Sweep) -> bool {
    !sweep.local_ports.is_empty() || sweep.remote
}

impl Config {
    /// What this configuration will do, one clause per duty, in the order of the file.
    pub fn duties(&self) -> Vec<String> {
        let mut duties = Vec::new();
        if let Some(dns) = &self.dns {
            duties.push(format!("serves DNS for {} on {}", dns.zone, join(&dns.listen)));
        }
        if let Some(http) = &self.http {
            let scheme = if http.tls.is_some() { "HTTPS" } else { "HTTP" };
            duties.push(format!("serves {scheme} on {}", http.listen));
        }
        if let Some(api) = &self.sentinel_api {
            duties.push(format!("serves the Sentinel protocol on {}", join(&api.listen)));
        }
        if self.drains() {
            duties.push("drains old primaries (CLIENT KILL)".to_string());
        }
        if let Some(sweep) = &self.sweep {
            match sweep.local_ports.as_slice() {
                [] => {}
                [port] => duties.push(format!("sweeps local port {port}")),
                ports => duties.push(format!("sweeps local ports {}", join(ports))),
            }
            if sweep.remote {
                duties.push("aborts this host's sockets to old primaries".to_string());
            }
        }
        duties
    }

    /// Whether a failover makes this polestar fence and drain the old primary: only when it
    /// follows the Sentinels (an agent leaves that to the polestars it follows).
    pub fn drains(&self) -> bool {
        self.drain.enabled && matches!(self.source, Source::Sentinels(_))
    }

    /// Where the truth comes from, and which masters, in words.
    fn follows(&self) -> String {
        let masters = match &self.masters {
            Some(m) => m.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "),
            None => "every master they monitor".to_string(),
        };
        match &self.source {
            Source::Sentinels(s) => {
                format!("follows {} Sentinel(s) ({masters})", s.addresses.len())
            }
            Source::Upstream(u) => {
                let majority = u.urls.len() / 2 + 1;
                format!("follows {} upstream(s), {majority} to agree ({masters})", u.urls.len())
            }
        }
    }

    /// The one-line summary `polestar check` prints.
    pub fn summary(&self) -> String {
        let mut clauses = vec![self.follows()];
        clauses.extend(self.duties());
        format!("ok: {}", clauses.join("; "))
    }
}

/// The problems (and warnings) of a configuration that would run without doing its job: a
/// `sweep` that sweeps nothing, a polestar that publishes the primary nowhere, and one that
/// does nothing at all (an error, with every section that cannot act).
pub fn check(config: &Config, p: &mut Problems) {
    let idle_sweep = config.sweep.as_ref().is_some_and(|s| !sweeps(s));
    let sweep_advice = "sweeps nothing: give local_ports (beside a redis-server) or remote: true \
                        (on an application host)";
    if !config.duties().is_empty() {
        if idle_sweep {
            p.warn("sweep", sweep_advice);
        }
        let publishes =
            config.dns.is_some() || config.http.is_some() || config.sentinel_api.is_some();
        let sweeps_any = config.sweep.as_ref().is_some_and(sweeps);
        if !publishes && !sweeps_any {
            p.warn(
                "(top level)",
                "publishes the primary nowhere (no dns, http or sentinel_api): it only drains \
                 old primaries",
            );
        }
        return;
    }
    if idle_sweep {
        p.push("sweep", sweep_advice);
    }
    if matches!(config.source, Source::Sentinels(_)) && !config.drain.enabled {
        p.push("drain.enabled", "false, and nothing else to do: this polestar would only watch");
    }
    let why = match config.source {
        Source::Sentinels(_) => "follows the Sentinels and does nothing with what it learns",
        Source::Upstream(_) => "follows its upstreams and does nothing with what it learns",
    };
    p.push(
        "(top level)",
        format!(
            "{why}: add dns, http or sentinel_api to serve the primary, or sweep (local_ports or \
             remote) to destroy sockets (examples: /usr/share/doc/polestar/examples/)"
        ),
    );
}

impl Config {
    /// What this host lacks for the configuration, each as `path: message`: with `sweep`, the
    /// permission to destroy sockets (`CAP_NET_ADMIN`, `CONFIG_INET_DIAG_DESTROY`), tried as
    /// `run` tries it at start. `polestar check` runs it: a sweeper that cannot sweep would
    /// refuse to start, or, reloaded in, be left off.
    pub fn host_problems(&self) -> Vec<String> {
        let Some(sweep) = self.sweep.as_ref().filter(|s| sweeps(s)) else { return Vec::new() };
        let Err(e) = crate::sweep::diag::probe() else { return Vec::new() };
        let mut keys = Vec::new();
        if !sweep.local_ports.is_empty() {
            keys.push("sweep.local_ports");
        }
        if sweep.remote {
            keys.push("sweep.remote");
        }
        keys.into_iter()
            .map(|key| format!("{key}: this host cannot destroy sockets, so nothing is swept: {e}"))
            .collect()
    }
}
