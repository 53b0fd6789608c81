//! Agents (issue 13): an agent follows several upstream polestars (any one that answers
//! suffices), over https verified against `upstream.ca_file`, with the agent token; a wrong
//! token is refused with 401 and the agent says so; the upstream's HTTPS certificate is
//! reloaded on SIGHUP. Real Sentinels, the real binary for the upstream and the agent.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;
use polestar::lab::tls::Certs;
use polestar::lab::{Lab, LabOptions};
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
async fn an_agent_over_https_with_the_token_follows_a_failover_while_its_other_upstream_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(&dir.path().join("tls")).expect("certificates");
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    let up = upstream(&lab, &certs, dir.path()).await;
    let dead = format!("http://127.0.0.1:{}", polestar::lab::free_service_port().unwrap());
    let agent = agent(&lab, &certs, dir.path(), &[dead, up.api()], AGENT_TOKEN).await;
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
