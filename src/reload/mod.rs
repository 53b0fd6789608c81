//! Reloading the configuration on SIGHUP without dropping DNS or HTTP service.
//!
//! The running configuration lives in one `watch` channel of `Arc<Config>`: the [`Reloader`]
//! holds its only sender and every component that can change its settings while running holds
//! a [`ConfigReader`] (or a narrower [`project`]ion of it, like the HTTP admin token) and reads
//! the current value when it needs it. A reload parses and checks the whole file first; a bad
//! file is rejected with every problem logged and the old configuration keeps running. What
//! cannot change in place (the listeners: their sockets are bound once, before anything is
//! served) is kept as it was and logged as needing a restart.
//!
//! The Sentinel watcher is restarted rather than reconfigured, through [`watcher::follow_reloads`]:
//! a new one starts beside the old, takes over once it has a full picture, and only then is the
//! old one stopped, so the published topology never goes blank in between.

pub mod watcher;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigError};

/// The running configuration; `borrow()` for the current one, `changed()` to follow reloads.
pub type ConfigReader = watch::Receiver<Arc<Config>>;

/// Re-reads the configuration file and publishes it; holds the channel's only sender.
pub struct Reloader {
    tx: watch::Sender<Arc<Config>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("the configuration was not read from a file: nothing to reload")]
    NoFile,
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl ReloadError {
    /// Each problem on its own line.
    pub fn problems(&self) -> Vec<String> {
        match self {
            Self::Config(e) => e.problems(),
            other => vec![other.to_string()],
        }
    }
}

impl Reloader {
    /// The channel starts with `config`; reloads re-read `config.file`.
    pub fn new(config: Config) -> (Self, ConfigReader) {
        let (tx, rx) = watch::channel(Arc::new(config));
        (Self { tx }, rx)
    }

    pub fn subscribe(&self) -> ConfigReader {
        self.tx.subscribe()
    }

    /// Loads the file again and publishes it (listeners kept as they are); on error nothing
    /// changes. Returns what changed.
    pub fn reload(&self) -> Result<Changes, ReloadError> {
        let old = self.tx.borrow().clone();
        let new = Config::load(old.file.as_deref().ok_or(ReloadError::NoFile)?)?;
        let changes = Changes::between(&old, &new);
        if !changes.is_empty() {
            self.tx.send_replace(Arc::new(keep_listeners(&old, new)));
        }
        Ok(changes)
    }

    /// Reloads and logs the outcome in the words an operator reads after `systemctl reload`.
    pub fn reload_and_log(&self) {
        let config = self.tx.borrow().clone();
        let file = config.file.as_deref().unwrap_or(Path::new("configuration")).display();
        match self.reload() {
            Ok(changes) if changes.is_empty() => tracing::info!("reloaded {file}: no changes"),
            Ok(changes) => {
                for turned in &changes.turned {
                    tracing::warn!("reloaded {file}: {turned}");
                }
                for setting in &changes.restart {
                    tracing::warn!("reloaded {file}: {setting} changed; restart polestar to apply");
                }
                tracing::info!("reloaded {file}: {changes}");
            }
            Err(e) => {
                for problem in e.problems() {
                    tracing::error!("reload rejected: {problem}");
                }
                tracing::error!("reload rejected: keeping the running configuration");
            }
        }
    }
}

/// The sections that differ between two configurations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Applied while running (for each, the component that follows the channel).
    pub applied: Vec<&'static str>,
    /// Not applied: they take a restart.
    pub restart: Vec<&'static str>,
    /// Sections turned on or off, each with what happens to its shape now: in an operator's
    /// words, for the log.
    pub turned: Vec<String>,
}

impl Changes {
    pub fn between(old: &Config, new: &Config) -> Self {
        Self { applied: applied(old, new), restart: restart(old, new), turned: turned(old, new) }
    }

    pub fn is_empty(&self) -> bool {
        self.applied.is_empty() && self.restart.is_empty()
    }

    /// Whether the Sentinel watcher must be restarted for the new configuration.
    pub fn watcher(old: &Config, new: &Config) -> bool {
        old.source != new.source || old.masters != new.masters || old.nodes != new.nodes
    }
}

/// The sections that differ and are applied while running.
fn applied(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut applied = Vec::new();
    let mut differs = |yes: bool, what| yes.then(|| applied.push(what));
    differs(old.source != new.source, "sentinels");
    differs(old.masters != new.masters, "masters");
    differs(old.nodes != new.nodes, "nodes");
    differs(old.drain != new.drain, "drain");
    differs(old.sweep != new.sweep, "sweep");
    differs(
        token(old, |h| &h.admin_token) != token(new, |h| &h.admin_token),
        "http.admin_token_file",
    );
    differs(
        token(old, |h| &h.agent_token) != token(new, |h| &h.agent_token),
        "http.agent_token_file",
    );
    // The HTTP server builds its acceptor again for the next connection; a certificate
    // renewed in place counts as a change (`ServerTls::stamp`).
    let http_tls = |c: &Config| c.http.as_ref().and_then(|h| h.tls.clone());
    differs(http_tls(old) != http_tls(new), "http.tls");
    let api = |c: &Config| c.sentinel_api.clone();
    differs(api(old).map(|a| a.peers) != api(new).map(|a| a.peers), "sentinel_api.peers");
    differs(
        api(old).and_then(|a| a.password) != api(new).and_then(|a| a.password),
        "sentinel_api.password_file",
    );
    applied
}

