//! The observability pack in `contrib/`: the alert rules pass their `promtool` unit tests,
//! the rules and the Grafana dashboard name only series a running polestar really exports,
//! and a real Prometheus scraping polestar fires the failover-not-possible alert for a real
//! fault and drops it after the cure.

use crate::common;
use crate::readiness as verdicts;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use polestar_lab::{Lab, LabOptions, free_service_port, query};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

use common::*;

fn contrib(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib").join(path)
}

#[test]
fn the_alert_rules_pass_their_promtool_unit_tests() {
    let rules = contrib("prometheus");
    for args in [
        &["check", "rules", "polestar.rules.yml"][..],
        &["test", "rules", "polestar.rules.test.yml"],
    ] {
        let out = Command::new("promtool").args(args).current_dir(&rules).output();
        let out = out.expect("promtool runs (tests/deps.sh installs Debian's prometheus)");
        assert!(out.status.success(), "promtool {args:?}: {}", shown(&out));
    }
}

/// Every `polestar_*` name in `text` (histogram suffixes taken off).
fn series_named(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("polestar_") {
        let tail = &rest[at..];
        let end =
            tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        let name = &tail[..end];
        let family = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s));
        names.insert(family.unwrap_or(name).to_string());
        rest = &tail[end..];
    }
    names
}

/// The `expr` of every rule and every dashboard target.
fn expressions() -> Vec<String> {
    let rules =
        std::fs::read_to_string(contrib("prometheus/polestar.rules.yml")).expect("the rules");
    let mut exprs: Vec<String> =
        rules.lines().filter_map(|l| l.trim().strip_prefix("expr:")).map(str::to_string).collect();
    let dashboard =
        std::fs::read_to_string(contrib("grafana/polestar.json")).expect("the dashboard");
    let dashboard: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            exprs.push(target["expr"].as_str().expect("an expr").to_string());
        }
    }
    exprs.extend(
        dashboard["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["query"].as_str().map(str::to_string)),
    );
    exprs
}

#[tokio::test]
async fn the_dashboard_and_rules_name_only_series_polestar_exports() {
    let lab = Lab::start(LabOptions::default()).await.expect("start the lab");
    let mut config = PolestarConfig::for_lab(&lab);
    config.dns = true;
    config.drain = true;
    let env = Env::with_config(lab, &config).await;
    env.failover().await;
    let exprs = expressions();
    assert!(exprs.len() >= 15, "rules and panels: {exprs:?}");
    let named: BTreeSet<String> = exprs.iter().flat_map(|e| series_named(e)).collect();
    assert!(
        named.contains("polestar_failover_ready")
            && named.contains("polestar_replica_lag_bytes")
            && named.contains("polestar_failover_seconds")
    );
    // A replica's lag is exported once a readiness round has learned one, from the published
    // primary (or the published replicas, never from replicas no majority named): the first
    // round after the first publication, which the failover may have started meanwhile.
    env.wait_until(FAILOVER, "every series named is exported", || async {
        let (status, _, metrics) = env.ps.get("/metrics").await?;
        anyhow::ensure!(status == 200, "GET /metrics: {status}");
        let exported: BTreeSet<String> = metrics
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect();
        let missing: Vec<&String> = named.difference(&exported).collect();
        anyhow::ensure!(missing.is_empty(), "named but not exported: {missing:?}\n{metrics}");
        Ok(())
    })
    .await;
}

