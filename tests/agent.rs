//! Agents (docs/trust.md, "Upstreams (for an agent)"): an agent follows several upstream polestars
//! (any one that answers suffices), over https verified against `upstream.ca_file`, with the agent
//! token; a wrong token is refused with 401 and the agent says so; the upstream's HTTPS certificate
//! is reloaded on SIGHUP. Real Sentinels, the real binary for the upstream and the agent.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;
use polestar_lab::tls::Certs;
use polestar_lab::{Lab, LabOptions};
use serde_json::Value;

const AGENT_TOKEN: &str = "agent-token-for-tests";

/// The upstream: a polestar on the lab, HTTPS with the lab certificate, the agent token.
async fn upstream(lab: &Lab, certs: &Certs, dir: &Path) -> Polestar {
    let token = dir.join("agent.token");
    std::fs::write(&token, format!("{AGENT_TOKEN}\n")).unwrap();
    let mut config = PolestarConfig::for_lab(lab);
    config.http_settings = vec![
        format!(
            "tls: {{cert_file: \"{}\", key_file: \"{}\"}}",
            certs.node_cert.display(),
            certs.node_key.display()
        ),
        format!("agent_token_file: \"{}\"", token.display()),
    ];
    config.https_ca = Some(certs.ca.clone());
    Polestar::start(&config).await
}

/// An agent following `urls` with `token` (written to a file) and the lab CA.
async fn agent(lab: &Lab, certs: &Certs, dir: &Path, urls: &[String], token: &str) -> Polestar {
    let file = dir.join(format!("agent-{}.token", token.len()));
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let quoted: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
    let mut config = PolestarConfig::for_lab(lab);
    config.source = Some(format!(
        "upstream:\n  urls: [{}]\n  ca_file: \"{}\"\n  token_file: \"{}\"",
        quoted.join(", "),
        certs.ca.display(),
        file.display()
    ));
    Polestar::start(&config).await
}

fn primary_of_view(m: &Value) -> Option<String> {
    Some(format!("{}:{}", m["primary"]["ip"].as_str()?, m["primary"]["port"].as_u64()?))
}

