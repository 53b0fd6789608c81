//! `/metrics` after a real failover, read with a Prometheus text-format parser: every metric the
//! HTTP API table of docs/using.md lists has its HELP and TYPE, and the values agree with the API
//! and the lab.

use crate::common;

use std::collections::BTreeMap;

use polestar_lab::{Lab, LabOptions};

use common::*;

/// One sample: metric name, labels, value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed exposition: HELP and TYPE by family, and every sample.
#[derive(Debug, Default)]
struct Exposition {
    help: BTreeMap<String, String>,
    kind: BTreeMap<String, String>,
    samples: Vec<Sample>,
}

impl Exposition {
    /// Parses the text format strictly: any line it does not understand is an error.
    fn parse(text: &str) -> anyhow::Result<Self> {
        let mut out = Exposition::default();
        for (i, line) in text.lines().enumerate() {
            let fail = |why: &str| anyhow::anyhow!("line {}: {why}: {line:?}", i + 1);
            if line.trim().is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').ok_or_else(|| fail("HELP"))?;
                out.help.insert(name.into(), help.replace("\\n", "\n").replace("\\\\", "\\"));
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').ok_or_else(|| fail("TYPE"))?;
                let known = ["counter", "gauge", "histogram", "summary", "untyped"];
                anyhow::ensure!(known.contains(&kind), fail("unknown type"));
                out.kind.insert(name.into(), kind.into());
            } else if line.starts_with('#') {
                continue;
            } else {
                out.samples.push(sample(line).map_err(|e| fail(&e))?);
            }
        }
        Ok(out)
    }

    /// Samples of `name` whose labels include every `(key, value)` of `with`.
    fn find(&self, name: &str, with: &[(&str, &str)]) -> Vec<&Sample> {
        let matches = |s: &&Sample| {
            s.name == name
                && with.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        };
        self.samples.iter().filter(matches).collect()
    }

    /// The one value of `name` with labels `with`.
    fn value(&self, name: &str, with: &[(&str, &str)]) -> anyhow::Result<f64> {
        match self.find(name, with).as_slice() {
            [one] => Ok(one.value),
            other => anyhow::bail!("{name}{with:?}: {} samples: {other:?}", other.len()),
        }
    }
}

/// `name{k="v",...} value [timestamp]`.
fn sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    if name.is_empty() || !name.chars().all(valid) {
        return Err(format!("bad metric name {name:?}"));
    }
    let (labels, rest) = if line[name_end..].starts_with('{') {
        labels(&line[name_end + 1..])?
    } else {
        (BTreeMap::new(), &line[name_end..])
    };
    let value = rest.split_whitespace().next().ok_or("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|_| format!("bad value {v:?}"))?,
    };
    Ok(Sample { name: name.into(), labels, value })
}

