//! The config files of lab processes, written one way for every lab (on loopback or in network
//! namespaces), test, bench and the demo: the common lines, then the pieces a data node or a
//! Sentinel adds. Pure text; [`write`] puts it where the process expects it.

use std::fmt::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use crate::LabOptions;
use crate::flavor::Kind;

/// Where a process listens and keeps its files.
#[derive(Clone, Debug)]
pub struct Listen {
    pub ip: IpAddr,
    pub port: u16,
    /// Its directory (redis chdirs into it: see `leftovers`).
    pub dir: PathBuf,
    /// Its log file; `None`: standard output, which the launcher captures.
    pub logfile: Option<PathBuf>,
}

/// No RDB on disk, no AOF.
pub const NO_PERSISTENCE: &str = "save \"\"\nappendonly no\n";
/// No RDB on disk and no delay before a full sync: replicas attach in milliseconds.
pub const DISKLESS_SYNC: &str = "repl-diskless-sync yes\nrepl-diskless-sync-delay 0\n";

/// Common lines: the address (protected mode off off loopback: a lab has no passwords), no
/// daemon, the directory and the log, and the config path in the process title (handy in `ps`).
pub fn common(listen: &Listen) -> String {
    let mut text = format!("bind {}\n", listen.ip);
    if !listen.ip.is_loopback() {
        text.push_str("protected-mode no\n");
    }
    let _ = writeln!(text, "port {}\ndaemonize no\ndir {}", listen.port, listen.dir.display());
    if let Some(log) = &listen.logfile {
        let _ = writeln!(text, "logfile {}", log.display());
    }
    text.push_str("proc-title-template \"{title} {listen-addr} {server-mode} {config-file}\"\n");
    text
}

/// A data node of a lab: no persistence, diskless sync, a replication ping every second, and
/// `replicaof` when it has a primary (`host`, `port`).
pub fn data_node(listen: &Listen, primary: Option<(&str, u16)>) -> String {
    let mut text = common(listen) + NO_PERSISTENCE + DISKLESS_SYNC;
    text.push_str("repl-ping-replica-period 1\n");
    if let Some((host, port)) = primary {
        text += &replica_of(host, port);
    }
    text
}

pub fn replica_of(host: &str, port: u16) -> String {
    format!("replicaof {host} {port}\n")
}

/// What a Sentinel monitors, and its timings for that master.
#[derive(Clone, Debug)]
pub struct Monitor {
    pub name: String,
    /// The first primary, as an IP or (with `resolve-hostnames`) a name.
    pub host: String,
    pub port: u16,
    pub quorum: usize,
    pub down_after: Duration,
    pub failover_timeout: Duration,
    pub parallel_syncs: usize,
}

/// `sentinel monitor` and the master's timings.
pub fn monitor(m: &Monitor) -> String {
    let name = &m.name;
    format!(
        "sentinel monitor {name} {} {} {}\nsentinel down-after-milliseconds {name} {}\n\
         sentinel failover-timeout {name} {}\nsentinel parallel-syncs {name} {}\n",
        m.host,
        m.port,
        m.quorum,
        m.down_after.as_millis(),
        m.failover_timeout.as_millis(),
        m.parallel_syncs
    )
}

/// A Sentinel watching one master.
pub fn sentinel(listen: &Listen, m: &Monitor) -> String {
    common(listen) + &monitor(m)
}

