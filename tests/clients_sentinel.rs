//! Sentinel-aware client libraries with the settings docs/using.md ("Sentinel protocol endpoint")
//! and docs/operating.md ("Client settings that matter") give, through polestar's Sentinel endpoint
//! on a planned failover: redis-py's `Sentinel.master_for` with its default (no retry inside
//! redis-py), with the redialing connection class and retry of docs/operating.md, and with the
//! by-name retry alone (the advice that used to be given: measured, not promised), and node-redis
//! 5's `createSentinel` with its defaults. And the two settings docs/operating.md warns about, each
//! beside the advice: redis-py's `single_connection_client=True` (planned failover) and ioredis's
//! default `disconnectTimeout` (hung primary).
//!
//! Each client prints `ack <seq> <unix-ms> <port>` / `err ...` lines (tests/clients/
//! sentinel_writer.py, sentinel_writer_node_redis.js). Each run prints `CLIENTS_SENTINEL ...`
//! lines and appends one JSON row per client to `target/client-results/sentinel.jsonl`.

use crate::common::{Env, FAILOVER, PolestarConfig, collect_lines, lock};

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use polestar_lab::{Lab, LabOptions, query};
use tokio::time::{Instant, sleep};

/// docs/operating.md's promise for the settings it recommends: on the new primary within this of the
/// promotion (the new primary first answering `ROLE` master).
const BACK: Duration = Duration::from_secs(1);

pub(crate) struct Client {
    pub(crate) label: &'static str,
    /// The settings, as the "Tested with" table of docs/tested.md names them.
    pub(crate) settings: &'static str,
    /// The writer script in tests/clients and its settings argument.
    script: &'static str,
    arg: Option<&'static str>,
    /// `lib=NAME` for the script: a previous major (`redis6`, `ioredis5`, `redis5`), or the
    /// current release when `None`.
    lib: Option<&'static str>,
    /// Held to [`BACK`] and to no error (`quiet`) or at most one surfaced error.
    promised: bool,
    quiet: bool,
}

const PY: &str = "sentinel_writer.py";
const IOREDIS: &str = "sentinel_writer.js";
const IOREDIS_ADVISED: &str = "failoverDetector, disconnectTimeout=50, connectTimeout=500, commandTimeout=500, retryStrategy=10 ms, sentinelRetryStrategy=10 ms, maxRetriesPerRequest=2, reconnectOnError(READONLY)";
const IOREDIS_DEFAULT_DISCONNECT: &str = "failoverDetector, disconnectTimeout default (2000), connectTimeout=500, commandTimeout=500, retryStrategy=10 ms, sentinelRetryStrategy=10 ms, maxRetriesPerRequest=2, reconnectOnError(READONLY)";

/// docs/operating.md's warnings, each beside its advice (`promised` false: the warned-about setting).
pub(crate) const WARNED: [Client; 4] = [
    Client {
        label: "redis-py master_for single_connection_client",
        settings: "Redis(connection_pool=master_for(name).connection_pool, single_connection_client=True)",
        script: PY,
        arg: Some("single"),
        lib: None,
        promised: false,
        quiet: false,
    },
    Client {
        label: "redis-py master_for default",
        settings: "master_for(name)",
        script: PY,
        arg: Some("default"),
        lib: None,
        promised: true,
        quiet: false,
    },
    Client {
        label: "ioredis sentinels disconnectTimeout default",
        settings: IOREDIS_DEFAULT_DISCONNECT,
        script: IOREDIS,
        arg: Some("default-disconnect"),
        lib: None,
        promised: false,
        quiet: false,
    },
    Client {
        label: "ioredis sentinels advised",
        settings: IOREDIS_ADVISED,
        script: IOREDIS,
        arg: None,
        lib: None,
        promised: true,
        quiet: false,
    },
];

