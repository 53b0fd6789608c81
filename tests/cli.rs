//! The command line contract: `check` exit codes and problem lists, `status` and `wait`
//! against a daemon that watches a real cluster.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;

const QUICK: Duration = Duration::from_secs(30);
/// Demos prefer the fixed ports 8053 and 5353: one at a time (nextest's `demo` group does the
/// same across processes).
#[cfg(feature = "demo")]
static DEMO: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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

/// `polestar demo`: serves its own cluster, and Ctrl-C (SIGINT) removes every trace of it.
#[cfg(feature = "demo")]
#[tokio::test]
async fn demo_serves_a_cluster_and_ctrl_c_cleans_up() {
    let _one_demo = DEMO.lock().await;
    use nix::sys::signal::{Signal, kill};
    use std::process::{Command, Stdio};

    let mut child = Command::new(BIN)
        .arg("demo")
        .env("NO_COLOR", "1")
        // The hello ACL check's verdict per node (debug when it passes).
        .env("POLESTAR_LOG", "info,hickory_server=warn,polestar::sentinel::hello_acl=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("polestar demo starts");
    let (out, err) = (Lines::default(), Lines::default());
    collect_lines(child.stdout.take().expect("piped"), out.clone());
    collect_lines(child.stderr.take().expect("piped"), err.clone());
    let logs = || format!("stdout:\n{}\nstderr:\n{}", lock(&out).join("\n"), lock(&err).join("\n"));

    let (http, dir) = demo_ready(&mut child, &out, &err, logs).await;
    // The demo applies the README's ACL to its own nodes: polestar finds every one closed to
    // forged hellos, and the first screen carries no warning about the demo itself.
    let closed = "the default user may not publish Sentinel hellos";
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    while lock(&err).iter().filter(|l| l.contains(closed)).count() < 3 {
        assert!(tokio::time::Instant::now() < end, "not every node checked closed:\n{}", logs());
        tokio::time::sleep(POLL).await;
    }
    // The readiness poll asks every second: a few rounds for a blocker to show.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let warned = lock(&err).iter().any(|l| l.contains("WARN") || l.contains("hello_acl event"));
    assert!(!warned, "the demo's first screen warns:\n{}", logs());
    let body = reqwest::get(format!("http://{http}/v1/masters/mymaster/primary")).await;
    let body = body.expect("the demo's API answers").text().await.expect("a body");
    assert!(body.trim().parse::<std::net::SocketAddr>().is_ok(), "{body}\n{}", logs());
    assert!(dir.join("polestar.yaml").is_file(), "{}", logs());

    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    kill(pid, Signal::SIGINT).expect("SIGINT");
    let status = tokio::task::spawn_blocking(move || child.wait()).await.expect("join");
    assert_eq!(status.expect("reaped").code(), Some(0), "{}", logs());
    assert!(!dir.exists(), "{} is left behind", dir.display());
    assert!(no_process_works_in(&dir), "a process of the demo survived:\n{}", logs());
}

#[cfg(feature = "demo")]
type Lines = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// The demo's HTTP address and its directory, once it logged both and `ready`; panics with
/// `logs` when it exits first or takes more than a minute.
#[cfg(feature = "demo")]
async fn demo_ready(
    child: &mut std::process::Child,
    out: &Lines,
    err: &Lines,
    logs: impl Fn() -> String,
) -> (String, std::path::PathBuf) {
    let found = |lines: &Lines, prefix: &str| {
        lock(lines).iter().find_map(|l| Some(l[l.find(prefix)? + prefix.len()..].to_string()))
    };
    let end = tokio::time::Instant::now() + Duration::from_secs(60);
    let (http, dir) = loop {
        let http = found(err, "listening for HTTP on ").filter(|_| found(err, ": ready").is_some());
        if let (Some(http), Some(dir)) = (http, found(out, "cluster ready in ")) {
            break (http, dir);
        }
        assert!(tokio::time::Instant::now() < end, "demo not ready:\n{}", logs());
        assert!(child.try_wait().expect("try_wait").is_none(), "demo exited:\n{}", logs());
        tokio::time::sleep(POLL).await;
    };
    let http = http.split_whitespace().next().expect("an address").to_string();
    (http, std::path::PathBuf::from(dir.split_whitespace().next().expect("a directory")))
}

#[cfg(feature = "demo")]
fn no_process_works_in(dir: &Path) -> bool {
    let procs = std::fs::read_dir("/proc").expect("/proc");
    !procs
        .flatten()
        .any(|p| std::fs::read_link(p.path().join("cwd")).is_ok_and(|c| c.starts_with(dir)))
}

/// Found by a new user: `polestar demo 2>&1 | tee demo.log` and Ctrl-C in a terminal. The
/// SIGINT reaches the whole process group (tee and the demo's Redis processes too); the next
/// log line hit a pipe without reader, the logger panicked the signal task and polestar never
/// stopped. The group here gets the SIGINT a terminal sends; everything must be gone quickly.
#[cfg(feature = "demo")]
#[tokio::test]
async fn demo_wedged_on_ctrl_c_when_its_output_went_through_a_pipe() {
    let _one_demo = DEMO.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("demo.log");
    let line = format!("'{BIN}' demo 2>&1 | tee '{}' >/dev/null", log.display());
    let group = PipedGroup::spawn(&line);
    let text = group.wait_logged(&log, &[": ready", "cluster ready in "]).await;
    let lab_dir = text
        .lines()
        .find_map(|l| l.strip_prefix("cluster ready in "))
        .and_then(|rest| rest.split_whitespace().next())
        .map(std::path::PathBuf::from)
        .expect("the lab directory is printed");
    // Found with it: the guide named `polestar`, which `cargo run` does not put on the PATH.
    assert!(text.contains(&format!("{BIN} status --api")), "the guide names the binary:\n{text}");
    assert!(text.contains(&format!("{BIN} failover mymaster")), "{text}");

    group.interrupt_and_wait_gone(Duration::from_secs(10), &log).await;
    assert!(!lab_dir.exists(), "{} is left behind", lab_dir.display());
    assert!(no_process_works_in(&lab_dir), "a process of the demo survived");
}

/// Built without the `demo` feature (`--no-default-features`): the help lists no demo, and
/// asking for one says that this build has none and how to get one (exit 2, as a usage error).
#[cfg(not(feature = "demo"))]
#[tokio::test]
async fn without_the_demo_feature_polestar_demo_says_it_is_not_built_in() {
    let help = cli(&["--help"], QUICK).await;
    let listed =
        String::from_utf8_lossy(&help.stdout).lines().any(|l| l.trim().starts_with("demo"));
    assert!(!listed, "{}", shown(&help));
    let out = cli(&["demo"], QUICK).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(said.contains("built without the `demo` feature"), "{}", shown(&out));
    assert!(said.contains("cargo run --release -- demo"), "{}", shown(&out));
}

/// The same for the daemon: its log piped to a reader that the same Ctrl-C kills (a log pipe
/// or journald going away must never wedge it).
#[tokio::test]
async fn run_wedged_on_sigint_when_its_log_pipe_went_away() {
    let lab = polestar_lab::Lab::start(polestar_lab::LabOptions::default()).await.expect("lab");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("polestar.yaml");
    std::fs::write(&config, PolestarConfig::for_lab(&lab).yaml(dir.path())).expect("config");
    let log = dir.path().join("run.log");
    let line =
        format!("'{BIN}' run -c '{}' 2>&1 | tee '{}' >/dev/null", config.display(), log.display());
    let group = PipedGroup::spawn(&line);
    group.wait_logged(&log, &[": ready"]).await;
    group.interrupt_and_wait_gone(Duration::from_secs(10), &log).await;
}

/// Found running the demo through `tee`: the human log format wrote ANSI colour codes into a
/// pipe (and would into journald). Colours only go to a terminal.
#[tokio::test]
async fn logs_into_a_pipe_carried_ansi_colour_codes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("polestar.yaml");
    let yaml = "sentinels:\n  addresses: [\"127.0.0.1:9\"]\nhttp:\n  listen: \"127.0.0.1:0\"\n";
    std::fs::write(&config, yaml).expect("config");
    let log = dir.path().join("run.log");
    let file = std::fs::File::create(&log).expect("log file");
    let mut child = std::process::Command::new(BIN)
        .args(["run", "-c", &config.to_string_lossy()])
        .env_remove("NO_COLOR")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(file)
        .spawn()
        .expect("polestar runs");
    let end = tokio::time::Instant::now() + QUICK;
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("listening for HTTP on") || tokio::time::Instant::now() > end {
            break text;
        }
        tokio::time::sleep(POLL).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(text.contains("listening for HTTP on"), "no listening line:\n{text}");
    assert!(!text.contains('\u{1b}'), "colour codes in a pipe:\n{text:?}");
}