/// Reads `k="v",...}`; returns the labels and what follows the `}`.
fn labels(mut text: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut out = BTreeMap::new();
    loop {
        text = text.trim_start_matches(',');
        if let Some(rest) = text.strip_prefix('}') {
            return Ok((out, rest));
        }
        let (key, rest) = text.split_once("=\"").ok_or("bad label")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next().ok_or("unterminated label value")? {
                (_, '\\') => match chars.next().ok_or("bad escape")?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        out.insert(key.to_string(), value);
        text = &rest[end + 1..];
    }
}

#[test]
fn the_parser_reads_labels_escapes_and_histograms() {
    let text = "# HELP a_total Things\\n done\n# TYPE a_total counter\n\
                a_total{x=\"1\",y=\"q\\\"uote\"} 3\nb 1.5e-3\nh_bucket{le=\"+Inf\"} 2\n";
    let e = Exposition::parse(text).expect("valid exposition");
    assert_eq!(e.help["a_total"], "Things\n done");
    assert_eq!(e.value("a_total", &[("y", "q\"uote")]).expect("one"), 3.0);
    assert_eq!(e.value("b", &[]).expect("one"), 0.0015);
    assert_eq!(e.value("h_bucket", &[("le", "+Inf")]).expect("one"), 2.0);
    assert!(Exposition::parse("bad line here\n").is_err());
}

async fn scrape(env: &Env) -> Exposition {
    let (status, ctype, body) = env.ps.get("/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    assert!(ctype.starts_with("text/plain"), "content type {ctype}");
    Exposition::parse(&body).unwrap_or_else(|e| env.fail(&format!("{e:#}\n{body}")))
}

/// Every documented metric family (docs/using.md, "HTTP API") that exists from the start has HELP text and
/// the right TYPE.
fn check_families(env: &Env, e: &Exposition) {
    let families = [
        ("polestar_sentinel_up", "gauge"),
        ("polestar_master_epoch", "gauge"),
        ("polestar_master_state", "gauge"),
        ("polestar_primary_changes_total", "counter"),
        ("polestar_publish_latency_seconds", "histogram"),
        ("polestar_http_requests_total", "counter"),
    ];
    for (name, kind) in families {
        let help = e.help.get(name).map(String::as_str).unwrap_or_default();
        if help.len() < 10 || e.kind.get(name).map(String::as_str) != Some(kind) {
            env.fail(&format!("{name}: HELP {help:?}, TYPE {:?}", e.kind.get(name)));
        }
    }
}

#[tokio::test]
async fn metrics_after_a_failover() {
    let env = Env::start().await;
    env.wait_reachable(3, STARTUP).await;
    let master = env.master_name();
    let m = [("master", master.as_str())];
    let before = scrape(&env).await;
    let changes_before = before.value("polestar_primary_changes_total", &m).unwrap_or(0.0);

    env.failover().await;
    let api = env.wait_state("ok", FAILOVER).await;
    env.wait_reachable(3, FAILOVER).await;
    for _ in 0..3 {
        env.master().await.expect("GET master");
    }
    let after = scrape(&env).await;
    check_families(&env, &after);
    let check = |what: &str, ok: bool| {
        if !ok {
            env.fail(&format!("{what}\n{:#?}", after.samples));
        }
    };

    let changes = after.value("polestar_primary_changes_total", &m).unwrap_or(-1.0);
    check("primary_changes_total grew by the failover", changes >= changes_before + 1.0);
    let epoch = epoch_of(&api).expect("an epoch") as f64;
    check(
        "master_epoch is the API's",
        after.value("polestar_master_epoch", &m).ok() == Some(epoch),
    );
    for state in ["ok", "failover", "stale", "unknown"] {
        let want = if state == "ok" { 1.0 } else { 0.0 };
        let value = after.value("polestar_master_state", &[m[0], ("state", state)]).ok();
        check(&format!("master_state{{state={state}}} is {want}"), value == Some(want));
    }
    for sentinel in env.lab.sentinel_addrs() {
        let up = after.value("polestar_sentinel_up", &[("sentinel", &sentinel.to_string())]);
        check(&format!("sentinel_up for {sentinel}"), up.ok() == Some(1.0));
    }

    let latency = "polestar_publish_latency_seconds";
    let count = after.value(&format!("{latency}_count"), &[]).unwrap_or(0.0);
    check("publish_latency_seconds counted the flip", count >= 1.0);
    let buckets = after.find(&format!("{latency}_bucket"), &[]);
    let values: Vec<f64> = buckets.iter().map(|s| s.value).collect();
    check("buckets are cumulative", values.windows(2).all(|w| w[0] <= w[1]));
    let inf = after.value(&format!("{latency}_bucket"), &[("le", "+Inf")]).ok();
    check("the +Inf bucket is the count", inf == Some(count));
    let sum = after.value(&format!("{latency}_sum"), &[]).unwrap_or(-1.0);
    check("latencies are between 0 and 10 s", sum >= 0.0 && sum < 10.0 * count);

    let route = [("route", "/v1/masters/{name}"), ("code", "200")];
    let served = after.value("polestar_http_requests_total", &route).unwrap_or(0.0);
    check("http_requests_total counts by route template and code", served >= 3.0);
    let unmatched = after.find("polestar_http_requests_total", &[]);
    check(
        "no raw paths as labels",
        unmatched.iter().all(|s| !s.labels["route"].contains(master.as_str())),
    );
}

/// Found by a new user: on a fresh daemon `/metrics` had no `primary_changes_total` (nor
/// `drain_killed_total`) series, so `rate()` and absence alerts broke until the first failover.
/// The master here is discovered (no `masters:` list), the harder case.
#[tokio::test]
async fn primary_changes_total_was_missing_before_the_first_failover() {
    let lab = Lab::start(LabOptions::default()).await.expect("lab");
    let mut config = PolestarConfig::for_lab(&lab);
    config.masters.clear();
    let env = Env::with_config(lab, &config).await;
    let master = env.master_name();
    let e = scrape(&env).await;
    let check = |series: &str, labels: &[(&str, &str)]| {
        if e.value(series, labels).ok() != Some(0.0) {
            env.fail(&format!("{series}{labels:?} is not 0 from the start\n{:#?}", e.samples));
        }
    };
    check("polestar_primary_changes_total", &[("master", &master)]);
    for method in ["client_kill", "sock_destroy"] {
        check("polestar_drain_killed_total", &[("master", &master), ("method", method)]);
    }
    let drain = e.kind.get("polestar_drain_killed_total").map(String::as_str);
    assert_eq!(drain, Some("counter"), "drain_killed_total has its TYPE");
    // The switchover's series too, before the first switchover.
    for outcome in ["failed_over", "not_caught_up", "too_far_behind", "refused"] {
        check("polestar_switchovers_total", &[("master", &master), ("outcome", outcome)]);
    }
    check("polestar_switchover_wait_seconds_count", &[("master", &master)]);
    check("polestar_switchover_wait_seconds_bucket", &[("master", &master), ("le", "+Inf")]);
    let wait = e.kind.get("polestar_switchover_wait_seconds").map(String::as_str);
    assert_eq!(wait, Some("histogram"), "switchover_wait_seconds has its TYPE");
}
