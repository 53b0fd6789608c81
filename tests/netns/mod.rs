//! A network-namespace lab: hosts on one Linux bridge, each its own namespace with one address
//! in 10.77.0.0/24 (used only inside these namespaces), so that faults look like production:
//! a SIGSTOPped redis-server, or a host whose link goes down (no RST, no FIN).
//!
//! Processes start through the lab crate's [`Launch`], as every lab's do, under
//! `ip netns exec`. Names start with `pst<pid>x<n>`: a run cleans what runs whose process is
//! gone left behind (namespaces, bridges, the processes inside), and [`Net`]'s `Drop` removes
//! everything it made, also when a test panics. Traffic stays on the bridge.
#![allow(dead_code)]

pub mod client;
pub mod cluster;
pub mod measure;

use std::fs::File;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::sched::{CloneFlags, setns};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use polestar_lab::{Flavor, Kind, Launch};
use tokio::time::{Instant, sleep};

pub const BIN: &str = env!("CARGO_BIN_EXE_polestar");
const PREFIX: &str = "pst";
static NEXT: AtomicU32 = AtomicU32::new(0);
/// Namespace tests share the machine's network stack: one at a time, also under `cargo test`.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One host: a namespace, its veth into the bridge, its address.
#[derive(Clone, Debug)]
pub struct Host {
    pub ns: String,
    pub ip: IpAddr,
    /// The bridge-side end of its veth.
    veth: String,
}

pub struct Net {
    pub tag: String,
    bridge: String,
    hosts: Mutex<Vec<Host>>,
    /// Every process started in a namespace, with its log file.
    procs: Mutex<Vec<(String, Child, PathBuf)>>,
    pub dir: tempfile::TempDir,
}

/// Runs `program args` to completion; fails with its stderr unless it succeeds.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program).args(args).output()?;
    anyhow::ensure!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    run("ip", args)
}

