//! TLS to Sentinels and data nodes (docs/trust.md, "Credentials") against a TLS-only lab: every
//! redis-server and redis-sentinel listens on `tls-port` only (`port 0`), requires client
//! certificates and replicates over TLS, with certificates made by `openssl` in the lab's
//! directory. polestar follows a failover, fences the old primary and kills its TLS clients, and
//! DNS follows; a wrong CA or a missing client certificate is a reported, retried error (no panic,
//! `/readyz` 503 with the reason, `/healthz` 200) until the configuration is fixed and reloaded.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::ensure;
use common::*;
use nix::sys::signal::Signal;
use polestar::config::Tls;
use polestar_lab::tls::Certs;
use polestar_lab::{Lab, LabOptions};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

fn tls_line(tls: &Tls) -> String {
    let file = |f: &Option<std::path::PathBuf>| match f {
        Some(f) => format!("\"{}\"", f.display()),
        None => "null".into(),
    };
    format!(
        "tls: {{enabled: true, ca_file: {}, cert_file: {}, key_file: {}}}",
        file(&tls.ca_file),
        file(&tls.cert_file),
        file(&tls.key_file)
    )
}

async fn tls_lab() -> (Lab, Certs) {
    let lab = Lab::start(LabOptions { tls: true, ..LabOptions::default() })
        .await
        .expect("the TLS lab starts");
    let certs = lab.certs().expect("a TLS lab has certificates").clone();
    (lab, certs)
}

fn config(lab: &Lab, tls: &Tls) -> PolestarConfig {
    let mut config = PolestarConfig::for_lab(lab);
    config.masters = vec![(lab.master_name().to_string(), Some("cache".to_string()))];
    config.dns = true;
    config.drain = true;
    config.sentinel_settings = vec![tls_line(tls)];
    config
}

/// A TLS client of `addr` (not polestar's: no `lib-name`, no name) that sends PING and waits
/// until the server closes the connection. Returns once connected; the task ends when cut.
async fn tls_client(addr: SocketAddr, certs: &Certs) -> tokio::task::JoinHandle<()> {
    let config = polestar::tls::client_config(&client_tls(certs)).expect("client TLS config");
    let tcp = TcpStream::connect(addr).await.expect("connect to the primary");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("an IP server name");
    let mut stream = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .expect("TLS handshake with the primary");
    stream.write_all(b"PING\r\n").await.expect("send PING");
    let mut buf = [0u8; 64];
    let n = timeout(Duration::from_secs(5), stream.read(&mut buf)).await.expect("PONG in time");
    assert!(n.expect("read PONG") > 0, "the primary answers the TLS client");
    tokio::spawn(async move {
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                return;
            }
        }
    })
}

async fn events_of(env: &Env, kind: &str) -> Vec<Value> {
    let (_, events) = env.ps.get_json("/v1/events").await.expect("events");
    events.as_array().into_iter().flatten().filter(|e| e["kind"] == kind).cloned().collect()
}

#[tokio::test]
async fn over_tls_a_failover_is_followed_the_old_primary_fenced_its_tls_clients_cut_and_dns_follows()
 {
    let (lab, certs) = tls_lab().await;
    let config = config(&lab, &client_tls(&certs));
    let env = Env::with_config(lab, &config).await;
    let old = env.lab.primary().await.expect("primary");
    let dns = env.ps.dns.expect("DNS listener");
    assert_eq!(resolve_srv(dns).await.expect("DNS answers"), old);
    let client = tls_client(old, &certs).await;

    env.lab.failover().await.expect("SENTINEL FAILOVER");
    let new = env.lab.wait_for_primary_change(old, FAILOVER * 2).await.expect("failover");
    env.wait_api_primary(new, FAILOVER).await;
    env.wait_until(FAILOVER, "DNS names the new primary", || async {
        let answer = resolve_srv(dns).await?;
        ensure!(answer == new, "DNS answers {answer}");
        Ok(())
    })
    .await;
    timeout(FAILOVER, client).await.expect("the TLS client of the old primary is cut").ok();
    env.wait_until(FAILOVER, "fence and drain events for the old primary", || async {
        let node = old.to_string();
        let fenced = events_of(&env, "fence").await.iter().any(|e| e["node"] == node);
        let drained = events_of(&env, "drain").await.iter().any(|e| e["node"] == node);
        ensure!(fenced && drained, "fence {fenced}, drain {drained}");
        Ok(())
    })
    .await;
    assert!(!env.ps.logged("panicked"), "{}", env.ps.log_tail(60));
}

