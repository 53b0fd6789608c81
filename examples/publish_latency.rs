//! Publish latency, measured end to end on a real local cluster: from the promoted replica's
//! first `ROLE` master answer (every replica's `ROLE` is polled every millisecond) and from the
//! moment the leader Sentinel's `+failover-state-send-slaveof-noone` (it has just told the
//! replica to become master) reaches a subscriber on loopback, to the moment a pending HTTP
//! long-poll (`?wait=&after=`) returns the new primary, and to the first DNS answer (SRV,
//! polled over UDP every millisecond) naming it. Also shows when the leader's `+promoted-slave` and the first
//! `+switch-master` arrived, which is where designs keyed on those events would flip.
//!
//! Run with `bench/publish-latency.sh [ROUNDS] [--tls]`: with `--tls` the cluster is TLS only
//! (`tls-port`, client certificates required, replication over TLS) and polestar and the
//! event subscriber talk TLS to the Sentinels and nodes.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use polestar::config::Config;
use polestar_lab::{Lab, LabOptions};
use tokio_util::sync::CancellationToken;

type Seen = Arc<Mutex<Vec<(String, Instant)>>>;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let tls = std::env::args().any(|a| a == "--tls");
    let lab = Lab::start(LabOptions { tls, ..LabOptions::default() }).await?;
    let http = free_port()?;
    let dns = free_udp_port()?;
    let tls_yaml = match lab.certs() {
        Some(c) => format!(
            ", tls: {{enabled: true, ca_file: '{}', cert_file: '{}', key_file: '{}'}}",
            c.ca.display(),
            c.client_cert.display(),
            c.client_key.display()
        ),
        None => String::new(),
    };
    let config = format!(
        "sentinels: {{addresses: [{}]{tls_yaml}}}\nhttp: {{listen: '{http}'}}\n\
         masters: [{{name: mymaster, dns_name: cache}}]\n\
         dns: {{listen: ['{dns}'], zone: redis.test.}}\n",
        lab.sentinel_addrs().iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join(", ")
    );
    println!("{}", if tls { "TLS cluster" } else { "plain cluster" });
    let config =
        Config::parse(&config, std::path::Path::new("/")).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let shutdown = CancellationToken::new();
    let daemon = tokio::spawn(polestar::daemon::run(config, shutdown.clone()));
    let seen: Seen = Arc::default();
    for addr in lab.sentinel_addrs() {
        match lab.certs() {
            Some(certs) => tokio::spawn(subscribe_tls(addr, certs.client_tls(), seen.clone())),
            None => tokio::spawn(subscribe(addr, seen.clone())),
        };
    }
    let api = format!("http://{http}/v1/masters/{}", lab.master_name());
    let http_client = reqwest::Client::new();
    wait_state(&http_client, &api, "ok").await?;
    println!(
        "round  ROLE->API(ms)  ROLE->DNS(ms)  noone->API(ms)  noone->DNS(ms)  noone->+promoted-slave(ms)  noone->first +switch-master(ms)"
    );
    let (mut figures, mut role_api, mut role_dns) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clear();
        let old = lab.primary().await?;
        let replicas: Vec<SocketAddr> =
            lab.node_addrs().into_iter().filter(|a| *a != old).collect();
        let role_flip = tokio::spawn(watch_role(replicas));
        let dns_flip = tokio::spawn(watch_dns(dns, old.port()));
        let (api_at, [noone, promoted, switched]) =
            one_failover(&lab, &http_client, &api, &seen).await?;
        let dns_at = dns_flip.await??;
        let role_at = role_flip.await??;
        let ms = |a: Instant, b: Instant| a.saturating_duration_since(b).as_secs_f64() * 1e3;
        let sign = |a: Instant, b: Instant| if a >= b { ms(a, b) } else { -ms(b, a) };
        role_api.push(sign(api_at, role_at));
        role_dns.push(sign(dns_at, role_at));
        figures.push((sign(api_at, noone), sign(dns_at, noone)));
        println!(
            "{round:>5}  {:>13.2}  {:>13.2}  {:>14.2}  {:>14.2}  {:>26.2}  {:>30.2}",
            sign(api_at, role_at),
            sign(dns_at, role_at),
            sign(api_at, noone),
            sign(dns_at, noone),
            ms(promoted, noone),
            ms(switched, noone)
        );
        wait_state(&http_client, &api, "ok").await?;
    }
    let (noone_api, noone_dns): (Vec<f64>, Vec<f64>) = figures.into_iter().unzip();
    let series = [
        ("ROLE->API", role_api),
        ("ROLE->DNS", role_dns),
        ("noone->API", noone_api),
        ("noone->DNS", noone_dns),
    ];
    for (what, mut figures) in series {
        figures.sort_by(f64::total_cmp);
        let median = figures[figures.len() / 2];
        let max = figures.last().copied().unwrap_or(0.0);
        println!("{what}: median {median:.2} ms, max {max:.2} ms over {rounds} failovers");
    }
    shutdown.cancel();
    daemon.await??;
    Ok(())
}

