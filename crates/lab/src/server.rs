//! One data node or Sentinel on loopback outside a cluster lab, configured by the test itself
//! (the drain tests' nodes and their Sentinel, a node unrelated to a lab's master). Started as
//! a lab's processes are: the same config lines, port choice and [`Launch`](crate::Launch), in
//! a lab directory with an owner (see `leftovers`), `PING` before it counts as up. Killed on
//! drop.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use anyhow::Context;
use nix::sys::signal::Signal;

use crate::conf::{self, Monitor};
use crate::flavor::{Flavor, Kind};
use crate::leftovers;
use crate::ports::Ports;
use crate::process::{self, Holder, Proc};

/// Log lines shown when a start fails.
const TAIL_LINES: usize = 25;

#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub kind: Kind,
    pub flavor: Flavor,
    /// Config lines after the common ones (for a data node, after [`conf::data_node`]'s).
    pub conf: String,
    /// Arguments after the config file (`--replicaof 127.0.0.1 6379`, an ACL `--user ...`).
    pub args: Vec<String>,
    pub ports: Ports,
}

impl ServerOptions {
    /// A Redis data node that replicates nothing.
    pub fn node() -> Self {
        let (conf, args) = (String::new(), Vec::new());
        Self { kind: Kind::Server, flavor: Flavor::Redis, conf, args, ports: Ports::Ephemeral }
    }

    /// A Redis Sentinel watching one master.
    pub fn sentinel(monitor: &Monitor) -> Self {
        Self { kind: Kind::Sentinel, conf: conf::monitor(monitor), ..Self::node() }
    }

    /// The process's whole config for `listen`.
    fn conf_for(&self, listen: &conf::Listen) -> String {
        let base = match self.kind {
            Kind::Server => conf::data_node(listen, None),
            Kind::Sentinel => conf::common(listen),
        };
        base + &self.conf
    }
}

pub struct Server {
    /// Dropped first (killing the process), then the directory.
    proc: Mutex<Proc>,
    dir: tempfile::TempDir,
}

impl Server {
    /// Starts it and waits until it answers `PING`.
    pub async fn start(opts: ServerOptions) -> anyhow::Result<Server> {
        leftovers::clean();
        let dir = leftovers::new_dir().context("cannot create the server's directory")?;
        let name = match opts.kind {
            Kind::Server => "node",
            Kind::Sentinel => "sentinel",
        };
        let mut proc = Proc::new(opts.kind, opts.flavor.clone(), dir.path().join(name));
        (proc.ports, proc.args) = (opts.ports, opts.args.clone());
        let server = Server { proc: Mutex::new(proc), dir };
        let started = process::launch(&server, |p| Ok(opts.conf_for(&p.listen()))).await;
        started
            .map_err(|e| e.context(format!("logs (tail):\n{}", server.logs_tail(TAIL_LINES))))?;
        Ok(server)
    }

    pub fn addr(&self) -> SocketAddr {
        self.lock().addr()
    }

    pub fn port(&self) -> u16 {
        self.lock().port
    }

    pub fn pid(&self) -> Option<u32> {
        self.lock().pid()
    }

    /// Sends `signal` (SIGSTOP: it keeps its sockets and answers nothing; SIGCONT).
    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        self.lock().signal(signal)
    }

    /// Its directory (config, logs); removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The last lines of its log and captured output.
    pub fn logs_tail(&self, lines: usize) -> String {
        self.lock().tail(lines)
    }

    fn lock(&self) -> MutexGuard<'_, Proc> {
        // Only field reads and signals under the lock: a poisoned one is still accurate.
        self.proc.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Holder for Server {
    fn with<T>(&self, f: impl FnOnce(&mut Proc) -> anyhow::Result<T>) -> anyhow::Result<T> {
        f(&mut self.lock())
    }
}