/// The sections a reload turns on or off, and what that does while running. The listeners'
/// sections (`dns`, `http`, `sentinel_api`) are bound once, at start: one turned on is not
/// served until a restart, one turned off keeps serving until then (what served is never left
/// silent by a reload). `sweep` and `drain` start and stop at once; so does the source when it
/// changes from Sentinels to upstreams or back (its watcher is replaced, see [`watcher`]).
fn turned(old: &Config, new: &Config) -> Vec<String> {
    let mut turned = Vec::new();
    let listeners = [
        ("dns", "DNS", old.dns.is_some(), new.dns.is_some()),
        ("http", "HTTP", old.http.is_some(), new.http.is_some()),
        (
            "sentinel_api",
            "the Sentinel protocol",
            old.sentinel_api.is_some(),
            new.sentinel_api.is_some(),
        ),
    ];
    for (section, what, was, is) in listeners {
        match (was, is) {
            (false, true) => turned.push(format!(
                "`{section}` turned on: {what} is not served until polestar restarts (listeners are bound at start)"
            )),
            (true, false) => turned.push(format!(
                "`{section}` turned off: {what} is still served until polestar restarts"
            )),
            _ => {}
        }
    }
    let sweeps =
        |c: &Config| c.sweep.as_ref().is_some_and(|s| !s.local_ports.is_empty() || s.remote);
    match (sweeps(old), sweeps(new)) {
        (false, true) => turned.push("`sweep` turned on: sockets are swept from the next primary change (if this process may destroy them)".into()),
        (true, false) => turned.push("`sweep` turned off: sweeps under way finish, no new ones start".into()),
        _ => {}
    }
    match (old.drains(), new.drains()) {
        (false, true) => turned
            .push("`drain` turned on: the next failover fences and drains the old primary".into()),
        (true, false) => turned.push(
            "`drain` turned off: a drain under way finishes, the next failover drains nothing"
                .into(),
        ),
        _ => {}
    }
    use crate::config::Source;
    match (&old.source, &new.source) {
        (Source::Sentinels(_), Source::Upstream(_)) => turned.push("`upstream` in place of `sentinels`: the agent takes over once it has a full picture, then the Sentinel watcher stops".into()),
        (Source::Upstream(_), Source::Sentinels(_)) => turned.push("`sentinels` in place of `upstream`: the Sentinel watcher takes over once it has a full picture, then the agent stops".into()),
        _ => {}
    }
    turned
}

/// The sections that differ and take a restart.
fn restart(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut restart = Vec::new();
    let http_listen = |c: &Config| c.http.as_ref().map(|h| h.listen);
    if http_listen(old) != http_listen(new) {
        restart.push("http.listen");
    }
    let api =
        |c: &Config| c.sentinel_api.clone().map(|a| (a.listen, a.max_connections, a.idle_timeout));
    if api(old) != api(new) {
        restart.push("sentinel_api.listen");
    }
    // The DNS server binds and builds its zone at start; a DNS component that follows the
    // channel can move its settings (all but `listen`) to `applied`.
    if old.dns != new.dns {
        restart.push("dns");
    }
    restart
}

impl fmt::Display for Changes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let applied =
            if self.applied.is_empty() { "nothing".into() } else { self.applied.join(", ") };
        write!(f, "applied {applied}")?;
        if !self.restart.is_empty() {
            write!(f, "; needs a restart: {}", self.restart.join(", "))?;
        }
        Ok(())
    }
}

/// `new`, with the listener settings of `old`: those are bound once, so the published
/// configuration keeps saying what is actually being served.
fn keep_listeners(old: &Config, mut new: Config) -> Config {
    new.dns = old.dns.clone();
    match (&old.sentinel_api, &mut new.sentinel_api) {
        (Some(old), Some(new)) => {
            new.listen = old.listen.clone();
            new.max_connections = old.max_connections;
            new.idle_timeout = old.idle_timeout;
        }
        (old, new) => *new = old.clone(),
    }
    match (&old.http, &mut new.http) {
        (Some(old), Some(new)) => new.listen = old.listen,
        (old, new) => *new = old.clone(),
    }
    new
}

fn token<'a>(
    config: &'a Config,
    field: impl Fn(&'a crate::config::Http) -> &'a Option<crate::config::Secret>,
) -> Option<&'a crate::config::Secret> {
    field(config.http.as_ref()?).as_ref()
}

/// A `watch` channel of one part of the configuration, kept up to date by a small task that
/// ends with the configuration channel. Readers see a new value only when that part changed.
pub fn project<T, F>(config: &ConfigReader, part: F) -> watch::Receiver<T>
where
    T: PartialEq + Send + Sync + 'static,
    F: Fn(&Config) -> T + Send + 'static,
{
    let mut config = config.clone();
    let (tx, rx) = watch::channel(part(&config.borrow_and_update()));
    // Ends when the reloader (the configuration's sender) is dropped, at shutdown.
    crate::supervise::detached("a reload forwarder", async move {
        while config.changed().await.is_ok() {
            let value = part(&config.borrow_and_update());
            tx.send_if_modified(|current| {
                let modified = *current != value;
                if modified {
                    *current = value;
                }
                modified
            });
        }
    });
    rx
}

/// Reloads on every SIGHUP until `shutdown`, telling systemd (`RELOADING=1`, then `READY=1`).
pub async fn on_sighup(reloader: Reloader, shutdown: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup())
        .map_err(|e| anyhow::anyhow!("cannot install the SIGHUP handler: {e}"))?;
    loop {
        tokio::select! {
            _ = hup.recv() => {
                crate::service::reloading();
                reloader.reload_and_log();
                crate::service::ready();
            }
            _ = shutdown.cancelled() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
