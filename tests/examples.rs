//! The shipped example configurations (conf/examples/, one per deployment shape): each passes
//! `polestar check` as shipped, but for its paths, pointed at a directory that holds the secrets
//! and certificates it names; a sweeper on a host that cannot destroy sockets, and a
//! configuration that would do nothing, fail `check` with every problem and its path.
//!
//! [`install`] is also how the deployment test (`deployment_netns`) runs the files: the text
//! as shipped, with addresses, ports and paths replaced, nothing added.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use polestar_lab::tls::Certs;

const BIN: &str = env!("CARGO_BIN_EXE_polestar");

/// Where the examples are, in the repository (and in the package, under
/// /usr/share/doc/polestar/examples/).
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/examples")
}

/// Every shipped example's file name.
pub fn names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .expect("conf/examples")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    names
}

/// Writes example `name` into `to`, its text as shipped with each `(from, to)` replaced in
/// order and `/etc/polestar/` replaced by `etc` (which [`secrets`] fills); returns its path.
pub fn install(
    name: &str,
    to: &Path,
    etc: &Path,
    replace: &[(String, String)],
) -> anyhow::Result<PathBuf> {
    let mut text = std::fs::read_to_string(dir().join(name))?;
    for (from, with) in replace {
        text = text.replace(from.as_str(), with);
    }
    text = text.replace("/etc/polestar/", &format!("{}/", etc.display()));
    let path = to.join(name);
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The secrets and certificates the examples name, in `etc` as an operator installs them
/// (private files): the agent token, the Sentinel endpoint's password, `tls/ca.pem` and the
/// HTTPS API's `tls/server.pem` / `tls/server.key` (signed by `certs`' CA).
pub fn secrets(etc: &Path, certs: &Certs, server: (&Path, &Path)) -> anyhow::Result<()> {
    std::fs::create_dir_all(etc.join("tls"))?;
    let private = |path: PathBuf, text: &[u8]| -> anyhow::Result<()> {
        std::fs::write(&path, text)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        Ok(())
    };
    private(etc.join("agent.token"), b"agent-t0ken-for-the-examples\n")?;
    private(etc.join("sentinel-api.pass"), b"endpoint-pa55\n")?;
    private(etc.join("tls/ca.pem"), &std::fs::read(&certs.ca)?)?;
    private(etc.join("tls/server.pem"), &std::fs::read(server.0)?)?;
    private(etc.join("tls/server.key"), &std::fs::read(server.1)?)?;
    Ok(())
}

/// `(exit code, stdout, stderr)` of `polestar check -c path`, run through `wrap` (a program
/// and its arguments before polestar's) when given.
fn check(path: &Path, wrap: &[&str]) -> (i32, String, String) {
    let mut command = match wrap.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(BIN);
            c
        }
        None => Command::new(BIN),
    };
    let out = command.args(["check", "-c"]).arg(path).output().expect("polestar check runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// The examples installed with their secrets in a fresh directory.
fn installed() -> (tempfile::TempDir, Vec<(String, PathBuf)>) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let certs = Certs::generate(&dir.path().join("certs")).expect("certificates");
    let ip = std::net::IpAddr::from([10, 0, 0, 1]);
    let server = Certs::server(&dir.path().join("certs"), "api", &[ip]).expect("a certificate");
    let etc = dir.path().join("etc");
    secrets(&etc, &certs, (&server.0, &server.1)).expect("the secrets");
    let files = names()
        .into_iter()
        .map(|name| {
            let path = install(&name, dir.path(), &etc, &[]).expect("installed");
            (name, path)
        })
        .collect();
    (dir, files)
}

fn sweeps(name: &str) -> bool {
    let text = std::fs::read_to_string(dir().join(name)).unwrap_or_default();
    text.contains("\nsweep:")
}

fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[test]
fn every_shipped_example_passes_check_and_says_what_it_does() {
    let (_dir, files) = installed();
    let shapes = [
        "agent-sentinels.yaml",
        "agent-upstreams.yaml",
        "central.yaml",
        "dns-only.yaml",
        "http-only.yaml",
        "node-sweeper.yaml",
        "sentinel-endpoint.yaml",
    ];
    for shape in shapes {
        assert!(files.iter().any(|(n, _)| n == shape), "conf/examples/{shape} is missing");
    }
    for (name, path) in &files {
        let (code, stdout, stderr) = check(path, &[]);
        if sweeps(name) && !root() {
            // Without CAP_NET_ADMIN a sweeper is refused (CI runs as root and checks it all).
            assert_eq!(code, 2, "{name}: {stdout}{stderr}");
            assert!(stderr.contains("cannot destroy sockets"), "{name}: {stderr}");
            continue;
        }
        assert_eq!(code, 0, "{name}: {stdout}{stderr}");
        assert!(stderr.is_empty(), "{name}: a shipped example warns: {stderr}");
        let line = stdout.trim();
        assert!(!line.contains('\n') && line.contains(": ok: follows "), "{name}: {line}");
        // One clause for each thing it does: at least one besides following.
        assert!(line.contains("; "), "{name} does nothing: {line}");
    }
    let central = files.iter().find(|(n, _)| n == "central.yaml").map(|(_, p)| p).unwrap();
    let (_, line, _) = check(central, &[]);
    for part in [
        "follows 3 Sentinel(s)",
        "serves DNS for redis.internal. on 10.0.0.1:53",
        "serves HTTPS on 10.0.0.1:8053",
        "drains old primaries",
    ] {
        assert!(line.contains(part), "{part:?} in {line}");
    }
    let agent = files.iter().find(|(n, _)| n == "agent-upstreams.yaml").map(|(_, p)| p).unwrap();
    if root() {
        let (_, line, _) = check(agent, &[]);
        assert!(line.contains("follows 3 upstream(s), 2 to agree (mymaster)"), "{line}");
        assert!(line.contains("aborts this host's sockets to old primaries"), "{line}");
        assert!(!line.contains("drains"), "an agent does not drain: {line}");
    }
}

/// `sweep` where this process may not destroy sockets: `run` would refuse to start, so
/// `check` refuses the file, naming each sweep key. Run without CAP_NET_ADMIN (setpriv drops it
/// from a root shell; as another user it is missing anyway).
#[test]
fn a_sweeper_that_cannot_destroy_sockets_fails_check() {
    let (_dir, files) = installed();
    let wrap: &[&str] = if root() {
        if Command::new("setpriv").arg("--version").output().is_err() {
            eprintln!("skipped: setpriv (util-linux) is not installed to drop CAP_NET_ADMIN");
            return;
        }
        &["setpriv", "--bounding-set", "-net_admin", "--inh-caps", "-net_admin"]
    } else {
        &[]
    };
    for (name, key) in
        [("node-sweeper.yaml", "sweep.local_ports"), ("agent-sentinels.yaml", "sweep.remote")]
    {
        let path = &files.iter().find(|(n, _)| n == name).unwrap().1;
        let (code, stdout, stderr) = check(path, wrap);
        assert_eq!(code, 2, "{name}: {stdout}{stderr}");
        let line = stderr.lines().find(|l| l.contains(key)).unwrap_or_else(|| panic!("{stderr}"));
        assert!(
            line.contains("cannot destroy sockets") && line.contains("CAP_NET_ADMIN"),
            "{line}"
        );
        assert!(line.starts_with(&*path.to_string_lossy()), "the file is named: {line}");
        assert!(stdout.is_empty(), "no summary for a refused file: {stdout}");
    }
}

/// A configuration that would start and serve no one: every section that cannot act is a
/// problem with its path, and `check` exits 2.
#[test]
fn a_configuration_that_does_nothing_fails_check_with_every_problem() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let cases = [
        (
            "no source: nothing to follow",
            "dns: {listen: ['127.0.0.1:53']}\n",
            &["sentinels: missing", "dns.zone: missing"][..],
        ),
        (
            "an agent that only watches",
            "upstream: {urls: ['https://10.0.0.1:8053']}\nsweep: {local_ports: []}\n",
            &["sweep: sweeps nothing", "(top level): follows its upstreams and does nothing"][..],
        ),
        (
            "a Sentinel follower with the drain off",
            "sentinels: {addresses: ['10.0.0.1:26379']}\ndrain: {enabled: false}\n",
            &["drain.enabled: false", "(top level): follows the Sentinels and does nothing"][..],
        ),
    ];
    for (what, text, wants) in cases {
        let path = dir.path().join("polestar.yaml");
        std::fs::write(&path, text).expect("write");
        let (code, stdout, stderr) = check(&path, &[]);
        assert_eq!(code, 2, "{what}: {stdout}{stderr}");
        for want in wants {
            let line = format!("{}: {want}", path.display());
            assert!(stderr.lines().any(|l| l.starts_with(&line)), "{what}: {want:?} in\n{stderr}");
        }
    }
}