/// A Prometheus server of its own: a temporary config and storage, a free loopback port.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Scrapes `target` every second with the repository's rules, `for:` shortened to 0s so
    /// the test need not wait out a production hold time (the expressions are the real ones).
    fn start(target: std::net::SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().expect("a temp dir");
        let rules =
            std::fs::read_to_string(contrib("prometheus/polestar.rules.yml")).expect("rules");
        let rules: String = rules
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("for:") {
                    l.split("for:").next().unwrap_or("").to_string() + "for: 0s"
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(dir.path().join("rules.yml"), rules).expect("write the rules");
        let config = format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\nrule_files: [rules.yml]\n\
             scrape_configs:\n  - job_name: polestar\n    static_configs: [{{ targets: [\"{target}\"] }}]\n"
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("write the config");
        let port = free_service_port().expect("a free port");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus (tests/deps.sh installs Debian's)");
        Prometheus { child, url: format!("http://127.0.0.1:{port}"), _dir: dir }
    }

    /// The alerts firing now for `name`, by their `master` label.
    async fn firing(&self, name: &str) -> anyhow::Result<Vec<String>> {
        let body: Value = reqwest::get(format!("{}/api/v1/alerts", self.url)).await?.json().await?;
        let alerts = body["data"]["alerts"].as_array().cloned().unwrap_or_default();
        Ok(alerts
            .iter()
            .filter(|a| a["labels"]["alertname"] == name && a["state"] == "firing")
            .map(|a| a["labels"]["master"].as_str().unwrap_or("").to_string())
            .collect())
    }
}

async fn set_priority(env: &Env, priority: &str) {
    let primary = env.lab.primary().await.expect("the primary");
    for node in env.lab.node_addrs().into_iter().filter(|n| *n != primary) {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg("replica-priority").arg(priority);
        query::<String>(node, &cmd).await.expect("CONFIG SET replica-priority");
    }
}

#[tokio::test]
async fn a_real_prometheus_fires_failover_not_possible_and_drops_it_after_the_cure() {
    let env = verdicts::start().await;
    let prometheus = Prometheus::start(env.ps.http);
    let master = env.master_name();
    let alert = "PolestarFailoverNotPossible";
    // Scraping and healthy: no alert.
    env.wait_until(Duration::from_secs(30), "prometheus answers, nothing firing", || async {
        anyhow::ensure!(prometheus.firing(alert).await?.is_empty(), "firing");
        let up: Value =
            reqwest::get(format!("{}/api/v1/query?query=up", prometheus.url)).await?.json().await?;
        anyhow::ensure!(up["data"]["result"][0]["value"][1] == "1", "up: {up}");
        Ok(())
    })
    .await;
    set_priority(&env, "0").await;
    let started = Instant::now();
    env.wait_until(Duration::from_secs(60), "the alert fires", || async {
        let v = verdicts::verdict(&env).await?;
        anyhow::ensure!(verdicts::blocked(&v, "no_promotable_replica"), "{v}");
        anyhow::ensure!(prometheus.firing(alert).await?.contains(&master), "not firing");
        Ok(())
    })
    .await;
    eprintln!(
        "readiness: {alert} firing {:.1}s after priority 0 was set",
        started.elapsed().as_secs_f64()
    );
    set_priority(&env, "100").await;
    let cured = Instant::now();
    env.wait_until(Duration::from_secs(60), "the alert is gone", || async {
        anyhow::ensure!(prometheus.firing(alert).await?.is_empty(), "still firing");
        Ok(())
    })
    .await;
    eprintln!(
        "readiness: {alert} gone {:.1}s after priority 100 was set",
        cured.elapsed().as_secs_f64()
    );
    sleep(Duration::from_millis(10)).await;
}

/// `polestar_failover_seconds{phase}` from `/metrics`: per phase, its `_sum` and `_count`.
async fn phases(env: &Env) -> BTreeMap<String, (f64, u64)> {
    let (status, _, metrics) = env.ps.get("/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200);
    phases_in(&metrics)
}

/// The same from the text of `/metrics`.
pub fn phases_in(metrics: &str) -> BTreeMap<String, (f64, u64)> {
    let mut out: BTreeMap<String, (f64, u64)> = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("polestar_failover_seconds_") else { continue };
        let Some((kind, rest)) = rest.split_once("{phase=\"") else { continue };
        let Some((phase, value)) = rest.split_once("\"} ") else { continue };
        let value = value.trim();
        match kind {
            "sum" => out.entry(phase.to_string()).or_default().0 = value.parse().expect("a sum"),
            "count" => out.entry(phase.to_string()).or_default().1 = value.parse().expect("count"),
            _ => {}
        }
    }
    out
}

/// Until every phase's count is `before`'s plus `grown` (1 or 0 per phase, in [`PHASES`]
/// order), and still so a second later (each failover is counted once); returns each phase's
/// time for this failover (the growth of its sum).
async fn phases_grown(
    env: &Env,
    before: &BTreeMap<String, (f64, u64)>,
    grown: [u64; 3],
    what: &str,
) -> [f64; 3] {
    let check = || async {
        let now = phases(env).await;
        let mut took = [0.0; 3];
        for (i, phase) in PHASES.iter().enumerate() {
            let (sum0, count0) = before.get(*phase).copied().unwrap_or_default();
            let (sum, count) = now.get(*phase).copied().unwrap_or_default();
            anyhow::ensure!(count == count0 + grown[i], "{what}: {phase} {count0} -> {count}");
            took[i] = sum - sum0;
        }
        Ok(took)
    };
    env.wait_until(FAILOVER * 2, what, check).await;
    sleep(Duration::from_secs(1)).await;
    env.wait_until(Duration::ZERO, &format!("{what}, a second later"), check).await
}

pub const PHASES: [&str; 3] = ["odown_to_flip", "selected_to_flip", "flip_to_drained"];

/// Connections to `node` that name themselves `held` and then wait; each task ends (true)
/// when the node closes it, or (false) after `limit`.
async fn held(node: std::net::SocketAddr, n: usize, limit: Duration) -> Vec<JoinHandle<bool>> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let mut stream = TcpStream::connect(node).await.expect("connect to the primary");
        stream.write_all(b"CLIENT SETNAME held\r\n").await.expect("SETNAME");
        let mut buf = [0u8; 64];
        let read = timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(n)) if n > 0), "SETNAME answered: {read:?}");
        tasks.push(tokio::spawn(async move {
            let closed = timeout(limit, async {
                loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            });
            closed.await.is_ok()
        }));
    }
    tasks
}

