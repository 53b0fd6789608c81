//! The DNS promise (docs/using.md, "DNS") against real Sentinels and the real binary: the DNS name follows
//! every kind of failover (planned, primary killed), the SRV/TXT answers and the SOA serial move
//! with it, and DNS and the API never disagree once settled.

use crate::common;
use crate::dns_support;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, ensure};
use common::*;
use polestar_lab::{Lab, LabOptions};

const ZONE: &str = "redis.test.";
const LABEL: &str = "cache";

async fn start() -> Env {
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    let mut config = PolestarConfig::for_lab(&lab);
    config.masters = vec![(lab.master_name().to_string(), Some(LABEL.to_string()))];
    config.dns = true;
    Env::with_config(lab, &config).await
}

/// `dig +short` against the daemon's DNS listener.
async fn dig(env: &Env, name: &str, rtype: &str) -> anyhow::Result<Vec<String>> {
    let dns = env.ps.dns.context("DNS listener")?;
    let output = tokio::process::Command::new("dig")
        .args(["@127.0.0.1", "-p", &dns.port().to_string(), "+short", "+tries=1", "+time=2"])
        .args([name, rtype])
        .kill_on_drop(true)
        .output()
        .await
        .context("dig runs (apt-get install dnsutils)")?;
    ensure!(output.status.success(), "dig failed: {}", String::from_utf8_lossy(&output.stderr));
    Ok(String::from_utf8_lossy(&output.stdout).lines().map(str::to_string).collect())
}

fn name(prefix: &str) -> String {
    format!("{prefix}{LABEL}.{ZONE}")
}

/// The primary as DNS serves it: the A answer and the SRV port.
async fn dns_primary(env: &Env) -> anyhow::Result<SocketAddr> {
    let a = dig(env, &name(""), "A").await?;
    let srv = dig(env, &name("_redis._tcp."), "SRV").await?;
    let ip = a.first().context("no A answer")?.parse()?;
    let port = srv.first().and_then(|l| l.split_whitespace().nth(2)).context("no SRV answer")?;
    Ok(SocketAddr::new(ip, port.parse()?))
}

async fn txt(env: &Env) -> anyhow::Result<Vec<String>> {
    Ok(dig(env, &name(""), "TXT")
        .await?
        .into_iter()
        .map(|t| t.trim_matches('"').to_string())
        .collect())
}

async fn serial(env: &Env) -> anyhow::Result<u32> {
    let soa = dig(env, ZONE, "SOA").await?;
    let line = soa.first().context("no SOA answer")?;
    Ok(line.split_whitespace().nth(2).context("SOA serial")?.parse()?)
}

/// Until DNS answers `addr` with `epoch=<epoch>` in TXT.
async fn wait_dns(env: &Env, addr: SocketAddr, epoch: u64) {
    env.wait_until(FAILOVER, &format!("DNS answers {addr} at epoch {epoch}"), || async {
        let seen = dns_primary(env).await?;
        ensure!(seen == addr, "DNS answers {seen}");
        let txt = txt(env).await?;
        ensure!(txt.contains(&format!("epoch={epoch}")), "TXT {txt:?}");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn initial_answers_match_sentinel() {
    let env = start().await;
    let primary = env.lab.primary().await.expect("the lab's primary");
    let epoch = env.lab.epoch().await.expect("epoch");
    wait_dns(&env, primary, epoch).await;
    assert!(txt(&env).await.expect("TXT").contains(&"state=ok".to_string()));
    let replicas = dig(&env, &name("replicas."), "A").await.expect("replicas");
    assert_eq!(replicas, vec!["127.0.0.1".to_string()], "both replicas live on 127.0.0.1");
    let nx = dig(&env, &name("nope."), "A").await.expect("nxdomain");
    assert!(nx.is_empty());
}

#[tokio::test]
async fn planned_failover_moves_srv_txt_and_the_serial() {
    let env = start().await;
    let old = env.lab.primary().await.expect("primary");
    wait_dns(&env, old, env.lab.epoch().await.expect("epoch")).await;
    let before = serial(&env).await.expect("serial");
    let new = env.failover().await;
    assert_ne!(new, old);
    let epoch = epoch_of(&env.master().await.expect("master")).expect("epoch");
    wait_dns(&env, new, epoch).await;
    let after = serial(&env).await.expect("serial");
    assert!(after > before, "serial {before} -> {after}");
}

#[tokio::test]
async fn killed_primary_moves_the_name() {
    let env = start().await;
    let old = env.lab.primary().await.expect("primary");
    let i = env.lab.index_of(old).expect("index of the primary");
    env.lab.kill_node(i).expect("SIGKILL the primary");
    let new =
        env.lab.wait_for_primary_change(old, FAILOVER * 2).await.expect("Sentinel fails over");
    let epoch = env.lab.epoch().await.expect("epoch");
    wait_dns(&env, new, epoch).await;
    // Once settled, DNS and the API answer the same node.
    let api = primary_of(&env.master().await.expect("master"));
    assert_eq!(api, Some(new));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(dns_primary(&env).await.expect("DNS"), new);
}

/// The SRV port knotd serves for the master.
async fn knot_srv_port(knot: &dns_support::Knot) -> anyhow::Result<u16> {
    let text = dns_support::dig(knot.addr, &["+short", &name("_redis._tcp."), "SRV"]).await;
    let port = text.split_whitespace().nth(2).context("no SRV answer from knotd")?;
    Ok(port.parse()?)
}

#[tokio::test]
async fn a_knot_secondary_follows_a_sentinel_failover() {
    // Polestar must know where to NOTIFY before it starts; knotd then binds that address.
    let Some(knot) = dns_support::Knot::prepare(ZONE) else {
        // CI installs knot (tests/deps.sh): there a missing knotd is a failure, not a skip.
        assert!(std::env::var_os("CI").is_none(), "knotd not installed (apt-get install knot)");
        eprintln!("knotd not installed: skipping");
        return;
    };
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    let mut config = PolestarConfig::for_lab(&lab);
    config.masters = vec![(lab.master_name().to_string(), Some(LABEL.to_string()))];
    config.dns = true;
    config.dns_notify = vec![format!("\"{}\"", knot.addr)];
    let env = Env::with_config(lab, &config).await;
    let _running = knot.start(env.ps.dns.expect("DNS listener"));
    let old = env.lab.primary().await.expect("primary");
    let serves_old = || async {
        let port = knot_srv_port(&knot).await.with_context(|| knot.log())?;
        ensure!(port == old.port(), "knotd answers port {port}:\n{}", knot.log());
        Ok(())
    };
    env.wait_until(FAILOVER, "knotd serves the zone", serves_old).await;
    let new = env.failover().await;
    let flipped = tokio::time::Instant::now();
    // Well inside the SOA refresh (60 s) and retry (10 s): only NOTIFY can explain it.
    env.wait_until(Duration::from_secs(5), "knotd follows the failover", || async {
        let port = knot_srv_port(&knot).await?;
        ensure!(port == new.port(), "knotd still answers port {port}:\n{}", knot.log());
        Ok(())
    })
    .await;
    eprintln!("knotd followed the failover {:?} after the API", flipped.elapsed());
}
