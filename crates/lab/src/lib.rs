//! Real Redis and Valkey processes on this machine for polestar's integration tests, benches
//! and `polestar demo`, so that every claim about failover is checked against the real thing,
//! not a fake. A workspace member of its own: no part of the polestar library, a
//! dev-dependency of the tests and examples, and behind the binary's default `demo` feature.
//!
//! - [`Lab`]: a cluster on loopback, N `redis-server` (one primary, N-1 replicas) and M
//!   `redis-sentinel` (or Valkey: [`Flavor`]) on free 127.0.0.1 ports, each with its own
//!   directory, config and log in a temp dir, with Sentinel timings fast enough for tests. The
//!   fault helpers kill, hang (SIGSTOP) and restart processes the way production fails.
//! - [`Server`]: one data node or Sentinel on loopback that a test configures itself.
//! - The pieces the namespace labs of the tests use too, so that every process is started one
//!   way: [`conf`] (config files), [`Launch`] (the program of a [`Flavor`], its directory, its
//!   log), [`ports`] (port choice), [`leftovers`] (cleaning up after a dead owner).
//!
//! Everything a lab or a server started is killed and reaped on drop, also during a panic; the
//! processes of labs whose owner died without dropping are cleaned by the next start (see
//! [`leftovers`]).

mod accessors;
pub mod conf;
mod faults;
mod flavor;
mod launch;
pub mod leftovers;
pub mod ports;
mod process;
mod query;
mod server;
pub mod tls;
mod waits;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, bail};

pub use flavor::{Flavor, Kind, VALKEY_ENV};
pub use launch::Launch;
pub use ports::{free_port, free_ports_from, free_service_port};
use process::{Holder, Proc};
pub use query::query;
pub use server::{Server, ServerOptions};

/// How often the waits poll.
const POLL: Duration = Duration::from_millis(100);
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
            self.launch(Slot::Node(i)).await?;
        }
        self.wait_replication(self.opts.converge_deadline).await?;
        for i in 0..self.opts.sentinels {
            self.launch(Slot::Sentinel(i)).await?;
        }
        self.wait_converged(self.opts.converge_deadline).await
    }

    /// Adds the process of `slot` and starts it: the first node is the primary that the other
    /// nodes replicate and the Sentinels monitor.
    async fn launch(&self, slot: Slot) -> anyhow::Result<()> {
        self.add(slot);
        let primary = match slot {
            Slot::Node(0) => None,
            _ => self.lock().nodes.first().map(|n| n.port),
        };
        let opts = &self.opts;
        process::launch(&self.at(slot), |p| conf_of(slot, primary, p, opts)).await
    }

    /// A new process for `slot`, in its own directory of the lab's.
    fn add(&self, slot: Slot) {
        let (kind, name) = match slot {
            Slot::Node(i) => (Kind::Server, format!("node-{i}")),
            Slot::Sentinel(i) => (Kind::Sentinel, format!("sentinel-{i}")),
        };
        let mut proc = Proc::new(kind, self.opts.flavor.clone(), self.dir.path().join(name));
        proc.certs = self.certs.clone();
        let mut procs = self.lock();
        match slot {
            Slot::Node(_) => procs.nodes.push(proc),
            Slot::Sentinel(_) => procs.sentinels.push(proc),
        }
    }

    /// Restarts a killed process on its own (possibly rewritten) config and port.
    async fn relaunch(&self, slot: Slot) -> anyhow::Result<()> {
        self.with(slot, |p| {
            p.kill();
            p.spawn()
        })?;
        process::wait_up(&self.at(slot)).await.map_err(|e| self.explain(e))
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

    /// The process in `slot`, for the start in `process`.
    fn at(&self, slot: Slot) -> At<'_> {
        At { lab: self, slot }
    }

    /// Adds every process's log tail to an error, for the test failure message.
    fn explain(&self, error: anyhow::Error) -> anyhow::Error {
        error.context(format!("lab logs (tail):\n{}", self.logs_tail(TAIL_LINES)))
    }
}

/// The config of the process in `slot`; `primary` is the first node's port (none for itself).
fn conf_of(
    slot: Slot,
    primary: Option<u16>,
    p: &Proc,
    opts: &LabOptions,
) -> anyhow::Result<String> {
    Ok(match (slot, primary) {
        (Slot::Node(_), primary) => conf::lab_node(&p.listen(), primary, opts),
        (Slot::Sentinel(_), Some(primary)) => conf::lab_sentinel(&p.listen(), primary, opts),
        (Slot::Sentinel(_), None) => bail!("sentinels need a node to monitor"),
    })
}

/// One process of a lab, reached through the lab's lock.
struct At<'a> {
    lab: &'a Lab,
    slot: Slot,
}

impl Holder for At<'_> {
    fn with<T>(&self, f: impl FnOnce(&mut Proc) -> anyhow::Result<T>) -> anyhow::Result<T> {
        self.lab.with(self.slot, f)
    }
}

impl Drop for Lab {
    /// The Sentinels first, so that none reacts to the nodes' end; each `Proc` reaps its child.
    fn drop(&mut self) {
        let mut guard = self.lock();
        let procs = &mut *guard;
        for p in procs.sentinels.iter_mut().chain(procs.nodes.iter_mut()) {
            p.kill();
        }
    }
}
