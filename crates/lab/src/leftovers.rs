//! Cleaning up after labs whose owner died without running `Drop` (SIGKILL, a test timeout).
//!
//! Children cannot be tied to the owner's life (`PR_SET_PDEATHSIG` needs `unsafe` in
//! `pre_exec`), so every lab directory records its owner, and each new lab kills the processes
//! of labs whose owner is gone. A process belongs to a lab when its working directory is inside
//! that lab's directory: redis chdirs into its `dir`, and the test harness starts polestar
//! there. Only processes named like ours, inside a directory with our prefix, whose owner is
//! provably dead (or whose directory was deleted) are touched; a lab of a concurrently running
//! test process is left alone.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The prefix of every lab directory under the system temp dir.
pub const PREFIX: &str = "polestar-lab-";
/// Records `pid starttime` of the owning process.
const OWNER_FILE: &str = "owner";
/// Programs a lab starts; nothing else is ever killed.
const OURS: [&str; 4] = ["redis-server", "redis-sentinel", "valkey-server", "polestar"];
/// A directory without an owner file younger than this may be a lab being set up right now.
const SETUP_GRACE: Duration = Duration::from_secs(120);

/// Creates a fresh lab directory owned by this process.
pub fn new_dir() -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new().prefix(PREFIX).tempdir()?;
    let me = std::process::id();
    let start = start_time(me).unwrap_or_default();
    fs::write(dir.path().join(OWNER_FILE), format!("{me} {start}\n"))?;
    Ok(dir)
}

/// Kills the processes of dead labs and removes their directories.
pub fn clean() {
    let stale: Vec<PathBuf> = lab_dirs().into_iter().filter(|d| is_stale(d)).collect();
    for pid in all_pids() {
        if pid != std::process::id() && is_ours(pid) && belongs_to_dead_lab(pid, &stale) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
    for dir in stale {
        let _ = fs::remove_dir_all(dir);
    }
}

fn lab_dirs() -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else { return Vec::new() };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(PREFIX))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect()
}

fn is_stale(dir: &Path) -> bool {
    match fs::read_to_string(dir.join(OWNER_FILE)) {
        Ok(text) => !owner_alive(&text),
        Err(_) => older_than(dir, SETUP_GRACE),
    }
}

fn owner_alive(text: &str) -> bool {
    let mut fields = text.split_whitespace();
    let pid = fields.next().and_then(|p| p.parse::<u32>().ok());
    let start = fields.next().and_then(|s| s.parse::<u64>().ok());
    match (pid, start) {
        // Same pid and same start time: the very process, not a reuse of its pid.
        (Some(pid), Some(start)) => start_time(pid) == Some(start),
        _ => false,
    }
}

fn older_than(dir: &Path, age: Duration) -> bool {
    let modified = fs::metadata(dir).and_then(|m| m.modified());
    modified.is_ok_and(|t| SystemTime::now().duration_since(t).is_ok_and(|d| d > age))
}

fn all_pids() -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
}

fn is_ours(pid: u32) -> bool {
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    OURS.contains(&comm.trim())
}

/// Whether the process works inside a stale lab, or inside a deleted lab directory.
fn belongs_to_dead_lab(pid: u32, stale: &[PathBuf]) -> bool {
    let Ok(cwd) = fs::read_link(format!("/proc/{pid}/cwd")) else { return false };
    let text = cwd.to_string_lossy();
    let in_temp = cwd.strip_prefix(std::env::temp_dir()).ok();
    let in_lab = in_temp.is_some_and(|rest| rest.to_string_lossy().starts_with(PREFIX));
    in_lab && (text.ends_with(" (deleted)") || stale.iter().any(|d| cwd.starts_with(d)))
}

/// The process's start time in clock ticks since boot (field 22 of `/proc/PID/stat`).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_start_time_is_known_and_owner_alive() {
        let me = std::process::id();
        let start = start_time(me).expect("own /proc/self/stat is readable");
        assert!(owner_alive(&format!("{me} {start}")));
        assert!(!owner_alive(&format!("{me} {}", start + 1)));
        assert!(!owner_alive("garbage"));
    }
}