async fn wait_primary(ps: &Polestar, master: &str, want: &str, deadline: Duration) -> Value {
    let end = Instant::now() + deadline;
    loop {
        if let Ok(m) = ps.master(master).await
            && primary_of_view(&m).as_deref() == Some(want)
        {
            return m;
        }
        if Instant::now() > end {
            panic!("{} never answered primary {want}:\n{}", ps.api(), ps.log_tail(60));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The `time_ms` of the first `switch` event of `ps` to `to`.
async fn switch_ms(ps: &Polestar, to: &str) -> Option<u64> {
    let (_, events) = ps.get_json("/v1/events").await.ok()?;
    events.as_array()?.iter().find(|e| e["kind"] == "switch" && e["to"] == to)?["time_ms"].as_u64()
}

#[tokio::test]
async fn an_agent_over_https_with_the_token_follows_a_failover_while_one_of_its_three_upstreams_is_down()
 {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(&dir.path().join("tls")).expect("certificates");
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    let up = upstream(&lab, &certs, dir.path()).await;
    let other = upstream(&lab, &certs, dir.path()).await;
    // A majority of the three configured upstreams is two: the dead one still counts.
    let dead = format!("https://127.0.0.1:{}", polestar_lab::free_service_port().unwrap());
    let urls = [dead, up.api(), other.api()];
    let agent = agent(&lab, &certs, dir.path(), &urls, AGENT_TOKEN).await;
    let old = lab.primary().await.expect("primary").to_string();
    wait_primary(&agent, lab.master_name(), &old, STARTUP).await;

    lab.failover().await.expect("SENTINEL FAILOVER");
    let new = lab.wait_for_primary_change(old.parse().unwrap(), FAILOVER * 2).await.unwrap();
    let new = new.to_string();
    wait_primary(&up, lab.master_name(), &new, FAILOVER).await;
    wait_primary(&agent, lab.master_name(), &new, FAILOVER).await;
    let (Some(upstream_ms), Some(agent_ms)) =
        (switch_ms(&up, &new).await, switch_ms(&agent, &new).await)
    else {
        panic!("switch events missing:\n{}\n{}", up.log_tail(30), agent.log_tail(30));
    };
    eprintln!(
        "AGENT flip: the agent answered the new primary {} ms after its upstream published it",
        agent_ms.saturating_sub(upstream_ms)
    );
    assert!(agent_ms.saturating_sub(upstream_ms) < 2000, "{upstream_ms} -> {agent_ms}");
    assert!(agent.logged("upstream unreachable"), "{}", agent.log_tail(40));
}

#[tokio::test]
async fn a_wrong_agent_token_gets_401_and_the_agent_logs_it() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(&dir.path().join("tls")).expect("certificates");
    let lab = Lab::start(LabOptions { nodes: 1, sentinels: 1, quorum: 1, ..LabOptions::default() })
        .await
        .expect("the lab starts");
    let up = upstream(&lab, &certs, dir.path()).await;
    // The server side: a wrong token on the stream is 401, the right one is served.
    let tls = polestar::tls::https_client_config(Some(&certs.ca)).unwrap();
    let http = reqwest::Client::builder().use_preconfigured_tls(tls).build().unwrap();
    let url = up.url("/v1/events/stream");
    let wrong = http.get(&url).bearer_auth("nope").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let right = http.get(&url).bearer_auth(AGENT_TOKEN).send().await.unwrap();
    assert_eq!(right.status(), 200);
    drop(right);

    let agent = agent(&lab, &certs, dir.path(), &[up.api()], "the-wrong-token").await;
    let end = Instant::now() + STARTUP;
    while !agent.logged("401 Unauthorized") {
        assert!(Instant::now() < end, "no 401 in the agent's log:\n{}", agent.log_tail(40));
        tokio::time::sleep(POLL).await;
    }
    assert!(agent.logged("upstream.token_file"), "{}", agent.log_tail(40));
    let (code, body) = agent.get_json("/readyz").await.unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(body["reasons"].to_string().contains("401 Unauthorized"), "{body}");
}

#[tokio::test]
async fn the_https_certificate_is_reloaded_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(&dir.path().join("tls")).expect("certificates");
    let lab = Lab::start(LabOptions { nodes: 1, sentinels: 1, quorum: 1, ..LabOptions::default() })
        .await
        .expect("the lab starts");
    // The certificate files the upstream serves, replaced in place by a new CA's below.
    let (cert, key) = (dir.path().join("api.crt"), dir.path().join("api.key"));
    std::fs::copy(&certs.node_cert, &cert).unwrap();
    std::fs::copy(&certs.node_key, &key).unwrap();
    let mut config = PolestarConfig::for_lab(&lab);
    config.http_settings = vec![format!(
        "tls: {{cert_file: \"{}\", key_file: \"{}\"}}",
        cert.display(),
        key.display()
    )];
    config.https_ca = Some(certs.ca.clone());
    let ps = Polestar::start(&config).await;
    let (code, _) = ps.get_json("/healthz").await.expect("HTTPS answers with the first CA");
    assert_eq!(code, 200);
    let plain = reqwest::get(format!("http://{}/healthz", ps.http)).await;
    assert!(plain.is_err() || plain.is_ok_and(|r| r.status() != 200), "plain HTTP is not served");

    let renewed = Certs::generate(&dir.path().join("renewed")).expect("certificates");
    std::fs::copy(&renewed.node_cert, &cert).unwrap();
    std::fs::copy(&renewed.node_key, &key).unwrap();
    ps.signal(Signal::SIGHUP);
    let tls = polestar::tls::https_client_config(Some(&renewed.ca)).unwrap();
    let http = reqwest::Client::builder().use_preconfigured_tls(tls).build().unwrap();
    let end = Instant::now() + STARTUP;
    loop {
        let answer = http.get(ps.url("/healthz")).send().await;
        if answer.is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(
            Instant::now() < end,
            "the renewed certificate is not served:\n{}",
            ps.log_tail(30)
        );
        tokio::time::sleep(POLL).await;
    }
    // A new connection that trusts only the first CA is refused now.
    let tls = polestar::tls::https_client_config(Some(&certs.ca)).unwrap();
    let old = reqwest::Client::builder().use_preconfigured_tls(tls).build().unwrap();
    assert!(old.get(ps.url("/healthz")).send().await.is_err(), "the old certificate is served");
}

// ---------------------------------------------------------------------------------------------
// A fake upstream that lies: invented masters, absurd epochs, a primary that was never a data
// node, a huge body. The agent (with `sweep.remote`) must destroy nothing but the sockets to the
// old primary of the one legitimate failover, and stay small.

mod fake {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use axum::Router;
    use axum::body::{Body, Bytes};
    use axum::extract::State;
    use axum::routing::get;
    use serde_json::{Value, json};

    /// What the fake answers now, and how often each phase was read.
    #[derive(Default)]
    pub struct Script {
        pub phase: AtomicUsize,
        pub reads: [AtomicUsize; 8],
        /// `GET /v1/masters` requests, of every phase.
        pub gets: AtomicUsize,
        pub answers: std::sync::Mutex<Vec<Value>>,
    }

    impl Script {
        pub fn set(&self, phase: usize, answer: Option<Value>) {
            let mut answers = self.answers.lock().unwrap();
            answers.resize(8, Value::Null);
            answers[phase] = answer.unwrap_or(Value::Null);
            self.phase.store(phase, Ordering::SeqCst);
        }
        pub fn reads(&self, phase: usize) -> usize {
            self.reads[phase].load(Ordering::SeqCst)
        }
    }

    pub fn master(name: &str, primary: u16, epoch: u64, replicas: &[u16]) -> Value {
        let replicas: Vec<Value> = replicas
            .iter()
            .map(|p| json!({"ip": "127.0.0.1", "port": p, "healthy": true}))
            .collect();
        json!({
            "name": name, "dns_name": name,
            "primary": {"ip": "127.0.0.1", "port": primary, "hostname": null},
            "epoch": epoch, "since": "2026-01-01T00:00:00.000Z", "state": "ok",
            "replicas": replicas,
            "sentinels": {"configured": 3, "reachable": 3, "agreeing": 3},
        })
    }

    async fn masters(State(script): State<Arc<Script>>) -> Body {
        let phase = script.phase.load(Ordering::SeqCst);
        script.reads[phase].fetch_add(1, Ordering::SeqCst);
        script.gets.fetch_add(1, Ordering::SeqCst);
        let answer = script.answers.lock().unwrap()[phase].clone();
        if !answer.is_null() {
            return Body::from(answer.to_string());
        }
        // 150 MB of a JSON array that never ends, streamed without a length.
        let chunk = Bytes::from(vec![b' '; 1 << 20]);
        let head = futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from("[")) });
        let tail = futures::stream::iter((0..150).map(move |_| Ok(chunk.clone())));
        Body::from_stream(futures::StreamExt::chain(head, tail))
    }

    /// An event every 100 ms, so the agent reads `/v1/masters` again at once.
    async fn stream() -> Body {
        let ticks = futures::stream::unfold(0u64, |n| async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let event = format!("id: {n}\nevent: switch\ndata: {{}}\n\n");
            Some((Ok::<_, std::io::Error>(Bytes::from(event)), n + 1))
        });
        Body::from_stream(ticks)
    }

    /// The stream of a polestar with the masters feed: the `polestar-masters` header, and the
    /// current phase's answer as a full `masters` event at once and every 100 ms (each counted
    /// as a read of that phase). A full list is a valid event at any point of a stream.
    async fn feed(State(script): State<Arc<Script>>) -> axum::response::Response {
        let ticks = futures::stream::unfold((script, 0u64), |(script, n)| async move {
            if n > 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let phase = script.phase.load(Ordering::SeqCst);
            let masters = script.answers.lock().unwrap()[phase].clone();
            script.reads[phase].fetch_add(1, Ordering::SeqCst);
            let data = json!({"version": n + 1, "masters": masters});
            let event = format!("event: masters\ndata: {data}\n\n");
            Some((Ok::<_, std::io::Error>(Bytes::from(event)), (script, n + 1)))
        });
        let mut response = axum::response::IntoResponse::into_response(Body::from_stream(ticks));
        response.headers_mut().insert("polestar-masters", "1".parse().unwrap());
        response
    }

    /// How the fake's event stream tells the agent about changes.
    #[derive(Clone, Copy, Debug)]
    pub enum Stream {
        /// An older polestar's: events only, so the agent reads `GET /v1/masters` again.
        Events,
        /// With the masters feed: the answer itself, so the agent reads nothing.
        Feed,
    }

    pub async fn start(script: Arc<Script>) -> (String, tokio::task::JoinHandle<()>) {
        start_with(script, Stream::Events).await
    }

    pub async fn start_with(
        script: Arc<Script>,
        kind: Stream,
    ) -> (String, tokio::task::JoinHandle<()>) {
        let events = match kind {
            Stream::Events => get(stream),
            Stream::Feed => get(feed),
        };
        let app = Router::new()
            .route("/v1/masters", get(masters))
            .route("/v1/events/stream", events)
            .with_state(script);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (url, task)
    }
}