async fn all_cut(env: &Env, tasks: Vec<JoinHandle<bool>>, what: &str) {
    for task in tasks {
        if !task.await.unwrap_or(false) {
            env.fail(&format!("{what}: a client of the old primary was left open"));
        }
    }
}

/// Each failover is timed once per phase it went through: a planned one has no `+odown`
/// (`selected_to_flip` and `flip_to_drained` grow by one), one whose primary is stopped
/// (SIGSTOP) grows all three; `flip_to_drained` ends when the last client of the old primary
/// is cut, after it came back (SIGCONT). The times are printed (`phases: ...`).
#[tokio::test]
async fn each_failover_phase_is_timed_once_in_polestar_failover_seconds() {
    let lab = Lab::start(LabOptions::default()).await.expect("start the lab");
    let mut config = PolestarConfig::for_lab(&lab);
    config.drain = true;
    let env = Env::with_config(lab, &config).await;
    env.wait_reachable(3, STARTUP).await;
    let limit = FAILOVER * 4;

    // Planned.
    let before = phases(&env).await;
    assert_eq!(before.keys().map(String::as_str).collect::<Vec<_>>(), {
        let mut p = PHASES.to_vec();
        p.sort_unstable();
        p
    });
    let old = env.lab.primary().await.expect("the primary");
    let clients = held(old, 5, limit).await;
    let started = Instant::now();
    env.failover().await;
    let took = phases_grown(&env, &before, [0, 1, 1], "a planned failover").await;
    all_cut(&env, clients, "planned").await;
    let whole = started.elapsed().as_secs_f64();
    eprintln!("phases: planned: selected_to_flip {:.3}s, flip_to_drained {:.3}s", took[1], took[2]);
    assert!(took[1] > 0.0 && took[1] < whole, "selected_to_flip {} of {whole}s", took[1]);
    assert!(took[2] > 0.0 && took[2] < whole, "flip_to_drained {} of {whole}s", took[2]);

    // Unplanned: the primary stopped, let go once the new one is published.
    env.lab.wait_converged(STARTUP).await.expect("the Sentinels converge");
    let before = phases(&env).await;
    let old = env.lab.primary().await.expect("the primary");
    let i = env.lab.index_of(old).expect("a lab node");
    let clients = held(old, 5, limit).await;
    let stopped = Instant::now();
    env.lab.stop_node(i).expect("SIGSTOP the primary");
    let new = env.lab.wait_for_primary_change(old, FAILOVER * 2).await;
    let new = new.unwrap_or_else(|e| env.fail(&format!("{e:#}")));
    env.wait_api_primary(new, FAILOVER).await;
    let flipped = stopped.elapsed().as_secs_f64();
    sleep(Duration::from_millis(500)).await;
    let resumed = Instant::now();
    env.lab.cont_node(i).expect("SIGCONT the old primary");
    let took = phases_grown(&env, &before, [1, 1, 1], "a failover of a stopped primary").await;
    all_cut(&env, clients, "unplanned").await;
    let whole = stopped.elapsed().as_secs_f64();
    eprintln!(
        "phases: stopped primary: odown_to_flip {:.3}s, selected_to_flip {:.3}s, flip_to_drained {:.3}s (stop to published {flipped:.3}s)",
        took[0], took[1], took[2]
    );
    // The +odown comes after down-after (1 s) and the flip before the API showed it; the
    // leader is elected after the +odown; the old primary's clients are cut after it resumed.
    assert!(took[0] > 0.0 && took[0] < flipped, "odown_to_flip {} of {flipped}s", took[0]);
    let (odown, selected) = (took[0], took[1]);
    assert!(selected > 0.0 && selected <= odown + 1e-3, "selected_to_flip {selected} of {odown}");
    // The drain side times from when it got the flip, a moment after the API showed it.
    let paused = (resumed - stopped).as_secs_f64() - flipped - 0.25;
    assert!(took[2] >= paused && took[2] < whole, "flip_to_drained {} ({paused}s)", took[2]);
}