async fn one_failover(
    lab: &Lab,
    http: &reqwest::Client,
    api: &str,
    seen: &Seen,
) -> anyhow::Result<(Instant, [Instant; 3])> {
    let before: serde_json::Value = http.get(api).send().await?.json().await?;
    let epoch = before["epoch"].as_u64().context("no epoch")?;
    let poll = http.get(format!("{api}?wait=60s&after={epoch}")).send();
    let poll = tokio::spawn(async move {
        let response = poll.await;
        (Instant::now(), response)
    });
    lab.failover().await?;
    let (api_at, response) = poll.await?;
    let after: serde_json::Value = response?.json().await?;
    anyhow::ensure!(after["epoch"].as_u64() > Some(epoch), "epoch did not grow: {after}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
        let first = |name: &str| events.iter().find(|(c, _)| c == name).map(|(_, t)| *t);
        let noone = first("+failover-state-send-slaveof-noone");
        if let (Some(n), Some(p), Some(s)) =
            (noone, first("+promoted-slave"), first("+switch-master"))
        {
            return Ok((api_at, [n, p, s]));
        }
        anyhow::ensure!(Instant::now() < deadline, "no +promoted-slave/+switch-master seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn subscribe(addr: SocketAddr, seen: Seen) -> anyhow::Result<()> {
    let client = redis::Client::open(format!("redis://{addr}"))?;
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.psubscribe("*").await?;
    let mut stream = pubsub.on_message();
    while let Some(msg) = stream.next().await {
        let at = Instant::now();
        if let Ok(mut seen) = seen.lock() {
            seen.push((msg.get_channel_name().to_string(), at));
        }
    }
    Ok(())
}

/// Like `subscribe`, over TLS (RESP3 pushes on polestar's own connection code).
/// What polestar's config says to talk to the TLS lab: its CA and polestar's certificate (the
/// lab crate knows nothing of polestar's config).
trait ClientTls {
    fn client_tls(&self) -> polestar::config::Tls;
}

impl ClientTls for polestar_lab::tls::Certs {
    fn client_tls(&self) -> polestar::config::Tls {
        polestar::config::Tls {
            enabled: true,
            ca_file: Some(self.ca.clone()),
            cert_file: Some(self.client_cert.clone()),
            key_file: Some(self.client_key.clone()),
        }
    }
}

async fn subscribe_tls(
    addr: SocketAddr,
    tls: polestar::config::Tls,
    seen: Seen,
) -> anyhow::Result<()> {
    let auth = polestar::config::Auth { tls, ..Default::default() };
    let endpoint = polestar::node::Endpoint::new(addr.ip().to_string(), addr.port(), &auth);
    // The bench's own subscriber keeps every message (bounded by the bench's length).
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let sink: polestar::node::PushSink = Box::new(move |push| tx.send(push).map_err(|_| ()));
    let mut conn = polestar::node::connect(&endpoint, Some(sink)).await?;
    conn.psubscribe("*").await?;
    while let Some(push) = rx.recv().await {
        let at = Instant::now();
        if push.kind != redis::PushKind::PMessage {
            continue;
        }
        let channel = push.data.get(1).and_then(|v| redis::from_redis_value_ref::<String>(v).ok());
        if let (Some(channel), Ok(mut seen)) = (channel, seen.lock()) {
            seen.push((channel, at));
        }
    }
    Ok(())
}

async fn wait_state(http: &reqwest::Client, api: &str, state: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = http.get(api).send().await {
            let v: serde_json::Value = r.json().await.unwrap_or_default();
            if v["state"] == state {
                return Ok(());
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "master never reached state {state}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls every replica's `ROLE` every millisecond (for at most 60 s) until one answers
/// master; returns when that answer arrived.
/// Sentinel kills every normal client of the replica it promotes (`CLIENT KILL TYPE normal`
/// in the transaction with `SLAVEOF NO ONE`), so a connection that fails is opened again.
/// Only a node seen as a replica first counts (an old primary of an earlier round may not be
/// demoted yet).
async fn watch_role(replicas: Vec<SocketAddr>) -> anyhow::Result<Instant> {
    let mut conns = Vec::new();
    for addr in &replicas {
        let client = redis::Client::open(format!("redis://{addr}"))?;
        conns.push((client.clone(), client.get_multiplexed_async_connection().await?, false));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        for (client, conn, was_replica) in &mut conns {
            let Ok(reply) = redis::cmd("ROLE").query_async::<redis::Value>(conn).await else {
                *conn = client.get_multiplexed_async_connection().await?;
                continue;
            };
            let at = Instant::now();
            match polestar::node::Role::parse(&reply) {
                polestar::node::Role::Master if *was_replica => return Ok(at),
                polestar::node::Role::Replica => *was_replica = true,
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    anyhow::bail!("no replica ever answered ROLE master")
}

/// Polls the SRV answer over UDP every millisecond (for at most 60 s) until its port is no
/// longer `old_port`; returns when that answer arrived.
async fn watch_dns(dns: SocketAddr, old_port: u16) -> anyhow::Result<Instant> {
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RData, RecordType};
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
    let mut query = Message::query();
    query.add_query(Query::query(
        Name::from_ascii("_redis._tcp.cache.redis.test.")?,
        RecordType::SRV,
    ));
    let bytes = query.to_vec()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut buf = vec![0u8; 1500];
    while Instant::now() < deadline {
        socket.send_to(&bytes, dns).await?;
        if let Ok(Ok((n, _))) =
            tokio::time::timeout(Duration::from_millis(50), socket.recv_from(&mut buf)).await
        {
            let at = Instant::now();
            let answer = Message::from_vec(&buf[..n])?;
            let port = answer.answers.iter().find_map(|r| match &r.data {
                RData::SRV(srv) => Some(srv.port),
                _ => None,
            });
            if port.is_some_and(|p| p != old_port) {
                return Ok(at);
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    anyhow::bail!("DNS never answered a new primary")
}

fn free_udp_port() -> anyhow::Result<SocketAddr> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?)
}

fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}
