//! One lab process (a `redis-server` or a `redis-sentinel`): its directory, config and log,
//! and the signals the fault helpers send it.
//!
//! Children are `std::process::Child`, not tokio's, because they must be killed and reaped from
//! `Drop`, which cannot await.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Server,
    Sentinel,
}

impl Kind {
    pub fn program(self) -> &'static str {
        match self {
            Self::Server => "redis-server",
            Self::Sentinel => "redis-sentinel",
        }
    }
}

/// Which server the lab runs: Redis from the PATH, or Valkey from a given `valkey-server`
/// (which is also the Sentinel, with `--sentinel`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Flavor {
    #[default]
    Redis,
    Valkey {
        server: PathBuf,
    },
}

/// Set to a `valkey-server` path, the default lab (and so `polestar demo`) runs Valkey.
pub const VALKEY_ENV: &str = "POLESTAR_VALKEY_SERVER";

impl Flavor {
    /// Valkey when [`VALKEY_ENV`] names a program, else Redis.
    pub fn from_env() -> Self {
        match std::env::var_os(VALKEY_ENV) {
            Some(path) if !path.is_empty() => Self::Valkey { server: PathBuf::from(path) },
            _ => Self::Redis,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Redis => "Redis",
            Self::Valkey { .. } => "Valkey",
        }
    }

    /// The data node's program and its arguments after the config file.
    pub fn server_command(&self) -> (PathBuf, &'static [&'static str]) {
        self.command(Kind::Server)
    }

    /// The Sentinel's program and its arguments after the config file.
    pub fn sentinel_command(&self) -> (PathBuf, &'static [&'static str]) {
        self.command(Kind::Sentinel)
    }

    /// The program and the arguments after the config file for a process of `kind`.
    fn command(&self, kind: Kind) -> (PathBuf, &'static [&'static str]) {
        match (self, kind) {
            (Self::Redis, kind) => (PathBuf::from(kind.program()), &[]),
            (Self::Valkey { server }, Kind::Server) => (server.clone(), &[]),
            (Self::Valkey { server }, Kind::Sentinel) => (server.clone(), &["--sentinel"]),
        }
    }
}

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
    pub dir: PathBuf,
    child: Option<Child>,
    pub run: Run,
}

impl Proc {
    pub fn new(kind: Kind, flavor: Flavor, dir: PathBuf) -> Self {
        Self { kind, flavor, port: 0, dir, child: None, run: Run::Dead }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join(match self.kind {
            Kind::Server => "redis.conf",
            Kind::Sentinel => "sentinel.conf",
        })
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    fn output_path(&self) -> PathBuf {
        self.dir.join("output.log")
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts the program on its config file. The directory is also its working directory, which
    /// is how a later run recognises it as a leftover (see `leftovers`).
    pub fn spawn(&mut self) -> anyhow::Result<()> {
        let output = File::options().create(true).append(true).open(self.output_path())?;
        let (program, extra) = self.flavor.command(self.kind);
        let child = Command::new(&program)
            .arg(self.config_path())
            .args(extra)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output)
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
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

/// A port that was free a moment ago; the caller retries if a process still fails to bind it.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A port below the kernel's ephemeral range, free for both TCP and UDP on 127.0.0.1 right
/// now: for a server that another program binds later (knotd). A port from `free_port` lies
/// in the ephemeral range, where any outgoing connection of a busy test run may take it
/// before that program binds it (seen in CI: knotd's TCP bind failed).
pub fn free_service_port() -> anyhow::Result<u16> {
    let range = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let first: u16 = range.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(32768);
    let low = 10_000u16.min(first / 2);
    let span = u32::from(first.saturating_sub(low)).max(1);
    // Spread concurrent test processes over the range; no randomness needed beyond that.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let seed = std::process::id().wrapping_mul(7919).wrapping_add(nanos);
    for i in 0..span.min(2000) {
        let port = low + ((seed.wrapping_add(i * 131)) % span) as u16;
        let tcp = TcpListener::bind(("127.0.0.1", port));
        let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            return Ok(port);
        }
    }
    anyhow::bail!("no port free for TCP and UDP below {first}")
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

/// Writes `text` as the process's config file (the program rewrites it later).
pub fn write_config(proc: &Proc, text: &str) -> anyhow::Result<()> {
    fs::create_dir_all(&proc.dir)?;
    fs::write(proc.config_path(), text)
        .with_context(|| format!("cannot write {}", proc.config_path().display()))
}