pub(crate) const CLIENTS: [Client; 7] = [
    Client {
        label: "redis-py master_for default",
        script: "sentinel_writer.py",
        arg: Some("default"),
        lib: None,
        settings: "master_for(name)",
        promised: true,
        quiet: false,
    },
    Client {
        label: "redis-py master_for redial+retry",
        script: "sentinel_writer.py",
        arg: Some("redial"),
        lib: None,
        settings: "connection_class=SentinelRedialingConnection, retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 10)",
        promised: true,
        quiet: true,
    },
    Client {
        label: "redis-py master_for retry only",
        script: "sentinel_writer.py",
        arg: Some("advised"),
        lib: None,
        settings: "retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 10)",
        promised: false,
        quiet: false,
    },
    Client {
        label: "node-redis createSentinel default",
        script: "sentinel_writer_node_redis.js",
        arg: None,
        lib: None,
        settings: "createSentinel({name, sentinelRootNodes})",
        promised: true,
        quiet: false,
    },
    // The previous majors, which applications still run.
    Client {
        label: "redis-py 6 master_for redial+retry",
        script: "sentinel_writer.py",
        arg: Some("redial"),
        lib: Some("redis6"),
        settings: "connection_class=SentinelRedialingConnection, retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 10)",
        promised: true,
        quiet: true,
    },
    Client {
        label: "ioredis 5 sentinels advised",
        settings: IOREDIS_ADVISED,
        script: IOREDIS,
        arg: None,
        lib: Some("ioredis5"),
        promised: true,
        quiet: false,
    },
    Client {
        label: "node-redis 5 createSentinel default",
        script: "sentinel_writer_node_redis.js",
        arg: None,
        lib: Some("redis5"),
        settings: "createSentinel({name, sentinelRootNodes})",
        promised: true,
        quiet: false,
    },
];

struct Writer {
    key: String,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

impl Writer {
    fn start(index: usize, client: &Client, endpoint: SocketAddr, master: &str) -> Writer {
        let dir = clients_dir();
        let key = format!("writes:{index}");
        let program = match client.script.ends_with(".js") {
            true => PathBuf::from("node"),
            false => dir.join("venv/bin/python"),
        };
        assert!(
            dir.join("venv/bin/python").exists() && dir.join("node_modules/redis").is_dir(),
            "the client libraries are missing: run `bash tests/deps.sh`"
        );
        let mut args = vec![path(&dir.join(client.script))];
        args.extend([endpoint.to_string(), master.to_string(), key.clone(), "60".into()]);
        args.extend(client.arg.map(String::from));
        args.extend(client.lib.map(|lib| format!("lib={lib}")));
        let mut child = Command::new(program)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the client starts");
        let lines = Arc::new(Mutex::new(Vec::new()));
        collect_lines(child.stdout.take().expect("stdout is piped"), lines.clone());
        Writer { key, child, lines }
    }

