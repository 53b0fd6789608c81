//! The config files of the lab's processes: fast Sentinel timings on loopback.

use std::fmt::Write;

use super::LabOptions;
use super::process::Proc;

/// Common lines: loopback only, no persistence, logs in the process's directory, and the
/// config path in the process title (handy in `ps`).
fn common(proc: &Proc) -> String {
    format!(
        "bind 127.0.0.1\nport {port}\ndaemonize no\ndir {dir}\nlogfile {log}\n\
         proc-title-template \"{{title}} {{listen-addr}} {{server-mode}} {{config-file}}\"\n",
        port = proc.port,
        dir = proc.dir.display(),
        log = proc.log_path().display(),
    )
}

/// A data node; `primary` is the port of the node it replicates (none for the first primary).
pub fn server(proc: &Proc, primary: Option<u16>, opts: &LabOptions) -> String {
    let mut text = common(proc);
    // No RDB on disk and no delay before a full sync: replicas attach in milliseconds.
    text.push_str("save \"\"\nappendonly no\nrepl-diskless-sync yes\n");
    text.push_str("repl-diskless-sync-delay 0\nrepl-ping-replica-period 1\n");
    if opts.hostnames {
        text.push_str("replica-announce-ip localhost\n");
    }
    if let Some(port) = primary {
        let _ = writeln!(text, "replicaof {} {port}", host(opts));
    }
    text
}

/// A Sentinel monitoring the master at `primary`.
pub fn sentinel(proc: &Proc, primary: u16, opts: &LabOptions) -> String {
    let name = &opts.master_name;
    let mut text = common(proc);
    if opts.hostnames {
        text.push_str("sentinel resolve-hostnames yes\nsentinel announce-hostnames yes\n");
        text.push_str("sentinel announce-ip localhost\n");
    }
    let _ = writeln!(text, "sentinel monitor {name} {} {primary} {}", host(opts), opts.quorum);
    let _ =
        writeln!(text, "sentinel down-after-milliseconds {name} {}", opts.down_after.as_millis());
    let _ =
        writeln!(text, "sentinel failover-timeout {name} {}", opts.failover_timeout.as_millis());
    let _ = writeln!(text, "sentinel parallel-syncs {name} 1");
    if opts.current_epoch > 0 {
        let _ = writeln!(text, "sentinel current-epoch {}", opts.current_epoch);
    }
    text
}

fn host(opts: &LabOptions) -> &'static str {
    if opts.hostnames { "localhost" } else { "127.0.0.1" }
}
