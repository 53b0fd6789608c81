//! The operation contract (docs/operating.md, "Operating polestar") against the real binary and a real
//! cluster: systemd notifications (through a fake `NOTIFY_SOCKET`), SIGHUP reloads that never drop
//! service, SIGTERM during a long-poll, and JSON logs.

use crate::common;

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use polestar_lab::{Lab, LabOptions, leftovers};
use serde_json::Value;
use tokio::time::{Instant, sleep};

/// A daemon started by hand, for what the shared harness does not do: environment, flags,
/// signals and its exit status.
struct Daemon {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    config_path: PathBuf,
    http: String,
    dir: tempfile::TempDir,
}

impl Daemon {
    async fn start(config: &PolestarConfig, args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let dir = leftovers::new_dir().expect("a daemon directory");
        let config_path = dir.path().join("polestar.yaml");
        std::fs::write(&config_path, config.yaml(dir.path())).expect("write the config");
        let mut command = Command::new(BIN);
        command.args(args).args(["run", "-c"]).arg(&config_path).current_dir(dir.path());
        command.env("NO_COLOR", "1").env("POLESTAR_LOG", "info").envs(env.iter().copied());
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("the polestar binary starts");
        let log = Arc::new(Mutex::new(Vec::new()));
        collect_lines(child.stderr.take().expect("stderr is piped"), log.clone());
        let mut d = Daemon { child, log, config_path, http: String::new(), dir };
        d.http = d.wait_message(STARTUP, |m| m.starts_with("listening for HTTP on ")).await;
        d.http = d.http.trim_start_matches("listening for HTTP on ").to_string();
        d.wait_message(STARTUP, |m| m == "ready").await;
        d
    }

    /// The log messages so far (the `message` field of JSON lines).
    fn messages(&self) -> Vec<String> {
        lock(&self.log).iter().map(|l| message(l)).collect()
    }

