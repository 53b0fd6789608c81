//! A configuration whose secret files every user can read: `polestar check` and `polestar run`
//! warn, naming the key and the file, and still accept it; private files get no warning.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_polestar");

fn write_config(dir: &Path, mode: u32) -> std::path::PathBuf {
    for name in ["admin.token", "sentinel.pass"] {
        let file = dir.join(name);
        std::fs::write(&file, "s3cret\n").expect("write the secret");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let config = dir.join("polestar.yaml");
    std::fs::write(
        &config,
        "sentinels: {addresses: ['127.0.0.1:9'], password_file: sentinel.pass}\n\
         http: {listen: '127.0.0.1:0', admin_token_file: admin.token}\n",
    )
    .expect("write the config");
    config
}

fn check(config: &Path) -> (i32, String) {
    let out = Command::new(BIN).args(["check", "-c"]).arg(config).output().expect("runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn check_warns_about_world_readable_secret_files() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let config = write_config(dir.path(), 0o644);
    let (code, stderr) = check(&config);
    assert_eq!(code, 0, "a warning is not an error: {stderr}");
    for key in ["http.admin_token_file", "sentinels.password_file"] {
        let line = stderr.lines().find(|l| l.contains(key)).unwrap_or_else(|| panic!("{stderr}"));
        assert!(line.contains("warning") && line.contains("readable by every user"), "{line}");
    }
    assert!(!stderr.contains("s3cret"), "the secret itself is never printed");
}

#[test]
fn check_is_quiet_about_private_secret_files() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let config = write_config(dir.path(), 0o600);
    let (code, stderr) = check(&config);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
}

#[test]
fn run_warns_about_world_readable_secret_files() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let config = write_config(dir.path(), 0o604);
    let mut child = Command::new(BIN)
        .args(["run", "-c"])
        .arg(&config)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let found = loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) if line.contains("admin_token_file") && line.contains("WARN") => break true,
            Ok(line) => seen.push(line),
            Err(_) if Instant::now() > deadline => break false,
            Err(_) => {}
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(found, "no warning in the log:\n{}", seen.join("\n"));
}
