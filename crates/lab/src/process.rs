//! One process on loopback (a data node or a Sentinel) that a lab or a [`Server`] owns: its
//! directory, config and logs, how it is started (a port, a config, [`Launch`], `PING`), and the
//! signals the fault helpers send it.
//!
//! [`Server`]: crate::Server

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::time::Duration;

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::time::{Instant, sleep};

use crate::conf::Listen;
use crate::flavor::{Flavor, Kind};
use crate::launch::Launch;
use crate::ports::Ports;
use crate::query::query;
use crate::tls::{self, Certs};

/// How often a start polls for `PING`.
const POLL: Duration = Duration::from_millis(100);
/// How long one process may take to answer `PING` after it was spawned.
const PROCESS_UP: Duration = Duration::from_secs(20);
/// Attempts at finding a free port for a process.
const PORT_ATTEMPTS: usize = 5;

/// What the fault helpers last did to a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Run {
    Running,
    /// SIGSTOP'ed: alive, holding its sockets, answering nothing.
    Stopped,
    /// Killed (or never started); its config and directory stay for a restart.
    Dead,
}

pub struct Proc {
    pub kind: Kind,
    pub flavor: Flavor,
    pub port: u16,
    pub ports: Ports,
    pub dir: PathBuf,
    /// TLS only, on these certificates (queries dial it over TLS: `tls::register`).
    pub certs: Option<Certs>,
    /// Arguments after the config file.
    pub args: Vec<String>,
    child: Option<Child>,
    pub run: Run,
}

impl Proc {
    pub fn new(kind: Kind, flavor: Flavor, dir: PathBuf) -> Self {
        let (ports, certs, args) = (Ports::default(), None, Vec::new());
        Self { kind, flavor, port: 0, ports, dir, certs, args, child: None, run: Run::Dead }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Where it listens and logs: every lab process on loopback listens on 127.0.0.1.
    pub fn listen(&self) -> Listen {
        let (ip, dir) = (self.addr().ip(), self.dir.clone());
        Listen { ip, port: self.port, dir, logfile: Some(self.log_path()) }
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join(self.kind.config_name())
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    fn output_path(&self) -> PathBuf {
        self.dir.join("output.log")
    }

    /// Its name in messages: its directory's (`node-1`, `sentinel-0`).
    pub fn name(&self) -> String {
        self.dir.file_name().unwrap_or_default().to_string_lossy().into_owned()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills what an earlier attempt left, takes a new port, writes the config `conf` makes for it (with the TLS lines of a TLS
    /// process: the last `port` line wins, the plain port is closed) and starts the process.
    pub fn prepare(
        &mut self,
        conf: impl FnOnce(&Proc) -> anyhow::Result<String>,
    ) -> anyhow::Result<()> {
        self.kill();
        if self.certs.is_some() {
            tls::unregister(self.port);
        }
        self.port = self.ports.pick()?;
        let mut text = conf(self)?;
        if let Some(certs) = &self.certs {
            text.push_str(&certs.conf_lines(self.port));
            tls::register(self.port, certs.clone());
        }
        crate::conf::write(&self.dir, self.kind, &text)?;
        self.spawn()
    }

    /// Starts the program on its config file (as written, or as the program rewrote it).
    pub fn spawn(&mut self) -> anyhow::Result<()> {
        let launch = Launch::server(&self.flavor, self.kind, &self.config_path());
        let child = launch.args(&self.args).output(self.output_path()).spawn()?;
        self.child = Some(child);
        self.run = Run::Running;
        Ok(())
    }

    /// The exit status if the process has exited (reaping it).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        self.run = Run::Dead;
        Some(status)
    }

    pub fn signal(&mut self, signal: Signal) -> anyhow::Result<()> {
        let pid = self.pid().with_context(|| format!("{} is not running", self.addr()))?;
        let pid = Pid::from_raw(i32::try_from(pid).context("pid out of range")?);
        kill(pid, signal).with_context(|| format!("cannot send {signal} to {}", self.addr()))
    }

    pub fn stop(&mut self) -> anyhow::Result<()> {
        self.signal(Signal::SIGSTOP)?;
        self.run = Run::Stopped;
        Ok(())
    }

    pub fn cont(&mut self) -> anyhow::Result<()> {
        self.signal(Signal::SIGCONT)?;
        self.run = Run::Running;
        Ok(())
    }

    /// SIGKILL and reap; SIGCONT first so that a stopped process is not left half-dead.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.run = Run::Dead;
    }

    /// The last `lines` lines of the process's log and captured output, for failure messages.
    pub fn tail(&self, lines: usize) -> String {
        let mut out = String::new();
        for path in [self.log_path(), self.output_path()] {
            let text = tail_of(&path, lines);
            if !text.trim().is_empty() {
                out.push_str(&format!("--- {} ---\n{text}", path.display()));
            }
        }
        out
    }

    /// Whether the process's output says its port was taken (so another port is worth a try).
    pub fn port_was_taken(&self) -> bool {
        let text = tail_of(&self.log_path(), 50) + &tail_of(&self.output_path(), 50);
        text.contains("Address already in use")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if self.certs.is_some() {
            tls::unregister(self.port);
        }
    }
}

/// Gives access to one process that may be shared (a lab's behind its mutex): the start below
/// never holds it across an await.
pub trait Holder {
    fn with<T>(&self, f: impl FnOnce(&mut Proc) -> anyhow::Result<T>) -> anyhow::Result<T>;
}

/// Picks a port, writes the config `conf` makes, starts the process and waits for `PING`, trying
/// other ports if the chosen one was taken in the meantime.
pub async fn launch(
    proc: &impl Holder,
    conf: impl Fn(&Proc) -> anyhow::Result<String>,
) -> anyhow::Result<()> {
    for _ in 0..PORT_ATTEMPTS {
        proc.with(|p| p.prepare(&conf))?;
        match wait_up(proc).await {
            Ok(()) => return Ok(()),
            Err(e) if !proc.with(|p| Ok(p.port_was_taken()))? => return Err(e),
            Err(_) => continue,
        }
    }
    let name = proc.with(|p| Ok(p.name()))?;
    bail!("no free port found for {name} after {PORT_ATTEMPTS} attempts")
}

/// Waits until the process answers `PING`; fails at once if it exits.
pub async fn wait_up(proc: &impl Holder) -> anyhow::Result<()> {
    let deadline = Instant::now() + PROCESS_UP;
    let (addr, name) = proc.with(|p| Ok((p.addr(), p.name())))?;
    loop {
        if let Some(status) = proc.with(|p| Ok(p.exited()))? {
            bail!("{name} on {addr} exited at start ({status})");
        }
        if query::<String>(addr, &redis::cmd("PING")).await.is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{name} on {addr} did not answer PING within {PROCESS_UP:?}");
        }
        sleep(POLL).await;
    }
}

fn tail_of(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else { return String::new() };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    all[start..].iter().map(|l| format!("{l}\n")).collect()
}