    async fn wait_message(&self, deadline: Duration, want: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            if let Some(m) = self.messages().into_iter().find(|m| want(m)) {
                return m;
            }
            sleep(POLL).await;
        }
        panic!("no such log line within {deadline:?}:\n{}", lock(&self.log).join("\n"));
    }

    fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(self.child.id() as i32);
        kill(pid, signal).expect("the daemon is running");
    }

    /// Waits for the process to exit; its exit code.
    async fn exit_code(&mut self, deadline: Duration) -> Option<i32> {
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            if let Some(status) = self.child.try_wait().expect("wait for the daemon") {
                return status.code();
            }
            sleep(POLL).await;
        }
        panic!("still running after {deadline:?}:\n{}", lock(&self.log).join("\n"));
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    fn rewrite(&self, config: &PolestarConfig) {
        let yaml = config.yaml(self.dir.path());
        let tmp = self.config_path.with_extension("new");
        std::fs::write(&tmp, yaml).expect("write the new config");
        std::fs::rename(&tmp, &self.config_path).expect("replace the config");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `message` of a log line: `fields.message` of a JSON line, or what follows the target
/// (`TIME LEVEL target: message`) of a human one.
fn message(line: &str) -> String {
    match serde_json::from_str::<Value>(line) {
        Ok(v) => v["fields"]["message"].as_str().unwrap_or_default().to_string(),
        Err(_) => line.split_once(": ").map_or(line, |(_, m)| m).to_string(),
    }
}

/// A fake service manager: the unix datagram socket `NOTIFY_SOCKET` names.
struct Notifications {
    socket: UnixDatagram,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Notifications {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
        socket.set_nonblocking(true).expect("non-blocking");
        Notifications { socket, path, _dir: dir }
    }

    /// Every datagram received so far.
    fn drain(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.socket.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        out
    }

    /// Collects datagrams until one contains `what`; all of them.
    async fn until(&self, what: &str, deadline: Duration, seen: &mut Vec<String>) {
        let end = Instant::now() + deadline;
        loop {
            seen.extend(self.drain());
            if seen.iter().any(|m| m.lines().any(|l| l == what)) {
                return;
            }
            assert!(Instant::now() < end, "no {what} within {deadline:?}: {seen:?}");
            sleep(Duration::from_millis(20)).await;
        }
    }
}

fn count(seen: &[String], what: &str) -> usize {
    seen.iter().filter(|m| m.lines().any(|l| l == what)).count()
}

/// READY once serving, WATCHDOG at half of WATCHDOG_USEC, RELOADING then READY around a
/// SIGHUP, STOPPING on SIGTERM; a long-poll open at SIGTERM returns at once, the process exits
/// 0; and every log line of `--log-format json` is a JSON object.
#[tokio::test]
async fn systemd_notifications_sigterm_and_json_logs() {
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    let notify = Notifications::new();
    let socket = notify.path.to_string_lossy().to_string();
    let env = [("NOTIFY_SOCKET", socket.as_str()), ("WATCHDOG_USEC", "1000000")];
    let started = Instant::now();
    let mut d =
        Daemon::start(&PolestarConfig::for_lab(&lab), &["--log-format", "json"], &env).await;
    let mut seen = Vec::new();
    notify.until("READY=1", Duration::from_secs(5), &mut seen).await;
    // Every 0.5 s, three come within 1.5 s; a daemon pinging less often than WATCHDOG_USEC (1 s)
    // would be killed by systemd, so three within 3 s at the latest (a fixed 1.6 s of sleep
    // counted the test's timer as much as the daemon's).
    let end = Instant::now() + Duration::from_secs(3);
    while count(&seen, "WATCHDOG=1") < 3 {
        assert!(Instant::now() < end, "fewer than 3 pings within 3 s of READY: {seen:?}");
        sleep(Duration::from_millis(20)).await;
        seen.extend(notify.drain());
    }
    let pings = count(&seen, "WATCHDOG=1");
    let elapsed = started.elapsed().as_secs_f64();
    assert!(pings as f64 <= elapsed * 2.0 + 2.0, "{pings} pings in {elapsed:.1} s: {seen:?}");

    d.signal(Signal::SIGHUP);
    let mut reload = Vec::new();
    notify.until("READY=1", Duration::from_secs(5), &mut reload).await;
    let reloading = reload.iter().position(|m| m.starts_with("RELOADING=1\nMONOTONIC_USEC="));
    let ready = reload.iter().position(|m| m.starts_with("READY=1"));
    assert!(reloading.is_some() && reloading < ready, "RELOADING before READY: {reload:?}");
    d.wait_message(STARTUP, |m| m.contains("no changes")).await;

    let master = lab.master_name().to_string();
    let client = reqwest::Client::new();
    let epoch: Value = client
        .get(d.url(&format!("/v1/masters/{master}")))
        .send()
        .await
        .expect("GET master")
        .json()
        .await
        .expect("JSON");
    let after = epoch["epoch"].as_u64().expect("an epoch");
    // A connection of its own, so that the daemon is seen to have read this request.
    let mut poll = tokio::net::TcpStream::connect(&d.http).await.expect("connect");
    let request =
        format!("GET /v1/masters/{master}?wait=60s&after={after} HTTP/1.1\r\nHost: x\r\n\r\n");
    tokio::io::AsyncWriteExt::write_all(&mut poll, request.as_bytes()).await.expect("send");
    let (server, mine) = (port_of(&d.http), poll.local_addr().expect("bound").port());
    let end = Instant::now() + Duration::from_secs(10);
    while !server_read_all(server, mine) {
        assert!(Instant::now() < end, "the daemon never read the long-poll");
        sleep(Duration::from_millis(10)).await;
    }
    let stop = Instant::now();
    d.signal(Signal::SIGTERM);
    let mut answer = vec![0u8; 4096];
    let read = tokio::io::AsyncReadExt::read(&mut poll, &mut answer);
    let n = tokio::time::timeout(Duration::from_secs(3), read).await;
    let n = n.expect("the long-poll returns promptly").expect("readable");
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 200"), "the long-poll got an answer: {answer:?}");
    assert_eq!(d.exit_code(Duration::from_secs(10)).await, Some(0));
    assert!(stop.elapsed() < Duration::from_secs(5), "stopped in {:?}", stop.elapsed());
    let mut last = Vec::new();
    notify.until("STOPPING=1", Duration::from_secs(1), &mut last).await;

    let log = lock(&d.log).clone();
    for line in &log {
        let parsed: Result<Value, _> = serde_json::from_str(line);
        assert!(parsed.is_ok_and(|v| v.is_object()), "not a JSON object: {line:?}");
    }
    for stable in ["ready", "shutting down"] {
        assert!(d.messages().iter().any(|m| m == stable), "no {stable:?} line: {log:?}");
    }
    assert!(d.messages().iter().any(|m| m.starts_with("listening for HTTP on 127.0.0.1:")));
}

fn port_of(addr: &str) -> u16 {
    addr.parse::<std::net::SocketAddr>().expect("an address").port()
}

/// Whether the server end of the loopback TCP connection from port `client` to port `server`
/// has read all that was sent to it (`/proc/net/tcp`: established, receive queue empty): a
/// request it has read is answered, also when it is told to stop right after.
fn server_read_all(server: u16, client: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let port = |a: &str| a.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
    table.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let empty = |queues: &str| {
            queues.split(':').nth(1).is_some_and(|rx| rx.trim_start_matches('0').is_empty())
        };
        f.len() > 4
            && port(f[1]) == Some(server)
            && port(f[2]) == Some(client)
            && f[3] == "01"
            && empty(f[4])
    })
}

