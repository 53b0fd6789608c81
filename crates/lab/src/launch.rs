//! Starting a process: the one way every lab (on loopback or in network namespaces), test,
//! bench and the demo starts a `redis-server`, `valkey-server` or Sentinel, and the way the
//! namespace labs start every other program too. The program comes from the [`Flavor`], the
//! process works in its directory (which is how `leftovers` recognises it), its output is
//! appended to a log file, and in a namespace it runs under `ip netns exec`.
//!
//! Children are `std::process::Child`, not tokio's: their owners kill and reap them from
//! `Drop`, which cannot await.

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Context;

use crate::flavor::{Flavor, Kind};

/// A process to start.
#[derive(Clone, Debug)]
pub struct Launch {
    program: PathBuf,
    args: Vec<OsString>,
    dir: PathBuf,
    /// Where stdout and stderr are appended; `None`: discarded.
    output: Option<PathBuf>,
    /// The network namespace to run in; `None`: this one.
    namespace: Option<String>,
}

impl Launch {
    /// `program`, working in `dir`.
    pub fn program(program: impl Into<PathBuf>, dir: impl Into<PathBuf>) -> Self {
        let (program, dir) = (program.into(), dir.into());
        Self { program, args: Vec::new(), dir, output: None, namespace: None }
    }

    /// A process of `kind` of `flavor` on its `config` file, working in the config's directory.
    pub fn server(flavor: &Flavor, kind: Kind, config: &Path) -> Self {
        let (program, extra) = flavor.command(kind);
        let dir = config.parent().unwrap_or(Path::new(".")).to_path_buf();
        Self::program(program, dir).arg(config).args(extra)
    }

    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<S: Into<OsString>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Works in `dir` instead.
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = dir.into();
        self
    }

    /// Appends stdout and stderr to `path` (created if missing).
    pub fn output(mut self, path: impl Into<PathBuf>) -> Self {
        self.output = Some(path.into());
        self
    }

    /// Runs inside the network namespace `ns` (`ip netns exec ns ...`).
    pub fn in_namespace(mut self, ns: &str) -> Self {
        self.namespace = Some(ns.to_string());
        self
    }

    /// Starts it.
    pub fn spawn(&self) -> anyhow::Result<Child> {
        let mut command = self.command();
        let (stdout, stderr) = match &self.output {
            Some(path) => {
                let file = File::options().create(true).append(true).open(path);
                let file = file.with_context(|| format!("cannot open {}", path.display()))?;
                (Stdio::from(file.try_clone()?), Stdio::from(file))
            }
            None => (Stdio::null(), Stdio::null()),
        };
        command.current_dir(&self.dir).stdin(Stdio::null()).stdout(stdout).stderr(stderr);
        command.spawn().with_context(|| format!("cannot start {}", self.program.display()))
    }

    fn command(&self) -> Command {
        let mut command = match &self.namespace {
            Some(ns) => {
                let mut ip = Command::new("ip");
                ip.args(["netns", "exec", ns]).arg(&self.program);
                ip
            }
            None => Command::new(&self.program),
        };
        command.args(&self.args);
        command
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(launch: &Launch) -> Vec<String> {
        let command = launch.command();
        let program = command.get_program().to_string_lossy().into_owned();
        let args = command.get_args().map(|a| a.to_string_lossy().into_owned());
        std::iter::once(program).chain(args).collect()
    }

    #[test]
    fn a_sentinel_of_valkey_in_a_namespace() {
        let flavor = Flavor::Valkey { server: "/v/valkey-server".into() };
        let launch = Launch::server(&flavor, Kind::Sentinel, Path::new("/lab/s0/sentinel.conf"));
        assert_eq!(launch.dir, Path::new("/lab/s0"));
        assert_eq!(
            words(&launch.clone().in_namespace("pst1x0-d1")),
            ["ip", "netns", "exec", "pst1x0-d1", "/v/valkey-server", "/lab/s0/sentinel.conf"]
                .into_iter()
                .chain(["--sentinel"])
                .collect::<Vec<_>>()
        );
        let redis = Launch::server(&Flavor::Redis, Kind::Server, Path::new("/lab/n0/redis.conf"));
        assert_eq!(
            words(&redis.arg("--replicaof")),
            ["redis-server", "/lab/n0/redis.conf", "--replicaof"]
        );
    }

    #[test]
    fn output_is_appended_and_a_missing_program_is_named() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let log = dir.path().join("out.log");
        std::fs::write(&log, "before\n").expect("write");
        let mut child = Launch::program("sh", dir.path())
            .args(["-c", "pwd; echo oops >&2"])
            .output(&log)
            .spawn()
            .expect("sh starts");
        assert!(child.wait().expect("waited").success());
        let text = std::fs::read_to_string(&log).expect("the log");
        assert!(text.starts_with("before\n") && text.contains("oops"), "{text}");
        let pwd = dir.path().canonicalize().expect("canonical");
        assert!(text.contains(&*pwd.to_string_lossy()), "{text}");
        let error = Launch::program("/no/such/program", dir.path()).spawn().expect_err("missing");
        assert!(format!("{error}").contains("/no/such/program"), "{error}");
    }
}