/// `sh -c LINE` as the leader of its own process group, as a shell runs a pipeline.
struct PipedGroup {
    child: std::process::Child,
    pgid: i32,
}

impl PipedGroup {
    fn spawn(line: &str) -> Self {
        use std::os::unix::process::CommandExt;
        let child = std::process::Command::new("sh")
            .args(["-c", line])
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .expect("sh runs");
        let pgid = i32::try_from(child.id()).expect("pid fits");
        Self { child, pgid }
    }

    /// Waits until the log file holds every one of `needles`; returns its text.
    async fn wait_logged(&self, log: &Path, needles: &[&str]) -> String {
        let end = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if needles.iter().all(|n| text.contains(n)) {
                return text;
            }
            assert!(tokio::time::Instant::now() < end, "not ready:\n{text}");
            tokio::time::sleep(POLL).await;
        }
    }

    /// SIGINT to the whole group (what Ctrl-C in a terminal does); every member must be gone
    /// within `deadline`.
    async fn interrupt_and_wait_gone(mut self, deadline: Duration, log: &Path) {
        use nix::sys::signal::{Signal, killpg};
        let pgid = nix::unistd::Pid::from_raw(self.pgid);
        killpg(pgid, Signal::SIGINT).expect("SIGINT to the group");
        let end = tokio::time::Instant::now() + deadline;
        loop {
            let _ = self.child.try_wait();
            let left = live_members(self.pgid);
            if left.is_empty() {
                return;
            }
            if tokio::time::Instant::now() > end {
                let _ = killpg(pgid, Signal::SIGKILL);
                let text = std::fs::read_to_string(log).unwrap_or_default();
                panic!("still running {deadline:?} after Ctrl-C: {left:?}\nlog:\n{text}");
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Processes of group `pgid` that have not exited (zombies of others count: nobody reaped
/// them, which is how the wedge showed).
fn live_members(pgid: i32) -> Vec<String> {
    let procs = std::fs::read_dir("/proc").expect("/proc");
    procs
        .flatten()
        .filter_map(|p| std::fs::read_to_string(p.path().join("stat")).ok())
        .filter_map(|stat| {
            // pid (comm) state ppid pgrp ...; comm may hold spaces, so split after ')'.
            let (head, rest) = stat.rsplit_once(") ")?;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let group: i32 = fields.get(2)?.parse().ok()?;
            let own_zombie = fields.first() == Some(&"Z")
                && fields.get(1)?.parse::<u32>().ok()? == std::process::id();
            (group == pgid && !own_zombie).then(|| head.to_string())
        })
        .collect()
}