/// Requests `paths` over and over until stopped; every answer that is not 200, as text.
fn hammer(base: String, paths: Vec<String>) -> (tokio::task::JoinHandle<Vec<String>>, Arc<()>) {
    let running = Arc::new(());
    let token = Arc::downgrade(&running);
    let task = tokio::spawn(async move {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build();
        let client = client.expect("an HTTP client");
        let mut failures = Vec::new();
        while token.strong_count() > 0 {
            for path in &paths {
                match client.get(format!("{base}{path}")).send().await {
                    Ok(r) if r.status() == 200 => {}
                    Ok(r) => failures.push(format!("{path}: {}", r.status())),
                    Err(e) => failures.push(format!("{path}: {e}")),
                }
            }
            sleep(Duration::from_millis(10)).await;
        }
        failures
    });
    (task, running)
}

/// A lab and a polestar in front of it whose admin token is `token`: the lab, the
/// configuration (to rewrite for reloads), the daemon and the master's name.
async fn with_token(token: &str) -> (Lab, PolestarConfig, Daemon, String) {
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    let mut config = PolestarConfig::for_lab(&lab);
    config.admin_token = Some(token.into());
    let d = Daemon::start(&config, &[], &[]).await;
    let master = lab.master_name().to_string();
    (lab, config, d, master)
}

/// The status of `POST /v1/masters/nosuch/failover` with `token`: 401 for a wrong token, 404
/// (the unknown master) once the token is accepted.
async fn admin_status(d: &Daemon, token: &str) -> u16 {
    let client = reqwest::Client::new();
    let response = client.post(d.url("/v1/masters/nosuch/failover")).bearer_auth(token).send();
    response.await.expect("POST failover").status().as_u16()
}

