//! A real local Redis (or Valkey: [`Flavor`]) cluster for the demo and the integration tests:
//! N `redis-server` (one primary, N-1 replicas) and M `redis-sentinel` on free 127.0.0.1 ports, each with its own
//! directory, config and log in a temp dir, with Sentinel timings fast enough for tests.
//!
//! It exists so that every claim about failover is checked against the real thing, not a fake:
//! the fault helpers kill, hang (SIGSTOP) and restart processes the way production fails.
//! Everything it started is killed and reaped on drop, also during a panic; the processes of
//! labs whose owner died without dropping are cleaned by the next `Lab::start` (see
//! [`leftovers`]).

mod accessors;
mod conf;
mod faults;
pub mod leftovers;
mod process;
mod query;
pub mod tls;
mod waits;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::time::{Instant, sleep};

pub use process::{Flavor, VALKEY_ENV, free_service_port};
use process::{Kind, Proc};
pub use query::query;

/// How often the waits poll.
const POLL: Duration = Duration::from_millis(100);
/// How long one process may take to answer `PING` after it was spawned.
const PROCESS_UP: Duration = Duration::from_secs(20);
/// Attempts at finding a free port for a process.
const PORT_ATTEMPTS: usize = 5;
/// Log lines per process shown when a wait fails.
const TAIL_LINES: usize = 25;

#[derive(Clone, Debug)]
pub struct LabOptions {
    /// Data nodes: the first starts as the primary, the others replicate it.
    pub nodes: usize,
    pub sentinels: usize,
    pub master_name: String,
    pub quorum: usize,
    pub down_after: Duration,
    pub failover_timeout: Duration,
    /// `resolve-hostnames` / `announce-hostnames`: nodes known as `localhost`.
    pub hostnames: bool,
    /// How long `start` waits for the Sentinels to converge.
    pub converge_deadline: Duration,
    /// Redis or Valkey (default: [`Flavor::from_env`]).
    pub flavor: Flavor,
    /// TLS only: every process on `tls-port` with client certificates required, replication
    /// over TLS; the certificates are made in the lab's directory ([`Lab::certs`]).
    pub tls: bool,
    /// The Sentinels' current epoch at start (`sentinel current-epoch`, as a Sentinel that has
    /// run for years keeps it in its config): the master's own config epoch stays 0, so its
    /// first failover jumps to this plus one, as Sentinel's one counter for every master does.
    pub current_epoch: u64,
}

impl Default for LabOptions {
    fn default() -> Self {
        Self {
            nodes: 3,
            sentinels: 3,
            master_name: "mymaster".to_string(),
            quorum: 2,
            down_after: Duration::from_millis(1000),
            failover_timeout: Duration::from_millis(5000),
            hostnames: false,
            converge_deadline: Duration::from_secs(60),
            flavor: Flavor::from_env(),
            tls: false,
            current_epoch: 0,
        }
    }
}

/// Which process of the lab.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Node(usize),
    Sentinel(usize),
}

struct Procs {
    nodes: Vec<Proc>,
    sentinels: Vec<Proc>,
}

impl Procs {
    fn get(&mut self, slot: Slot) -> anyhow::Result<&mut Proc> {
        let (list, i, what) = match slot {
            Slot::Node(i) => (&mut self.nodes, i, "node"),
            Slot::Sentinel(i) => (&mut self.sentinels, i, "sentinel"),
        };
        list.get_mut(i).with_context(|| format!("no {what} {i} in this lab"))
    }
}

pub struct Lab {
    opts: LabOptions,
    /// Behind a mutex so that every helper takes `&self` and a test can share the lab with
    /// tasks; never held across an await.
    procs: Mutex<Procs>,
    /// With `tls`: the certificates, in `dir`.
    certs: Option<tls::Certs>,
    /// Dropped after `Drop::drop` killed the processes, removing their files.
    dir: tempfile::TempDir,
}

impl Lab {
    /// Starts the nodes, waits for replication, starts the Sentinels and waits until every
    /// Sentinel knows the master, all replicas and all other Sentinels.
    pub async fn start(opts: LabOptions) -> anyhow::Result<Lab> {
        if opts.nodes == 0 || opts.sentinels == 0 {
            bail!("a lab needs at least one node and one sentinel");
        }
        leftovers::clean();
        let dir = leftovers::new_dir().context("cannot create the lab directory")?;
        let procs = Procs { nodes: Vec::new(), sentinels: Vec::new() };
        let certs = match opts.tls {
            true => Some(tls::Certs::generate(&dir.path().join("tls"))?),
            false => None,
        };
        let lab = Lab { opts, procs: Mutex::new(procs), certs, dir };
        lab.launch_all().await.map_err(|e| lab.explain(e))?;
        Ok(lab)
    }