/// `/readyz` is 503 with reasons containing one of `want` and none of `not`, `/healthz` 200,
/// and nothing panicked.
async fn wait_unready(env: &Polestar, want: &[&str], not: &[&str]) -> Value {
    let end = tokio::time::Instant::now() + FAILOVER;
    loop {
        let (health, _) = env.get_json("/healthz").await.expect("healthz answers");
        assert_eq!(health, 200);
        let (code, body) = env.get_json("/readyz").await.expect("readyz answers");
        let reasons = body["reasons"].to_string();
        let wanted = want.iter().any(|w| reasons.contains(w));
        if code == 503 && wanted && !not.iter().any(|n| reasons.contains(n)) {
            assert!(!env.logged("panicked"), "{}", env.log_tail(60));
            return body;
        }
        if tokio::time::Instant::now() > end {
            panic!("readyz {code} {body}, wanted one of {want:?}:\n{}", env.log_tail(60));
        }
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test]
async fn a_wrong_ca_or_a_missing_client_certificate_is_reported_and_retried_until_a_reload_fixes_it()
 {
    let (lab, certs) = tls_lab().await;
    let wrong_ca = Tls { ca_file: Some(certs.other_ca.clone()), ..client_tls(&certs) };
    let ps = Polestar::start(&config(&lab, &wrong_ca)).await;
    let body = wait_unready(&ps, &["invalid peer certificate: UnknownIssuer"], &[]).await;
    let sentinel = lab.sentinel_addrs()[0].to_string();
    assert!(body["reasons"].to_string().contains(&sentinel), "the address is named: {body}");
    assert!(ps.logged("cannot connect (retrying)"), "{}", ps.log_tail(60));

    // The right CA, but no client certificate: the Sentinels refuse us.
    let no_cert = Tls { cert_file: None, key_file: None, ..client_tls(&certs) };
    std::fs::write(&ps.config_path, config(&lab, &no_cert).yaml(ps.config_path.parent().unwrap()))
        .unwrap();
    ps.signal(Signal::SIGHUP);
    let body = wait_unready(&ps, &["CertificateRequired"], &["UnknownIssuer"]).await;
    let sentinel = lab.sentinel_addrs()[1].to_string();
    assert!(body["reasons"].to_string().contains(&sentinel), "the address is named: {body}");

    // Fixed: it connects and serves the primary.
    let good = config(&lab, &client_tls(&certs));
    std::fs::write(&ps.config_path, good.yaml(ps.config_path.parent().unwrap())).unwrap();
    ps.signal(Signal::SIGHUP);
    let primary = lab.primary().await.expect("primary");
    let env = Env { ps, lab };
    env.wait_api_primary(primary, STARTUP).await;
    env.wait_state("ok", STARTUP).await;
    let (code, body) = env.ps.get_json("/readyz").await.expect("readyz");
    assert_eq!(code, 200, "{body}");
}

#[tokio::test]
async fn check_builds_every_tls_configuration_and_names_a_bad_pem() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(&dir.path().join("tls")).expect("certificates");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64\n").unwrap();
    let text = format!(
        "sentinels: {{addresses: ['127.0.0.1:26379'], tls: {{enabled: true, ca_file: '{}'}}}}\n\
         nodes: {{tls: {{enabled: true, ca_file: '{}', cert_file: '{}', key_file: '{}'}}}}\n\
         http: {{listen: '127.0.0.1:0', tls: {{cert_file: '{}', key_file: '{}'}}}}\n",
        garbage.display(),
        certs.ca.display(),
        certs.client_cert.display(),
        certs.node_key.display(),
        certs.node_cert.display(),
        certs.node_key.display(),
    );
    let file = dir.path().join("polestar.yaml");
    std::fs::write(&file, text).unwrap();
    let out = std::process::Command::new(BIN).args(["check", "-c"]).arg(&file).output().unwrap();
    let shown = shown(&out);
    assert_eq!(out.status.code(), Some(2), "{shown}");
    assert!(shown.contains("sentinels.tls: ") && shown.contains("garbage.pem"), "{shown}");
    // A client certificate with another certificate's key.
    assert!(shown.contains("nodes.tls: ") && shown.contains("do not go together"), "{shown}");
    assert!(!shown.contains("http.tls"), "the good server certificate passes: {shown}");
}