/// SIGHUP applies a new masters list (a new label) and admin token while HTTP keeps answering
/// (and /readyz stays 200); a listener change is logged as needing a restart; a bad file is
/// rejected with an error and the running configuration stays.
#[tokio::test]
async fn sighup_reloads_without_dropping_service() {
    let (_lab, mut config, d, master) = with_token("first").await;
    let paths = vec![format!("/v1/masters/{master}/primary"), "/readyz".to_string()];
    let (hammer, running) = hammer(format!("http://{}", d.http), paths);
    assert_eq!(admin_status(&d, "first").await, 404);

    config.admin_token = Some("second".into());
    config.masters = vec![(master.clone(), Some("cache".into()))];
    d.rewrite(&config);
    d.signal(Signal::SIGHUP);
    d.wait_message(STARTUP, |m| m.contains("applied masters, http.admin_token_file")).await;
    assert_eq!(admin_status(&d, "first").await, 401, "the old token is refused");
    assert_eq!(admin_status(&d, "second").await, 404, "the new token is accepted");
    let end = Instant::now() + FAILOVER;
    let url = d.url(&format!("/v1/masters/{master}"));
    loop {
        let m: Value = reqwest::get(&url).await.expect("GET").json().await.expect("JSON");
        if m["dns_name"] == "cache" && m["state"] == "ok" {
            break;
        }
        assert!(Instant::now() < end, "the new label is not served: {m}");
        sleep(POLL).await;
    }

    let moved = config.yaml(d.dir.path()).replace("127.0.0.1:0", "127.0.0.1:1");
    std::fs::write(&d.config_path, moved).expect("write");
    d.signal(Signal::SIGHUP);
    d.wait_message(STARTUP, |m| m.contains("http.listen changed; restart polestar")).await;

    std::fs::write(&d.config_path, "sentinels: []\nbogus: 1\n").expect("write");
    d.signal(Signal::SIGHUP);
    d.wait_message(STARTUP, |m| m.contains("reload rejected: keeping the running")).await;
    assert!(d.messages().iter().any(|m| m.contains("reload rejected") && m.contains("bogus")));
    assert_eq!(admin_status(&d, "second").await, 404, "the running token stays");
    let m: Value = reqwest::get(&url).await.expect("GET").json().await.expect("JSON");
    assert_eq!(m["dns_name"], "cache", "{m}");

    drop(running);
    let failures = hammer.await.expect("the hammer ends");
    assert!(failures.is_empty(), "service dropped during reloads: {failures:?}");
}

/// `POST /v1/masters/{name}/drain` of `node`: the status code.
async fn drain_status(d: &Daemon, master: &str, node: std::net::SocketAddr) -> u16 {
    let client = reqwest::Client::new();
    let url = d.url(&format!("/v1/masters/{master}/drain"));
    let body = serde_json::json!({ "node": node.to_string() });
    let response = client.post(url).bearer_auth("t").json(&body).send();
    response.await.expect("POST drain").status().as_u16()
}

/// SIGHUP applies the `drain` and `sweep` sections, not only masters (docs/operating.md, "Reload and stop"):
/// the manual drain refused while draining is off is accepted after a reload turns it on; and
/// client-side sweeping turned on by a later reload (draining off again) aborts this host's
/// connection to the old primary at the next failover: `ECONNABORTED`, which only a socket
/// destroyed by the kernel gives (a server closing or `CLIENT KILL` gives EOF or a reset). Needs
/// the permission to destroy sockets (root).
#[tokio::test]
async fn sighup_applies_drain_and_sweep_settings() {
    let (lab, mut config, d, master) = with_token("t").await;
    let old = lab.primary().await.expect("the primary");
    assert_eq!(drain_status(&d, &master, old).await, 409, "draining is off");

    config.drain = true;
    d.rewrite(&config);
    d.signal(Signal::SIGHUP);
    d.wait_message(STARTUP, |m| m.contains("applied drain")).await;
    d.wait_message(STARTUP, |m| m.contains("drain settings reloaded")).await;
    assert_eq!(drain_status(&d, &master, old).await, 200, "the reloaded drain settings apply");

    config.drain = false;
    config.extra = "sweep:\n  remote: true\n".into();
    d.rewrite(&config);
    d.signal(Signal::SIGHUP);
    d.wait_message(STARTUP, |m| m.contains("applied drain, sweep")).await;
    d.wait_message(STARTUP, |m| m.contains("sweeping sockets on primary changes")).await;

    // An idle client of the old primary, as an application on this host would hold.
    let mut client = tokio::net::TcpStream::connect(old).await.expect("connect to the primary");
    lab.failover().await.expect("SENTINEL FAILOVER");
    let new = lab.wait_for_primary_change(old, FAILOVER * 2).await.expect("a new primary");
    let mut buf = [0u8; 64];
    let read = tokio::io::AsyncReadExt::read(&mut client, &mut buf);
    let ended = tokio::time::timeout(FAILOVER, read).await.expect("the connection is cut in time");
    let kind = ended.as_ref().map_err(std::io::Error::kind);
    assert_eq!(kind.err(), Some(std::io::ErrorKind::ConnectionAborted), "{ended:?}");
    let events: Value =
        reqwest::get(d.url("/v1/events")).await.expect("GET").json().await.expect("JSON");
    let swept = events
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| e["kind"] == "sweep" && e["side"] == "remote" && e["node"] == old.to_string());
    assert!(swept, "no sweep event for {old} after the switch to {new}: {events}");
}