/// A listener on loopback standing for a data node (or any other service of this host), and
/// one client connection to it: the socket a sweep would destroy.
struct Victim {
    port: u16,
    client: tokio::net::TcpStream,
    _server: tokio::net::TcpStream,
    _listener: tokio::net::TcpListener,
}

impl Victim {
    async fn new() -> Victim {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        Victim { port, client, _server: server, _listener: listener }
    }

    /// The client socket was not destroyed: reading would block (nothing was sent to it).
    fn alive(&self) -> bool {
        let mut buf = [0u8; 1];
        matches!(self.client.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}

fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or("VmRSS: 0 kB");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn a_lying_upstream_makes_the_agent_destroy_nothing_outside_the_data_nodes_it_follows() {
    use fake::{Script, master};
    use serde_json::json;

    let [a, r, v, v2, v3, v4] = [(); 6].map(|_| Victim::new());
    let (a, r, v, v2, v3, v4) = (a.await, r.await, v.await, v2.await, v3.await, v4.await);
    let script = Arc::new(Script::default());
    // mymaster: primary A, replica R; an invented master whose primary is V.
    script.set(
        0,
        Some(json!([master("mymaster", a.port, 1, &[r.port]), master("evil", v.port, 1, &[])])),
    );
    let (url, fake_task) = fake::start(script.clone()).await;

    let config = PolestarConfig {
        extra: "sweep:\n  remote: true\n".into(),
        ..PolestarConfig::agent("mymaster", std::slice::from_ref(&url))
    };
    let agent = Polestar::start(&config).await;
    let mine = format!("127.0.0.1:{}", a.port);
    wait_primary(&agent, "mymaster", &mine, STARTUP).await;
    let (code, _) = agent.get_json("/v1/masters/evil").await.unwrap();
    assert_eq!(code, 404, "an invented master is not followed");

    // Each lie, read a few times by the agent; the primary stays A and no socket is destroyed.
    let lies = [
        json!([
            master("mymaster", v2.port, u64::MAX, &[r.port]),
            master("evil", r.port, 2, &[v.port])
        ]),
        json!([master("mymaster", v3.port, 1, &[r.port])]),
        json!([master("mymaster", v4.port, 2, &[r.port])]),
    ];
    for (i, lie) in lies.into_iter().enumerate() {
        let phase = i + 1;
        script.set(phase, Some(lie));
        wait_reads(&script, phase, &agent).await;
        wait_primary(&agent, "mymaster", &mine, Duration::from_secs(1)).await;
    }
    script.set(4, None); // the huge body
    wait_reads(&script, 4, &agent).await;
    let rss = rss_kb(agent.pid());
    eprintln!("AGENT RSS after 150 MB answers: {rss} kB");
    assert!(rss < 100_000, "the agent holds {rss} kB after huge answers");
    assert!(agent.logged("larger than"), "{}", agent.log_tail(40));
    assert!(agent.logged("upstream answer refused"), "{}", agent.log_tail(40));
    for (name, victim) in [("R", &r), ("V", &v), ("V2", &v2), ("V3", &v3), ("V4", &v4), ("A", &a)] {
        assert!(victim.alive(), "{name}'s socket was destroyed:\n{}", agent.log_tail(40));
    }

    // The one plausible failover (A to its replica R, next epoch): only A's socket goes.
    script.set(5, Some(json!([master("mymaster", r.port, 2, &[a.port])])));
    wait_primary(&agent, "mymaster", &format!("127.0.0.1:{}", r.port), FAILOVER).await;
    let end = Instant::now() + FAILOVER;
    while a.alive() {
        assert!(Instant::now() < end, "A's socket was not swept:\n{}", agent.log_tail(40));
        tokio::time::sleep(POLL).await;
    }
    for (name, victim) in [("R", &r), ("V", &v), ("V2", &v2), ("V3", &v3), ("V4", &v4)] {
        assert!(victim.alive(), "{name}'s socket was destroyed:\n{}", agent.log_tail(40));
    }
    fake_task.abort();
}

async fn wait_reads(script: &fake::Script, phase: usize, agent: &Polestar) {
    let end = Instant::now() + FAILOVER;
    while script.reads(phase) < 3 {
        assert!(Instant::now() < end, "phase {phase} was not read:\n{}", agent.log_tail(40));
        tokio::time::sleep(POLL).await;
    }
}

/// Regression (docs/decisions.md D26): an agent with node credentials and `sweep.remote` follows three upstreams,
/// one of which lies in the two steps that once moved an agent (first the attacker's node X
/// among the replicas, then X promoted at the next epoch, then X replaced by Y, the change that
/// would make the agent sweep X and probe its `ROLE` with the node credentials). X and Y are
/// listeners of the test that record every byte: neither is ever connected to. The control:
/// the real failover that all three then serve makes the agent probe the old primary P (also
/// a recorder), and P does receive the credentials, so the recorders would have seen them.
/// Then all three serve the old primary at the old epoch (a lower epoch, no withdrawal):
/// refused.
#[tokio::test]
async fn sweep_probes_send_no_credentials_to_a_node_no_majority_named() {
    no_majority_moves_the_agent(fake::Stream::Events).await;
}

/// The same, from upstreams whose streams carry the masters (`?masters=only`): the feed
/// changes how an agent hears an upstream, not what it takes from it.
#[tokio::test]
async fn sweep_probes_send_no_credentials_to_a_node_no_majority_named_over_the_masters_feed() {
    no_majority_moves_the_agent(fake::Stream::Feed).await;
}

async fn no_majority_moves_the_agent(kind: fake::Stream) {
    use std::sync::atomic::Ordering;

    use fake::{Script, master};
    use serde_json::json;

    const SECRET: &str = "node-secret-of-the-agent-4f1e";
    let (p, q, x, y) = (Recorder::start(), Recorder::start(), Recorder::start(), Recorder::start());
    let (p, q, x, y) = (p.await, q.await, x.await, y.await);
    let honest = json!([master("mymaster", p.port, 1, &[q.port])]);
    let scripts: Vec<Arc<Script>> = (0..3).map(|_| Arc::new(Script::default())).collect();
    let mut urls = Vec::new();
    let mut tasks = Vec::new();
    for script in &scripts {
        script.set(0, Some(honest.clone()));
        let (url, task) = fake::start_with(script.clone(), kind).await;
        urls.push(url);
        tasks.push(task);
    }
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("node.pass");
    std::fs::write(&secret, SECRET).unwrap();
    let config = PolestarConfig {
        // Past the grace, every round of the client-side sweep asks the old primary's `ROLE`.
        drain_settings: vec!["grace: 200ms".into(), "interval: 100ms".into(), "window: 5s".into()],
        extra: format!(
            "sweep:\n  remote: true\nnodes:\n  username: polestar\n  password_file: {}\n",
            secret.display()
        ),
        ..PolestarConfig::agent("mymaster", &urls)
    };
    let agent = Polestar::start(&config).await;
    let at = |r: &Recorder| format!("127.0.0.1:{}", r.port);
    wait_primary(&agent, "mymaster", &at(&p), STARTUP).await;

    // The minority: X listed as a replica, X promoted, X replaced by Y.
    let lies = [
        json!([master("mymaster", p.port, 1, &[q.port, x.port])]),
        json!([master("mymaster", x.port, 2, &[p.port, y.port])]),
        json!([master("mymaster", y.port, 3, &[x.port])]),
    ];
    for (i, lie) in lies.into_iter().enumerate() {
        let phase = i + 1;
        scripts[0].set(phase, Some(lie));
        wait_reads(&scripts[0], phase, &agent).await;
        let m = wait_primary(&agent, "mymaster", &at(&p), Duration::from_secs(1)).await;
        assert_eq!(m["epoch"], 1, "{m}");
    }
    // (Said at the start, when the first upstream to answer named mymaster alone.)
    assert!(agent.logged("fewer than a majority"), "{}", agent.log_tail(40));

    // The real failover, P to its replica Q, served by all three.
    for script in &scripts {
        script.set(4, Some(json!([master("mymaster", q.port, 2, &[p.port])])));
    }
    wait_primary(&agent, "mymaster", &at(&q), FAILOVER).await;
    let end = Instant::now() + FAILOVER;
    while !p.received(SECRET.as_bytes()) {
        assert!(
            Instant::now() < end,
            "the old primary was never probed with the credentials (got {:?}):\n{}",
            p.shown(),
            agent.log_tail(40)
        );
        tokio::time::sleep(POLL).await;
    }
    eprintln!(
        "SWEEP PROBES: the old primary got {} connection(s), X {}, Y {}",
        p.connections(),
        x.connections(),
        y.connections()
    );
    for (name, r) in [("X", &x), ("Y", &y)] {
        assert_eq!(r.connections(), 0, "{name} was connected to ({:?})", r.shown());
        assert!(!r.received(SECRET.as_bytes()), "{name} got the node credentials");
    }

    // All three go back to P at epoch 1, withdrawing nothing: a lower epoch is refused.
    for script in &scripts {
        script.set(5, Some(json!([master("mymaster", p.port, 1, &[q.port])])));
    }
    for script in &scripts {
        wait_reads(script, 5, &agent).await;
    }
    let m = wait_primary(&agent, "mymaster", &at(&q), Duration::from_secs(1)).await;
    assert_eq!(m["epoch"], 2, "{m}");
    assert!(agent.logged("is below the published 2"), "{}", agent.log_tail(40));
    let gets: usize = scripts.iter().map(|s| s.gets.load(Ordering::SeqCst)).sum();
    match kind {
        fake::Stream::Feed => assert_eq!(gets, 0, "the agent read GET /v1/masters"),
        fake::Stream::Events => assert!(gets > 0, "the agent read no GET /v1/masters"),
    }
    for task in tasks {
        task.abort();
    }
}

/// Regression (no bound on the epoch: docs/decisions.md D4), measured before: Sentinels at
/// current epoch 5000 (one counter for every master), a `SENTINEL FAILOVER` of a master at config
/// epoch 0 gives 5001; the central polestar followed in 1.44 s, an agent following it never did
/// (still epoch 0, the old primary, state `ok`). Past 2^32 (a forged hello can push every real
/// Sentinel there), the agent's ceiling refused every real failover for good. Real Sentinels
/// started at that current epoch, the real binary for the central polestar and the agent.
async fn an_agent_follows_a_failover_whose_epoch_jumps_to(current_epoch: u64) {
    let opts = LabOptions { current_epoch, ..LabOptions::default() };
    let lab = Lab::start(opts).await.expect("the lab starts");
    let central = Polestar::start(&PolestarConfig::for_lab(&lab)).await;
    let agent = Polestar::start(&PolestarConfig::agent(lab.master_name(), &[central.api()])).await;
    let old = lab.primary().await.expect("primary");
    let before = wait_primary(&agent, lab.master_name(), &old.to_string(), STARTUP).await;
    assert!(before["epoch"].as_u64().is_some_and(|e| e < current_epoch), "{before}");

    lab.failover().await.expect("SENTINEL FAILOVER");
    let new = lab.wait_for_primary_change(old, FAILOVER * 2).await.expect("a new primary");
    let m = wait_primary(&central, lab.master_name(), &new.to_string(), FAILOVER).await;
    let epoch = m["epoch"].as_u64().expect("an epoch");
    assert!(
        epoch > current_epoch,
        "the failover's epoch is past the Sentinels' {current_epoch}: {m}"
    );
    let a =
        wait_primary(&agent, lab.master_name(), &new.to_string(), Duration::from_secs(10)).await;
    assert_eq!(a["epoch"].as_u64(), Some(epoch), "{a}");
    let to = new.to_string();
    if let (Some(central_ms), Some(agent_ms)) =
        (switch_ms(&central, &to).await, switch_ms(&agent, &to).await)
    {
        let ms = agent_ms.saturating_sub(central_ms);
        eprintln!("EPOCH JUMP to {epoch}: the agent switched {ms} ms after the central polestar");
    }
    assert!(!agent.logged("refused"), "{}", agent.log_tail(30));
}

#[tokio::test]
async fn an_agent_follows_a_failover_whose_epoch_jumps_by_thousands() {
    an_agent_follows_a_failover_whose_epoch_jumps_to(5000).await;
}

#[tokio::test]
async fn an_agent_follows_a_failover_past_two_to_the_32() {
    an_agent_follows_a_failover_whose_epoch_jumps_to((1 << 32) + 5000).await;
}

/// `polestar_http_requests_total` of `route` (every code) as `ps` counts it.
async fn requests(ps: &Polestar, route: &str) -> u64 {
    let (_, text) = ps.get_text("/metrics").await.expect("metrics");
    let label = format!("route=\"{route}\"");
    text.lines()
        .filter(|l| l.starts_with("polestar_http_requests_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// docs/decisions.md D30: 10,000 agents on one polestar each read `GET /v1/masters` after every
/// event (49 us of polestar's CPU per agent per change, p99 0.5 s at 9,800). Now the stream
/// carries the masters: a real failover reaches the agent from its stream alone, and the
/// upstream serves the agent no `GET /v1/masters` at all (the old agent read it at the start
/// and after every event: this fails with it).
#[tokio::test]
async fn an_agent_applies_a_failover_from_the_stream_without_reading_the_masters() {
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    let central = Polestar::start(&PolestarConfig::for_lab(&lab)).await;
    let agent = Polestar::start(&PolestarConfig::agent(lab.master_name(), &[central.api()])).await;
    let old = lab.primary().await.expect("primary");
    wait_primary(&agent, lab.master_name(), &old.to_string(), STARTUP).await;
    assert!(agent.logged("from the event stream"), "{}", agent.log_tail(30));

    lab.failover().await.expect("SENTINEL FAILOVER");
    let new = lab.wait_for_primary_change(old, FAILOVER * 2).await.expect("a new primary");
    let m = wait_primary(&central, lab.master_name(), &new.to_string(), FAILOVER).await;
    let a = wait_primary(&agent, lab.master_name(), &new.to_string(), FAILOVER).await;
    assert_eq!(a["epoch"], m["epoch"], "{a}");
    let (streams, reads) =
        (requests(&central, "/v1/events/stream").await, requests(&central, "/v1/masters").await);
    eprintln!("AGENT FEED: {streams} stream(s), {reads} GET /v1/masters served to the agent");
    assert!(streams >= 1, "the agent's stream is counted");
    assert_eq!(reads, 0, "the agent read the state instead of applying the stream");
    assert!(!agent.logged("refused"), "{}", agent.log_tail(30));
}

/// A new agent against a polestar without the masters feed (the fake upstream's stream is
/// the old one: events and no `polestar-masters` header): it falls back to reading
/// `GET /v1/masters` at the start and on every event, and follows a failover that way.
#[tokio::test]
async fn an_agent_follows_an_upstream_without_the_masters_feed_by_reading_again() {
    use fake::{Script, master};
    use serde_json::json;

    let script = Arc::new(Script::default());
    script.set(0, Some(json!([master("mymaster", 16379, 1, &[16380])])));
    let (url, fake_task) = fake::start(script.clone()).await;
    let agent =
        Polestar::start(&PolestarConfig::agent("mymaster", std::slice::from_ref(&url))).await;
    wait_primary(&agent, "mymaster", "127.0.0.1:16379", STARTUP).await;
    assert!(agent.logged("the upstream has no feed"), "{}", agent.log_tail(30));
    script.set(1, Some(json!([master("mymaster", 16380, 2, &[16379])])));
    wait_primary(&agent, "mymaster", "127.0.0.1:16380", FAILOVER).await;
    assert!(script.reads(0) >= 1 && script.reads(1) >= 1, "the agent read the state");
    fake_task.abort();
}

/// An upstream whose stream carries the masters but sends a change that does not follow from
/// what it sent before (after version 7, where 1 was the last): the agent applies none of it,
/// drops the stream and starts again from a new subscription's full list, never reading
/// `GET /v1/masters`.
#[tokio::test]
async fn an_agent_drops_a_stream_whose_change_does_not_follow_and_starts_again() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::body::{Body, Bytes};
    use axum::extract::State;
    use axum::routing::get;
    use futures::StreamExt;
    use serde_json::json;

    #[derive(Default)]
    struct Counts {
        streams: AtomicUsize,
        reads: AtomicUsize,
    }
    fn event(data: Value) -> Result<Bytes, std::io::Error> {
        Ok(Bytes::from(format!("event: masters\ndata: {data}\n\n")))
    }
    async fn stream(State(counts): State<Arc<Counts>>) -> axum::response::Response {
        counts.streams.fetch_add(1, Ordering::SeqCst);
        let full = json!({"version": 1, "masters": [fake::master("mymaster", 16379, 1, &[16380])]});
        let gap = json!({"version": 8, "after": 7, "masters": [fake::master("mymaster", 16380, 2, &[16379])]});
        let frames =
            futures::stream::iter([event(full)]).chain(futures::stream::once(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                event(gap)
            }));
        let frames = frames.chain(futures::stream::pending());
        let mut response = axum::response::IntoResponse::into_response(Body::from_stream(frames));
        response.headers_mut().insert("polestar-masters", "1".parse().unwrap());
        response
    }
    async fn masters(State(counts): State<Arc<Counts>>) -> &'static str {
        counts.reads.fetch_add(1, Ordering::SeqCst);
        "[]"
    }

    let counts = Arc::new(Counts::default());
    let app = axum::Router::new()
        .route("/v1/events/stream", get(stream))
        .route("/v1/masters", get(masters))
        .with_state(counts.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let agent =
        Polestar::start(&PolestarConfig::agent("mymaster", std::slice::from_ref(&url))).await;
    wait_primary(&agent, "mymaster", "127.0.0.1:16379", STARTUP).await;
    let end = Instant::now() + FAILOVER;
    while counts.streams.load(Ordering::SeqCst) < 3 || !agent.logged("after version 7") {
        assert!(Instant::now() < end, "the agent did not start again:\n{}", agent.log_tail(30));
        tokio::time::sleep(POLL).await;
    }
    let m = agent.master("mymaster").await.expect("the agent answers");
    assert_eq!(primary_of_view(&m).as_deref(), Some("127.0.0.1:16379"), "{m}");
    assert_eq!(counts.reads.load(Ordering::SeqCst), 0, "the agent read GET /v1/masters");
    server.abort();
}

// ---------------------------------------------------------------------------------------------
// Issue 36, item 3: an agent took DNS labels from one upstream. Two real central polestars on
// real Sentinels, and one liar listed first whose `/v1/masters` adds a master named `!` (sorted
// before every real name) claiming the label `mymaster`, with one healthy replica at the
// attacker's address; then gives the real master another label. Measured before: the agent's
// `mymaster.<zone>` answered SERVFAIL and `replicas.mymaster.<zone>` the attacker's address.

/// The attacker's address, which no lab node has.
const ATTACKER: &str = "127.6.6.6";

/// `name.redis.test.` asked of the agent's DNS over UDP.
async fn ask(
    agent: &Polestar,
    name: &str,
    rtype: hickory_proto::rr::RecordType,
) -> hickory_proto::op::Message {
    let dns = agent.dns.expect("the agent serves DNS");
    crate::dns_support::ask_udp(dns, &format!("{name}.redis.test."), rtype).await
}

/// What the agent's DNS answers for `mymaster`: the rcode of the A query, the SRV port, and
/// the addresses of `replicas.mymaster`.
async fn mymaster_by_dns(agent: &Polestar) -> (String, Option<u16>, Vec<String>) {
    use hickory_proto::rr::{RData, RecordType};
    let a = ask(agent, "mymaster", RecordType::A).await;
    let srv = ask(agent, "_redis._tcp.mymaster", RecordType::SRV).await;
    let port = srv.answers.iter().find_map(|r| match &r.data {
        RData::SRV(srv) => Some(srv.port),
        _ => None,
    });
    let replicas = ask(agent, "replicas.mymaster", RecordType::A).await;
    let ips = replicas.answers.iter().map(|r| r.data.to_string()).collect();
    (format!("{:?}", a.metadata.response_code), port, ips)
}

/// For `watch`, the agent's DNS answers the lab's primary under `mymaster` (NOERROR, its SRV
/// port), and `replicas.mymaster` lab addresses only.
async fn dns_stays_right(agent: &Polestar, primary: std::net::SocketAddr, watch: Duration) {
    let end = Instant::now() + watch;
    while Instant::now() < end {
        let (rcode, port, replicas) = mymaster_by_dns(agent).await;
        assert_eq!(rcode, "NoError", "mymaster.redis.test:\n{}", agent.log_tail(30));
        assert_eq!(port, Some(primary.port()), "the SRV port of mymaster");
        assert!(!replicas.iter().any(|r| r == ATTACKER), "replicas.mymaster: {replicas:?}");
        assert!(replicas.iter().all(|r| r == "127.0.0.1"), "replicas.mymaster: {replicas:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A lab, two central polestars on it, the liar (listed first) serving what `lie` makes of the
/// real `GET /v1/masters`, and an agent of every master serving DNS, once it names the lab's
/// primary and has read the liar a few times.
struct Liar {
    agent: Polestar,
    primary: std::net::SocketAddr,
    _centrals: [Polestar; 2],
    _lab: Lab,
    task: tokio::task::JoinHandle<()>,
}

impl Liar {
    async fn start(lie: impl FnOnce(Vec<Value>) -> Vec<Value>) -> Liar {
        let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
        let first = Polestar::start(&PolestarConfig::for_lab(&lab)).await;
        let second = Polestar::start(&PolestarConfig::for_lab(&lab)).await;
        let primary = lab.primary().await.expect("the lab's primary");
        wait_primary(&first, "mymaster", &primary.to_string(), STARTUP).await;
        wait_primary(&second, "mymaster", &primary.to_string(), STARTUP).await;
        let (_, real) = first.get_json("/v1/masters").await.expect("GET /v1/masters");
        let real = real.as_array().cloned().expect("a list of masters");
        let script = Arc::new(fake::Script::default());
        script.set(0, Some(Value::Array(lie(real))));
        let (liar, task) = fake::start(script.clone()).await;
        let mut config = PolestarConfig::agent("mymaster", &[liar, first.api(), second.api()]);
        config.masters = Vec::new(); // every master, under the labels the upstreams give
        config.dns = true;
        let agent = Polestar::start(&config).await;
        wait_primary(&agent, "mymaster", &primary.to_string(), STARTUP).await;
        wait_reads(&script, 0, &agent).await;
        Liar { agent, primary, _centrals: [first, second], _lab: lab, task }
    }
}

impl Drop for Liar {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn a_liar_listed_first_adding_a_master_named_bang_with_the_label_mymaster_takes_no_dns_name()
{
    use serde_json::json;

    let bang = json!({
        "name": "!", "dns_name": "mymaster", "primary": null, "epoch": null, "since": null,
        "state": "unknown",
        "replicas": [{"ip": ATTACKER, "port": 6379, "healthy": true}],
        "sentinels": {"configured": 3, "reachable": 3, "agreeing": 3},
    });
    let liar = Liar::start(|real| [vec![bang], real].concat()).await;
    let agent = &liar.agent;
    let (rcode, port, replicas) = mymaster_by_dns(agent).await;
    eprintln!("LIAR `!`: mymaster.redis.test {rcode}, SRV port {port:?}, replicas {replicas:?}");
    dns_stays_right(agent, liar.primary, Duration::from_secs(3)).await;
    let (code, _) = agent.get_json("/v1/masters/!").await.expect("GET /v1/masters/!");
    assert_eq!(code, 404, "a master only the liar names is published");
    assert!(agent.logged("fewer than a majority"), "{}", agent.log_tail(30));
}

/// The liar, the first `ok` view of mymaster, gives it the label `beta` (with two masters, the
/// label of the other: its clients would write into this one).
#[tokio::test]
async fn a_liar_listed_first_labelling_mymaster_beta_moves_no_dns_name() {
    use hickory_proto::rr::RecordType;
    use serde_json::json;

    let relabel = |real: Vec<Value>| {
        let relabelled = real.into_iter().map(|mut m| {
            m["dns_name"] = json!("beta");
            m
        });
        relabelled.collect()
    };
    let liar = Liar::start(relabel).await;
    let agent = &liar.agent;
    let beta = ask(agent, "beta", RecordType::A).await;
    let rcode = format!("{:?}", beta.metadata.response_code);
    eprintln!("LIAR relabel: beta.redis.test {rcode}");
    dns_stays_right(agent, liar.primary, Duration::from_secs(2)).await;
    assert_eq!(rcode, "NXDomain", "beta.redis.test: {beta:?}");
}