/// Writes `text` as the config file of a process of `kind` in `dir` (created if missing); the
/// program rewrites it later (`CONFIG REWRITE`, a Sentinel's state).
pub fn write(dir: &Path, kind: Kind, text: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(kind.config_name());
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// A loopback lab's data node; `primary` is the port of the node it replicates.
pub(crate) fn lab_node(listen: &Listen, primary: Option<u16>, opts: &LabOptions) -> String {
    let mut text = data_node(listen, primary.map(|port| (host(opts), port)));
    if opts.hostnames {
        text.push_str("replica-announce-ip localhost\n");
    }
    text
}

/// A loopback lab's Sentinel monitoring the master at `primary`.
pub(crate) fn lab_sentinel(listen: &Listen, primary: u16, opts: &LabOptions) -> String {
    let mut text = common(listen);
    // Before `sentinel monitor`, which names the primary `localhost` then.
    if opts.hostnames {
        text.push_str("sentinel resolve-hostnames yes\nsentinel announce-hostnames yes\n");
        text.push_str("sentinel announce-ip localhost\n");
    }
    text += &monitor(&Monitor {
        name: opts.master_name.clone(),
        host: host(opts).to_string(),
        port: primary,
        quorum: opts.quorum,
        down_after: opts.down_after,
        failover_timeout: opts.failover_timeout,
        parallel_syncs: 1,
    });
    if opts.current_epoch > 0 {
        let _ = writeln!(text, "sentinel current-epoch {}", opts.current_epoch);
    }
    text
}

fn host(opts: &LabOptions) -> &'static str {
    if opts.hostnames { "localhost" } else { "127.0.0.1" }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listen(ip: [u8; 4], logfile: Option<&str>) -> Listen {
        Listen { ip: ip.into(), port: 6379, dir: "/d".into(), logfile: logfile.map(PathBuf::from) }
    }

    #[test]
    fn common_lines_per_address_and_log() {
        let title = "proc-title-template \"{title} {listen-addr} {server-mode} {config-file}\"\n";
        let cases = [
            (
                listen([127, 0, 0, 1], Some("/d/redis.log")),
                "bind 127.0.0.1\nport 6379\ndaemonize no\ndir /d\nlogfile /d/redis.log\n",
            ),
            (
                listen([10, 77, 0, 11], None),
                "bind 10.77.0.11\nprotected-mode no\nport 6379\ndaemonize no\ndir /d\n",
            ),
        ];
        for (listen, expected) in cases {
            assert_eq!(common(&listen), format!("{expected}{title}"), "{listen:?}");
        }
    }

    #[test]
    fn a_replica_names_its_primary_and_a_primary_none() {
        let l = listen([127, 0, 0, 1], None);
        let primary = data_node(&l, None);
        assert!(primary.contains("save \"\"\nappendonly no\n"), "{primary}");
        assert!(primary.contains("repl-diskless-sync-delay 0\nrepl-ping-replica-period 1\n"));
        assert!(!primary.contains("replicaof"), "{primary}");
        let replica = data_node(&l, Some(("10.77.0.11", 6379)));
        assert!(replica.ends_with("replicaof 10.77.0.11 6379\n"), "{replica}");
    }

    #[test]
    fn monitor_lines() {
        let m = Monitor {
            name: "m".into(),
            host: "10.0.0.1".into(),
            port: 6379,
            quorum: 2,
            down_after: Duration::from_millis(1500),
            failover_timeout: Duration::from_secs(5),
            parallel_syncs: 1,
        };
        assert_eq!(
            monitor(&m),
            "sentinel monitor m 10.0.0.1 6379 2\nsentinel down-after-milliseconds m 1500\n\
             sentinel failover-timeout m 5000\nsentinel parallel-syncs m 1\n"
        );
    }

    #[test]
    fn hostnames_come_before_the_monitor_line_that_needs_them() {
        let opts = LabOptions { hostnames: true, current_epoch: 7, ..LabOptions::default() };
        let text = lab_sentinel(&listen([127, 0, 0, 1], None), 7000, &opts);
        let resolve = text.find("sentinel resolve-hostnames yes").expect("resolve-hostnames");
        let monitor = text.find("sentinel monitor mymaster localhost 7000 2").expect("monitor");
        assert!(resolve < monitor, "{text}");
        assert!(text.ends_with("sentinel current-epoch 7\n"), "{text}");
        let node = lab_node(&listen([127, 0, 0, 1], None), Some(7000), &opts);
        assert!(node.contains("replicaof localhost 7000\nreplica-announce-ip localhost\n"));
    }
}
