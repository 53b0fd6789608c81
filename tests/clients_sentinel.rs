//! Sentinel-aware client libraries with the settings the README gives (issue 21), through
//! polestar's Sentinel endpoint on a planned failover: redis-py's `Sentinel.master_for` with its
//! default (no retry inside redis-py), with the README's redialing connection class and retry,
//! and with the by-name retry alone (the advice that used to be given: measured, not promised),
//! and node-redis 5's `createSentinel` with its defaults.
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

use polestar::lab::{Lab, LabOptions, query};
use tokio::time::{Instant, sleep};

/// The README's promise for the settings it recommends: on the new primary within this of the
/// promotion (the new primary first answering `ROLE` master).
const BACK: Duration = Duration::from_secs(1);

pub(crate) struct Client {
    pub(crate) label: &'static str,
    /// The settings, as the README's "Tested with" table names them.
    settings: &'static str,
    /// Held to [`BACK`] and to no error (`quiet`) or at most one surfaced error.
    promised: bool,
    quiet: bool,
}

pub(crate) const CLIENTS: [Client; 4] = [
    Client {
        label: "redis-py master_for default",
        settings: "master_for(name)",
        promised: true,
        quiet: false,
    },
    Client {
        label: "redis-py master_for redial+retry",
        settings: "connection_class=SentinelRedialingConnection, retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 10)",
        promised: true,
        quiet: true,
    },
    Client {
        label: "redis-py master_for retry only",
        settings: "retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 10)",
        promised: false,
        quiet: false,
    },
    Client {
        label: "node-redis createSentinel default",
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
    fn start(index: usize, endpoint: SocketAddr, master: &str) -> Writer {
        let dir = clients_dir();
        let key = format!("writes:{index}");
        let python = dir.join("venv/bin/python");
        let py = dir.join("sentinel_writer.py");
        let (program, mut args): (PathBuf, Vec<String>) = match index {
            3 => (PathBuf::from("node"), vec![path(&dir.join("sentinel_writer_node_redis.js"))]),
            _ => (python, vec![path(&py)]),
        };
        assert!(
            dir.join("venv/bin/python").exists() && dir.join("node_modules/redis").is_dir(),
            "the client libraries are missing: run `bash tests/deps.sh`"
        );
        args.extend([endpoint.to_string(), master.to_string(), key.clone(), "60".into()]);
        match index {
            0 => args.push("default".into()),
            1 => args.push("redial".into()),
            2 => args.push("advised".into()),
            _ => {}
        }
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
        let lines = lock(&self.lines);
        lines.iter().find_map(|l| l.strip_prefix("version ")).unwrap_or("?").to_string()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_pool_clients_with_the_readme_settings_are_back_within_a_second_of_a_planned_failover()
 {
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    let mut config = PolestarConfig::for_lab(&lab);
    config.drain = true;
    config.extra = "sentinel_api:\n  listen: [\"127.0.0.1:0\"]\n".to_string();
    let env = Env::with_config(lab, &config).await;
    let api = env.ps.find_addr("listening for Sentinel API on ").expect("the endpoint");
    let master = env.master_name();
    let writers: Vec<Writer> = (0..CLIENTS.len()).map(|i| Writer::start(i, api, &master)).collect();
    for (w, c) in writers.iter().zip(&CLIENTS) {
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
    env.lab.failover().await.expect("SENTINEL FAILOVER");
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
    let mut failures = Vec::new();
    for (w, c) in writers.iter().zip(&CLIENTS) {
        let stored: Vec<String> = query(new, redis::cmd("LRANGE").arg(&w.key).arg(0).arg(-1))
            .await
            .expect("LRANGE on the new primary");
        let stored: BTreeSet<u64> = stored.iter().filter_map(|s| s.parse().ok()).collect();
        let acks = w.acks();
        let lost = acks.iter().filter(|a| !stored.contains(&a.0)).count();
        let back = first_on_new(w).map(|ms| ms.saturating_sub(promoted_ms));
        let errors = w.errors_after(promoted_ms.saturating_sub(3000));
        println!(
            "CLIENTS_SENTINEL planned {} via polestar: back {back:?} ms after the promotion, \
             {errors} errors surfaced, {lost} of {} acknowledged writes lost",
            c.label,
            acks.len()
        );
        crate::client_results::append(
            "sentinel.jsonl",
            &serde_json::json!({
                "client": c.label, "version": w.version(), "settings": c.settings,
                "path": "polestar Sentinel endpoint", "fault": "planned",
                "back_ms": back, "errors": errors, "lost": lost, "acked": acks.len(),
            }),
        );
        if lost > 0 {
            failures.push(format!("{}: {lost} acknowledged writes lost", c.label));
        }
        if c.promised && back.is_none_or(|ms| ms > BACK.as_millis() as u64) {
            failures.push(format!("{}: back {back:?} ms, promised {BACK:?}", c.label));
        }
        if c.promised && errors > usize::from(!c.quiet) {
            failures.push(format!("{}: {errors} errors surfaced", c.label));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