/// A reload that changes the Sentinels also changes where `POST .../failover` goes: with only
/// an unreachable Sentinel left, the request answers 503 naming it, instead of failing over
/// through the Sentinels of the old file.
#[tokio::test]
async fn sighup_moves_planned_failovers_to_the_new_sentinels() {
    let (_lab, mut config, d, master) = with_token("t").await;

    config.sentinels = vec!["127.0.0.1:1".into()];
    d.rewrite(&config);
    d.signal(Signal::SIGHUP);
    d.wait_message(STARTUP, |m| m.contains("applied sentinels")).await;
    let url = d.url(&format!("/v1/masters/{master}/failover"));
    let response = reqwest::Client::new().post(url).bearer_auth("t").send().await.expect("POST");
    let status = response.status().as_u16();
    let body = response.text().await.expect("the body");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("127.0.0.1:1"), "{body}");
}

/// `INFO sentinel` of the Sentinel at `addr`.
async fn sentinel_info(addr: std::net::SocketAddr) -> String {
    polestar_lab::query(addr, redis::cmd("INFO").arg("sentinel")).await.unwrap_or_default()
}

/// A Sentinel in TILT mode (for 30 s after its process was stopped) answers `OK` to
/// `SENTINEL FAILOVER` and does nothing until TILT ends: `POST .../failover` asks the next
/// Sentinel instead, and the failover happens at once.
#[tokio::test]
async fn planned_failovers_skip_a_sentinel_in_tilt_mode() {
    let (lab, _config, d, master) = with_token("t").await;
    let sentinels = lab.sentinel_addrs();
    // Sentinel 0, first in the file, stalls for longer than its 2 s TILT threshold.
    lab.hang_sentinel(0).expect("SIGSTOP");
    sleep(Duration::from_millis(2500)).await;
    lab.unhang_sentinel(0).expect("SIGCONT");
    let end = Instant::now() + STARTUP;
    while !sentinel_info(sentinels[0]).await.contains("sentinel_tilt:1") {
        assert!(Instant::now() < end, "Sentinel 0 never entered TILT mode");
        sleep(POLL).await;
    }
    let old = lab.primary().await.expect("the primary");
    let url = d.url(&format!("/v1/masters/{master}/failover"));
    let response = reqwest::Client::new().post(url).bearer_auth("t").send().await.expect("POST");
    assert_eq!(response.status().as_u16(), 202);
    let body: Value = response.json().await.expect("JSON");
    assert_ne!(
        body["sentinel"],
        sentinels[0].to_string(),
        "the Sentinel in TILT was asked: {body}"
    );
    // Well before Sentinel 0 leaves TILT (30 s after it entered it).
    lab.wait_for_primary_change(old, Duration::from_secs(15)).await.expect("a failover");
}