/// `polestar_old_primary_clients{master}` during a drain: a writer pinned to the old primary's
/// address (it reconnects whenever it is cut and writes again, getting `READONLY`) is found
/// by every stale-writer sweep through `drain.window`, so the gauge shows it; once the writer
/// stops, the gauge goes back to 0.
#[tokio::test]
async fn a_writer_pinned_to_the_old_primary_shows_in_old_primary_clients() {
    let lab = Lab::start(LabOptions::default()).await.expect("start the lab");
    let mut config = PolestarConfig::for_lab(&lab);
    config.drain = true;
    config.drain_settings = vec!["window: 20s".into()];
    let env = Env::with_config(lab, &config).await;
    env.wait_reachable(3, STARTUP).await;
    let master = env.master_name();
    let gauge = format!("polestar_old_primary_clients{{master=\"{master}\"}} ");
    let value = || async {
        let (_, _, metrics) = env.ps.get("/metrics").await.expect("GET /metrics");
        let line = metrics.lines().find_map(|l| l.strip_prefix(gauge.as_str()).map(str::to_string));
        line.and_then(|v| v.trim().parse::<f64>().ok())
    };
    assert_eq!(value().await, Some(0.0), "the series exists at 0 before any failover");

    let old = env.lab.primary().await.expect("the primary");
    env.failover().await;
    let stop = Instant::now() + Duration::from_secs(12);
    let writer = tokio::spawn(pinned_writer(old, stop));
    let mut seen = 0.0f64;
    while Instant::now() < stop && seen < 1.0 {
        seen = seen.max(value().await.unwrap_or(0.0));
        sleep(Duration::from_millis(100)).await;
    }
    let writes = writer.await.expect("the writer task");
    assert!(seen >= 1.0, "the pinned writer never showed ({writes} writes sent)");
    env.wait_until(FAILOVER * 2, "the gauge back at 0", || async {
        let now = value().await;
        anyhow::ensure!(now == Some(0.0), "{now:?}");
        Ok(())
    })
    .await;
    // The window is over and the writer had gone before it ended: nothing was left behind.
    assert_eq!(stale_clients(&env).await, Some(0.0), "a writer gone within the window counted");
    assert!(stale_events(&env).await.is_empty(), "a stale_clients_left event");
}

/// `polestar_old_primary_stale_clients_total` of the lab's master.
async fn stale_clients(env: &Env) -> Option<f64> {
    let (_, _, metrics) = env.ps.get("/metrics").await.ok()?;
    let series =
        format!("polestar_old_primary_stale_clients_total{{master=\"{}\"}} ", env.master_name());
    let line = metrics.lines().find_map(|l| l.strip_prefix(series.as_str()).map(str::to_string));
    line.and_then(|v| v.trim().parse().ok())
}

/// The `stale_clients_left` events.
async fn stale_events(env: &Env) -> Vec<Value> {
    let (status, events) = env.ps.get_json("/v1/events").await.expect("GET /v1/events");
    assert_eq!(status, 200, "{events}");
    let all = events.as_array().cloned().unwrap_or_default();
    all.into_iter().filter(|e| e["kind"] == "stale_clients_left").collect()
}

