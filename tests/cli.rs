//! The command line contract: `check` exit codes and problem lists, `status` and `wait`
//! against a daemon that watches a real cluster.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

const QUICK: Duration = Duration::from_secs(30);

#[tokio::test]
async fn check_accepts_the_example_config() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/polestar.yaml");
    let out = cli(&["check", "-c", &example.to_string_lossy()], QUICK).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert!(!out.stdout.is_empty(), "a one-line summary: {}", shown(&out));
}

#[tokio::test]
async fn check_lists_every_problem_of_a_bad_config() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("bad.yaml");
    let bad = "sentinels:\n  addresses: [\"not an address\"]\nhttp:\n  listen: nowhere\n\
               drain:\n  rate: 0\n  interval: soon\nbogus: 1\n";
    std::fs::write(&file, bad).expect("write the bad config");
    let out = cli(&["check", "-c", &file.to_string_lossy()], QUICK).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    let text = shown(&out);
    for path in ["sentinels.addresses", "http.listen", "drain.rate", "drain.interval", "bogus"] {
        assert!(text.contains(path), "{path} is not reported:\n{text}");
    }
    assert!(text.contains(&*file.to_string_lossy()), "the file is named:\n{text}");
}

#[tokio::test]
async fn check_on_a_missing_file_exits_2_and_names_it() {
    let out = cli(&["check", "-c", "/nonexistent/polestar.yaml"], QUICK).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    assert!(shown(&out).contains("/nonexistent/polestar.yaml"), "{}", shown(&out));
}

#[tokio::test]
async fn status_shows_each_master_with_its_primary() {
    let env = Env::start().await;
    let primary = env.lab.primary().await.expect("primary");
    let out = cli(&["status", "--api", &env.ps.api()], QUICK).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("mymaster"), "{}", shown(&out));
    assert!(text.contains(&primary.to_string()), "{}", shown(&out));
    assert!(text.contains("ok"), "{}", shown(&out));
}

#[tokio::test]
async fn wait_returns_the_new_primary_after_a_failover() {
    let env = Env::start().await;
    let epoch = epoch_of(&env.master().await.expect("master")).expect("epoch");
    let api = env.ps.api();
    let after = epoch.to_string();
    let args = ["wait", "mymaster", "--after", &after, "--timeout", "60s", "--api", &api];
    let (out, new) = tokio::join!(cli(&args, Duration::from_secs(90)), env.failover());
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(printed.trim(), new.to_string(), "{}", shown(&out));
}

#[tokio::test]
async fn wait_without_a_change_times_out_with_an_error() {
    let env = Env::start().await;
    let epoch = epoch_of(&env.master().await.expect("master")).expect("epoch");
    let (api, after) = (env.ps.api(), epoch.to_string());
    let args = ["wait", "mymaster", "--after", &after, "--timeout", "1s", "--api", &api];
    let out = cli(&args, QUICK).await;
    assert_ne!(out.status.code(), Some(0), "{}", shown(&out));
}

#[tokio::test]
async fn status_against_no_api_fails_naming_the_address() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let api = format!("http://127.0.0.1:{port}");
    let out = cli(&["status", "--api", &api], QUICK).await;
    assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
    assert!(shown(&out).contains(&format!("127.0.0.1:{port}")), "{}", shown(&out));
}