    /// `(seq, ms, port)` of every acknowledged write.
    fn acks(&self) -> Vec<(u64, u64, u16)> {
        lock(&self.lines)
            .iter()
            .filter_map(|l| {
                let mut w = l.strip_prefix("ack ")?.split(' ');
                Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?, w.next()?.parse().ok()?))
            })
            .collect()
    }

    /// `<lib> <version>` from the client's `version` line.
    fn version(&self) -> String {
        self.said("version ")
    }

    /// `<runtime> <version>` from the client's `runtime` line (`Node.js 20.20.0`).
    fn runtime(&self) -> String {
        self.said("runtime ")
    }

    fn said(&self, prefix: &str) -> String {
        let lines = lock(&self.lines);
        lines.iter().find_map(|l| l.strip_prefix(prefix)).unwrap_or("?").to_string()
    }

    fn errors_after(&self, ms: u64) -> usize {
        let lines = lock(&self.lines);
        let ms_of = |l: &str| l.split(' ').nth(2).and_then(|m| m.parse::<u64>().ok());
        lines.iter().filter(|l| l.starts_with("err ") && ms_of(l).is_some_and(|m| m >= ms)).count()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// When one of `candidates` first answers `ROLE` master (polled every 5 ms).
async fn watch_promotion(candidates: Vec<SocketAddr>) -> Option<(u64, SocketAddr)> {
    let end = Instant::now() + FAILOVER * 2;
    while Instant::now() < end {
        for addr in &candidates {
            if let Ok(redis::Value::Array(items)) = query(*addr, &redis::cmd("ROLE")).await
                && matches!(items.first(), Some(redis::Value::BulkString(b)) if b == b"master")
            {
                return Some((now_ms(), *addr));
            }
        }
        sleep(Duration::from_millis(5)).await;
    }
    None
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Planned,
    /// SIGSTOP: no FIN, no RST; the loopback lab has no socket sweeper.
    Hung,
}

/// What one client did: ms from the promotion to its first write on the new primary (`None`:
/// not within the watch), and the failures of its promise.
struct Outcome {
    back: Option<u64>,
    failures: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_pool_clients_with_the_readme_settings_are_back_within_a_second_of_a_planned_failover()
 {
    let outcomes = clients_through(Fault::Planned, &CLIENTS).await;
    let failures: Vec<String> = outcomes.into_iter().flat_map(|o| o.failures).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// docs/operating.md: a redis-py client made with `single_connection_client=True` reconnects to the
/// address it had (only a connection taken from the pool asks the Sentinels), so after a
/// planned failover it stays on the old, demoted primary (`READONLY`, nothing acknowledged
/// there); the pool's default is on the new primary within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_single_connection_client_stays_on_the_old_primary_where_the_pool_moves() {
    let outcomes = clients_through(Fault::Planned, &WARNED[..2]).await;
    let (single, pooled) = (&outcomes[0], &outcomes[1]);
    assert!(pooled.failures.is_empty(), "{}", pooled.failures.join("\n"));
    assert!(single.failures.is_empty(), "{}", single.failures.join("\n"));
    assert_eq!(single.back, None, "single_connection_client reached the new primary");
}

/// docs/operating.md: ioredis closes a connection to a hung primary on `+switch-master` with a FIN
/// and waits `disconnectTimeout` (2 s by default) for the close before it reconnects; with
/// `disconnectTimeout: 50` it moves at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ioredis_waits_its_disconnect_timeout_on_a_hung_primary_unless_it_is_set_low() {
    let outcomes = clients_through(Fault::Hung, &WARNED[2..]).await;
    let (slow, advised) = (&outcomes[0], &outcomes[1]);
    assert!(advised.failures.is_empty(), "{}", advised.failures.join("\n"));
    assert!(slow.failures.is_empty(), "{}", slow.failures.join("\n"));
    let (slow, advised) = (slow.back.unwrap_or(u64::MAX), advised.back.unwrap_or(u64::MAX));
    assert!(
        slow >= advised.saturating_add(1000),
        "the default disconnectTimeout cost {slow} ms against {advised} ms: not docs/operating.md's 2 s wait"
    );
}

/// `clients` write through polestar's endpoint through `fault`; every acknowledged write must be
/// on the new primary, and a `promised` client back within [`BACK`] of the promotion.
async fn clients_through(fault: Fault, clients: &[Client]) -> Vec<Outcome> {
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    let mut config = PolestarConfig::for_lab(&lab);
    config.drain = true;
    config.extra = "sentinel_api:\n  listen: [\"127.0.0.1:0\"]\n".to_string();
    let env = Env::with_config(lab, &config).await;
    let api = env.ps.find_addr("listening for Sentinel API on ").expect("the endpoint");
    let master = env.master_name();
    let writers: Vec<Writer> =
        clients.iter().enumerate().map(|(i, c)| Writer::start(i, c, api, &master)).collect();
    for (w, c) in writers.iter().zip(clients) {
        env.wait_until(Duration::from_secs(30), &format!("{} writing", c.label), || async {
            let n = w.acks().len();
            anyhow::ensure!(n >= 20, "{n} acks");
            Ok(())
        })
        .await;
    }
    let old = env.lab.primary().await.expect("the primary");
    let candidates = env.lab.node_addrs().into_iter().filter(|a| *a != old).collect();
    let promotion = tokio::spawn(watch_promotion(candidates));
    sleep(Duration::from_millis(20)).await;
    let stopped = env.lab.index_of(old).expect("the primary is a lab node");
    match fault {
        Fault::Planned => env.lab.failover().await.expect("SENTINEL FAILOVER"),
        Fault::Hung => env.lab.stop_node(stopped).expect("SIGSTOP the primary"),
    }
    let new = env.lab.wait_for_primary_change(old, FAILOVER * 2).await;
    let new = new.unwrap_or_else(|e| env.fail(&format!("{e:#}")));
    let (promoted_ms, promoted) = promotion.await.expect("the watcher").expect("a promotion");
    assert_eq!(promoted, new);
    // Every client back (or 8 s, for the one that is measured only), then 0.5 s more writes.
    let deadline = Instant::now() + Duration::from_secs(8);
    let first_on_new =
        |w: &Writer| w.acks().iter().find(|a| a.2 == new.port() && a.1 >= promoted_ms).map(|a| a.1);
    while Instant::now() < deadline && !writers.iter().all(|w| first_on_new(w).is_some()) {
        sleep(Duration::from_millis(50)).await;
    }
    sleep(Duration::from_millis(500)).await;
    let mut writers = writers;
    for w in &mut writers {
        let _ = w.child.kill();
        let _ = w.child.wait();
    }
    if fault == Fault::Hung {
        let _ = env.lab.cont_node(stopped);
    }
    // CLIENTS_SENTINEL_DUMP=<dir>: the failover's timeline for tests/clients/failover_timeline.py
    // (polestar's log and events, every lab process's log, every client line).
    if let Ok(dir) = std::env::var("CLIENTS_SENTINEL_DUMP") {
        let dir = PathBuf::from(dir);
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(dir.join("polestar.log"), env.ps.log_tail(1_000_000));
        if let Ok((_, ev)) = env.ps.get_json("/v1/events").await {
            let _ = std::fs::write(dir.join("events.json"), ev.to_string());
        }
        let mut logs = String::new();
        for e in walk(env.lab.dir()) {
            if e.file_name().is_some_and(|n| n == "redis.log") {
                logs.push_str(&format!("==== {}\n", e.display()));
                logs.push_str(&std::fs::read_to_string(&e).unwrap_or_default());
            }
        }
        let _ = std::fs::write(dir.join("lab.log"), logs);
        let mut acks = String::new();
        for (w, c) in writers.iter().zip(clients) {
            acks.push_str(&format!("==== {}\n{}\n", c.label, lock(&w.lines).join("\n")));
        }
        let _ = std::fs::write(
            dir.join("acks.txt"),
            format!("promoted {promoted_ms} old {old} new {new}\n{acks}"),
        );
    }
    let info: String = query(new, redis::cmd("INFO").arg("server")).await.unwrap_or_default();
    let server = crate::client_results::server_version(&info);
    let mut outcomes = Vec::new();
    for (w, c) in writers.iter().zip(clients) {
        let mut failures = Vec::new();
        let stored: Vec<String> = query(new, redis::cmd("LRANGE").arg(&w.key).arg(0).arg(-1))
            .await
            .expect("LRANGE on the new primary");
        let stored: BTreeSet<u64> = stored.iter().filter_map(|s| s.parse().ok()).collect();
        let acks = w.acks();
        let lost_acks: Vec<&(u64, u64, u16)> =
            acks.iter().filter(|a| !stored.contains(&a.0)).collect();
        let lost = lost_acks.len();
        if lost > 0 {
            println!(
                "CLIENTS_SENTINEL {} lost (seq, ms, port) {lost_acks:?}; promotion at {promoted_ms}, old {old}, new {new}",
                c.label
            );
        }
        let back = first_on_new(w).map(|ms| ms.saturating_sub(promoted_ms));
        let errors = w.errors_after(promoted_ms.saturating_sub(3000));
        println!(
            "CLIENTS_SENTINEL {fault:?} {} via polestar: back {back:?} ms after the promotion, \
             {errors} errors surfaced, {lost} of {} acknowledged writes lost",
            c.label,
            acks.len()
        );
        crate::client_results::append(
            "sentinel.jsonl",
            &serde_json::json!({
                "client": c.label, "version": w.version(), "settings": c.settings,
                "runtime": w.runtime(), "server": server,
                "path": "polestar Sentinel endpoint",
                "fault": match fault { Fault::Planned => "planned", Fault::Hung => "hung primary" },
                "back_ms": back, "errors": errors, "lost": lost, "acked": acks.len(),
            }),
        );
        if lost > 0 {
            failures.push(format!("{}: {lost} acknowledged writes lost", c.label));
        }
        if c.promised && back.is_none_or(|ms| ms > BACK.as_millis() as u64) {
            failures.push(format!("{}: back {back:?} ms, promised {BACK:?}", c.label));
        }
        // A hung primary answers nothing: commands time out until the client moves.
        if c.promised && fault == Fault::Planned && errors > usize::from(!c.quiet) {
            failures.push(format!("{}: {errors} errors surfaced", c.label));
        }
        outcomes.push(Outcome { back, failures });
    }
    outcomes
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
        }
    }
    out
}