fn ip_out(args: &[&str]) -> String {
    Command::new("ip")
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

impl Net {
    /// An empty network: a bridge in the root namespace (no address there).
    pub fn new() -> anyhow::Result<Net> {
        clean_leftovers();
        let tag = format!("{PREFIX}{}x{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
        let bridge = format!("{tag}b");
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        let net = Net {
            tag,
            bridge,
            hosts: Mutex::new(Vec::new()),
            procs: Mutex::new(Vec::new()),
            dir: tempfile::tempdir()?,
        };
        ip(&["link", "set", &net.bridge, "up"])?;
        Ok(net)
    }

    /// Adds host `name` (two letters and a digit at most) with address `10.77.0.<octet>`.
    pub fn host(&self, name: &str, octet: u8) -> anyhow::Result<Host> {
        let ns = format!("{}-{name}", self.tag);
        let veth = format!("{}{name}", self.tag);
        let host =
            Host { ns: ns.clone(), ip: IpAddr::from([10, 77, 0, octet]), veth: veth.clone() };
        ip(&["netns", "add", &ns])?;
        self.lock_hosts().push(host.clone());
        ip(&["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
        ip(&["link", "set", &veth, "master", &self.bridge, "up"])?;
        let cidr = format!("{}/24", host.ip);
        ip(&["-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        Ok(host)
    }

    /// Starts `program args` inside the host's namespace, output to `<dir>/<label>.log`.
    pub fn spawn(
        &self,
        host: &Host,
        label: &str,
        program: &str,
        args: &[&str],
    ) -> anyhow::Result<u32> {
        self.start(host, label, Launch::program(program, self.dir.path()).args(args))
    }

    /// Starts a data node or Sentinel of `flavor` on `config` inside the host's namespace, the
    /// way every lab starts one ([`Launch::server`]); output to `<dir>/<label>.log`.
    pub fn spawn_server(
        &self,
        host: &Host,
        label: &str,
        flavor: &Flavor,
        kind: Kind,
        config: &Path,
    ) -> anyhow::Result<u32> {
        self.start(host, label, Launch::server(flavor, kind, config))
    }

    /// Runs `launch` in the host's namespace, working in the network's directory, its output in
    /// a fresh `<label>.log`; the process is `label`'s from now on.
    fn start(&self, host: &Host, label: &str, launch: Launch) -> anyhow::Result<u32> {
        let log = self.dir.path().join(format!("{label}.log"));
        File::create(&log)?;
        let launch = launch.dir(self.dir.path()).output(&log).in_namespace(&host.ns);
        let child = launch.spawn()?;
        let pid = child.id();
        self.lock_procs().push((label.to_string(), child, log));
        Ok(pid)
    }

    pub fn signal(&self, label: &str, signal: Signal) -> anyhow::Result<()> {
        let procs = self.lock_procs();
        let (_, child, _) = procs
            .iter()
            .find(|(l, _, _)| l == label)
            .ok_or_else(|| anyhow::anyhow!("no {label}"))?;
        kill(Pid::from_raw(child.id() as i32), signal)?;
        Ok(())
    }

    /// Stops one process as an operator does (SIGTERM) and reaps it; killed if it has not
    /// exited within `grace`.
    pub fn terminate(&self, label: &str, grace: Duration) {
        let mut procs = self.lock_procs();
        if let Some(i) = procs.iter().position(|(l, _, _)| l == label) {
            let (_, mut child, _) = procs.remove(i);
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            let deadline = std::time::Instant::now() + grace;
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            reap(&mut child);
        }
    }

    /// Kills and reaps one process.
    pub fn stop(&self, label: &str) {
        let mut procs = self.lock_procs();
        if let Some(i) = procs.iter().position(|(l, _, _)| l == label) {
            let (_, mut child, _) = procs.remove(i);
            reap(&mut child);
        }
    }

    pub fn log(&self, label: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{label}.log"))).unwrap_or_default()
    }

    /// Takes the host's link down from inside: no RST, no FIN, nothing leaves it.
    pub fn go_dark(&self, host: &Host) -> anyhow::Result<()> {
        ip(&["-n", &host.ns, "link", "set", "eth0", "down"])
    }

    /// Brings the host's link up again after [`Net::go_dark`].
    pub fn go_light(&self, host: &Host) -> anyhow::Result<()> {
        ip(&["-n", &host.ns, "link", "set", "eth0", "up"])
    }

    /// Shapes the traffic the bridge sends into `host` (its veth's bridge end) to `rate`
    /// (`40mbit`) with a token bucket: a replica there lags behind a fast writer. netem is not
    /// available on these kernels; tbf is.
    pub fn shape(&self, host: &Host, rate: &str) -> anyhow::Result<()> {
        let args = ["qdisc", "replace", "dev", &host.veth, "root", "tbf", "rate", rate];
        run("tc", &[&args[..], &["burst", "32kbit", "latency", "400ms"]].concat())
    }

    /// Removes the shaping of [`Net::shape`].
    pub fn unshape(&self, host: &Host) -> anyhow::Result<()> {
        run("tc", &["qdisc", "del", "dev", &host.veth, "root"])
    }

    /// Runs a shell command inside a namespace and returns its stdout.
    pub fn exec(&self, host: &Host, program: &str, args: &[&str]) -> String {
        Command::new("ip")
            .args(["netns", "exec", &host.ns, program])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    fn lock_hosts(&self) -> std::sync::MutexGuard<'_, Vec<Host>> {
        self.hosts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_procs(&self) -> std::sync::MutexGuard<'_, Vec<(String, Child, PathBuf)>> {
        self.procs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until the polestar started as `label` logs `ready`; fails at once on `Error:`.
    pub async fn ready(&self, label: &str, limit: Duration) -> anyhow::Result<()> {
        let what = format!("{label} ready");
        let ready = until(&what, limit, || async {
            let log = self.log(label);
            if log.contains("Error:") {
                return Some(Err(anyhow::anyhow!("{label} failed:\n{log}")));
            }
            log.lines().any(|l| l.trim_end().ends_with("ready")).then_some(Ok(()))
        });
        ready.await?
    }

    /// `result`, with every process's log added to its error.
    pub fn with_logs<T>(&self, result: anyhow::Result<T>) -> anyhow::Result<T> {
        result.map_err(|e| anyhow::anyhow!("{e:#}\n{}", self.logs()))
    }

    /// Every log, for a failure message.
    pub fn logs(&self) -> String {
        let procs = self.lock_procs();
        let mut out = String::new();
        // polestar's own logs first: a failure's excerpt shows its head.
        let mut ordered: Vec<_> = procs.iter().collect();
        ordered.sort_by_key(|(label, _, _)| !label.contains("polestar"));
        for (label, _, path) in ordered {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(30)..].join("\n");
            out.push_str(&format!("--- {label} ---\n{tail}\n"));
        }
        out
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for (_, child, _) in self.lock_procs().iter_mut() {
            reap(child);
        }
        for host in self.lock_hosts().iter() {
            remove_namespace(&host.ns);
            let _ = ip(&["link", "del", &host.veth]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

fn reap(child: &mut Child) {
    let pid = Pid::from_raw(child.id() as i32);
    let _ = kill(pid, Signal::SIGCONT);
    let _ = child.kill();
    let _ = child.wait();
}

/// Kills whatever still runs in the namespace, destroys its remaining TCP sockets (orphans
/// retransmitting to a dark host would keep the namespace, and its veth, alive for minutes),
/// then deletes it (its veth goes with it).
fn remove_namespace(ns: &str) {
    for pid in ip_out(&["netns", "pids", ns]).split_whitespace() {
        if let Ok(pid) = pid.parse::<i32>() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    let _ = Command::new("ip").args(["netns", "exec", ns, "ss", "-K", "-ta"]).output();
    let _ = ip(&["netns", "del", ns]);
}

/// Removes namespaces and bridges of earlier runs whose process is gone.
pub fn clean_leftovers() {
    let owner_gone = |name: &str| {
        let Some(rest) = name.strip_prefix(PREFIX) else { return false };
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        !pid.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
    };
    for line in ip_out(&["netns", "list"]).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if owner_gone(name) {
            remove_namespace(name);
        }
    }
    // Bridges, and veths whose namespace outlived its name.
    for line in ip_out(&["-o", "link", "show"]).lines() {
        let name = line.split(':').nth(1).unwrap_or("").trim();
        let name = name.split('@').next().unwrap_or("");
        if owner_gone(name) {
            let _ = ip(&["link", "del", name]);
        }
    }
}

/// Runs `f` on a thread inside the host's namespace (its sockets live there), on a
/// current-thread runtime; the result comes back through the join handle.
pub fn in_ns<F, Fut, T>(host: &Host, f: F) -> tokio::task::JoinHandle<anyhow::Result<T>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<T>>,
    T: Send + 'static,
{
    let path = format!("/run/netns/{}", host.ns);
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let result = (|| {
            let file = File::open(&path)?;
            setns(&file, CloneFlags::CLONE_NEWNET)?;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(f())
        })();
        let _ = tx.send(result);
    });
    tokio::spawn(async move {
        rx.await.unwrap_or_else(|_| Err(anyhow::anyhow!("the namespace thread died")))
    })
}

/// Polls `check` until it returns `Some`, or fails after `limit`.
pub async fn until<T, Fut: Future<Output = Option<T>>>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Fut,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        anyhow::ensure!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        sleep(Duration::from_millis(50)).await;
    }
}

/// `GET url` as JSON from inside `host`'s namespace.
pub async fn get_json(host: &Host, url: String) -> Option<serde_json::Value> {
    let answer = in_ns(host, move || async move {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(1)).build()?;
        Ok(http.get(url).send().await?.json::<serde_json::Value>().await?)
    });
    answer.await.ok()?.ok()
}

/// A value of a `redis-cli` field/value listing (`SENTINEL MASTER`).
pub fn field<'a>(listing: &'a str, key: &str) -> Option<&'a str> {
    let lines: Vec<&str> = listing.lines().collect();
    lines.iter().position(|l| *l == key).and_then(|i| lines.get(i + 1)).copied()
}

pub fn addr(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}