    async fn launch_all(&self) -> anyhow::Result<()> {
        for i in 0..self.opts.nodes {
            let dir = self.dir.path().join(format!("node-{i}"));
            self.lock().nodes.push(Proc::new(Kind::Server, self.opts.flavor.clone(), dir));
            self.launch(Slot::Node(i)).await?;
        }
        self.wait_replication(self.opts.converge_deadline).await?;
        for i in 0..self.opts.sentinels {
            let dir = self.dir.path().join(format!("sentinel-{i}"));
            self.lock().sentinels.push(Proc::new(Kind::Sentinel, self.opts.flavor.clone(), dir));
            self.launch(Slot::Sentinel(i)).await?;
        }
        self.wait_converged(self.opts.converge_deadline).await
    }

    /// Picks a port, writes the config, starts the process and waits for `PING`, trying other
    /// ports if the chosen one was taken in the meantime.
    async fn launch(&self, slot: Slot) -> anyhow::Result<()> {
        for _ in 0..PORT_ATTEMPTS {
            self.prepare(slot)?;
            match self.wait_up(slot).await {
                Ok(()) => return Ok(()),
                Err(e) if !self.with(slot, |p| Ok(p.port_was_taken()))? => return Err(e),
                Err(_) => continue,
            }
        }
        bail!("no free port found for {slot:?} after {PORT_ATTEMPTS} attempts")
    }

    fn prepare(&self, slot: Slot) -> anyhow::Result<()> {
        let primary = self.lock().nodes.first().map(|n| n.port);
        let certs = self.certs.as_ref();
        self.with(slot, |p| {
            if certs.is_some() {
                tls::unregister(p.port);
            }
            p.port = process::free_port()?;
            let mut text = match (slot, primary) {
                (Slot::Node(0), _) => conf::server(p, None, &self.opts),
                (Slot::Node(_), primary) => conf::server(p, primary, &self.opts),
                (Slot::Sentinel(_), Some(primary)) => conf::sentinel(p, primary, &self.opts),
                (Slot::Sentinel(_), None) => bail!("sentinels need a node to monitor"),
            };
            if let Some(certs) = certs {
                // The last `port` line wins: the plain port is closed.
                text.push_str(&certs.conf_lines(p.port));
                tls::register(p.port, certs.client_tls());
            }
            process::write_config(p, &text)?;
            p.spawn()
        })
    }

    /// Restarts a killed process on its own (possibly rewritten) config and port.
    async fn relaunch(&self, slot: Slot) -> anyhow::Result<()> {
        self.with(slot, |p| {
            p.kill();
            p.spawn()
        })?;
        self.wait_up(slot).await.map_err(|e| self.explain(e))
    }

    /// Waits until the process answers `PING`; fails at once if it exits.
    async fn wait_up(&self, slot: Slot) -> anyhow::Result<()> {
        let deadline = Instant::now() + PROCESS_UP;
        let addr = self.with(slot, |p| Ok(p.addr()))?;
        loop {
            if let Some(status) = self.with(slot, |p| Ok(p.exited()))? {
                bail!("{slot:?} on {addr} exited at start ({status})");
            }
            if query::<String>(addr, &redis::cmd("PING")).await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{slot:?} on {addr} did not answer PING within {PROCESS_UP:?}");
            }
            sleep(POLL).await;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Procs> {
        // Nothing panics while the lock is held except on bugs in this module; the process
        // list is still accurate then, so a poisoned lock is safe to keep using (Drop needs it).
        self.procs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn with<T>(
        &self,
        slot: Slot,
        f: impl FnOnce(&mut Proc) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        f(self.lock().get(slot)?)
    }

    /// Adds every process's log tail to an error, for the test failure message.
    fn explain(&self, error: anyhow::Error) -> anyhow::Error {
        error.context(format!("lab logs (tail):\n{}", self.logs_tail(TAIL_LINES)))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let mut guard = self.lock();
        let procs = &mut *guard;
        for p in procs.sentinels.iter_mut().chain(procs.nodes.iter_mut()) {
            p.kill();
            if self.certs.is_some() {
                tls::unregister(p.port);
            }
        }
    }
}