/// A writer pinned to the old primary's address past the end of `drain.window` (it reconnects
/// whenever it is cut and writes again, getting `READONLY`) is a client left behind: once the
/// window ends, `polestar_old_primary_stale_clients_total` counts it, a `stale_clients_left`
/// event names the node, and a real Prometheus with the repository's rules fires
/// `PolestarStaleClientsOnOldPrimary` (not during the window, while polestar still cuts it).
#[tokio::test]
async fn a_writer_still_pinned_when_the_drain_window_ends_fires_stale_clients_on_old_primary() {
    let lab = Lab::start(LabOptions::default()).await.expect("start the lab");
    let mut config = PolestarConfig::for_lab(&lab);
    config.drain = true;
    let window = Duration::from_secs(8);
    config.drain_settings = vec!["window: 8s".into()];
    let env = Env::with_config(lab, &config).await;
    env.wait_reachable(3, STARTUP).await;
    let prometheus = Prometheus::start(env.ps.http);
    let alert = "PolestarStaleClientsOnOldPrimary";
    let master = env.master_name();
    env.wait_until(Duration::from_secs(30), "prometheus scrapes the counter at 0", || async {
        let query = "polestar_old_primary_stale_clients_total";
        let url = format!("{}/api/v1/query?query={query}", prometheus.url);
        let got: Value = reqwest::get(url).await?.json().await?;
        anyhow::ensure!(got["data"]["result"][0]["value"][1] == "0", "{got}");
        Ok(())
    })
    .await;
    assert_eq!(stale_clients(&env).await, Some(0.0), "the series exists at 0 from the start");

    let old = env.lab.primary().await.expect("the primary");
    env.failover().await;
    let flipped = Instant::now();
    let stop = flipped + window + Duration::from_secs(5);
    let writer = tokio::spawn(pinned_writer(old, stop));
    // Within the window polestar cuts it: nothing is left behind yet.
    sleep(Duration::from_secs(3)).await;
    assert!(flipped.elapsed() < window, "the test was too slow to look within the window");
    assert_eq!(stale_clients(&env).await, Some(0.0), "counted before the window ended");
    assert!(prometheus.firing(alert).await.expect("alerts").is_empty(), "firing in the window");

    env.wait_until(window + FAILOVER, "the writer counted as the window ended", || async {
        let n = stale_clients(&env).await;
        anyhow::ensure!(n.is_some_and(|n| n >= 1.0), "{n:?}");
        Ok(())
    })
    .await;
    let counted_after = flipped.elapsed().as_secs_f64();
    let events = stale_events(&env).await;
    let named =
        events.iter().any(|e| e["node"] == old.to_string() && e["clients"].as_u64() >= Some(1));
    assert!(named, "no stale_clients_left event for {old}: {events:?}");
    env.wait_until(Duration::from_secs(60), "the alert fires", || async {
        anyhow::ensure!(prometheus.firing(alert).await?.contains(&master), "not firing");
        Ok(())
    })
    .await;
    eprintln!(
        "observability: stale clients counted {counted_after:.1}s after the flip (window {}s), {alert} firing {:.1}s after it",
        window.as_secs(),
        flipped.elapsed().as_secs_f64()
    );
    writer.await.expect("the writer task");
}

/// `SET` to `node` every 50 ms until `stop`, reconnecting whenever the connection is cut;
/// returns how many were sent.
async fn pinned_writer(node: std::net::SocketAddr, stop: Instant) -> u64 {
    let mut sent = 0;
    while Instant::now() < stop {
        let Ok(Ok(mut stream)) = timeout(Duration::from_secs(1), TcpStream::connect(node)).await
        else {
            sleep(Duration::from_millis(50)).await;
            continue;
        };
        let mut buf = [0u8; 256];
        while Instant::now() < stop {
            if stream.write_all(b"SET pinned 1\r\n").await.is_err() {
                break;
            }
            sent += 1;
            match timeout(Duration::from_secs(2), stream.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => sleep(Duration::from_millis(50)).await,
                _ => break,
            }
        }
    }
    sent
}
