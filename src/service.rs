//! systemd integration: the `sd_notify(3)` protocol for a `Type=notify` unit.
//!
//! systemd learns from these datagrams that polestar is serving (`READY=1`, so units ordered
//! after it start only then), that it is reloading or stopping, and that it is still alive
//! (`WATCHDOG=1`; a daemon whose runtime is wedged stops sending and systemd restarts it). The
//! protocol is one datagram per message on the unix socket named by `$NOTIFY_SOCKET`, so it is
//! written here rather than pulled in as a crate. Without systemd (`NOTIFY_SOCKET` unset) every
//! call does nothing, and a failure to send is logged at debug level and otherwise ignored:
//! notification is advice to the service manager, never a reason to stop serving.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// `READY=1`: listeners are bound and a first state is loaded (or a reload has finished).
pub fn ready() {
    notify("READY=1\nSTATUS=serving");
}

/// `RELOADING=1` with the monotonic timestamp that systemd 253+ expects for it.
pub fn reloading() {
    notify(&format!("RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading", monotonic_usec()));
}

/// `STOPPING=1`: the graceful stop has begun.
pub fn stopping() {
    notify("STOPPING=1\nSTATUS=stopping");
}

/// Sends `state` to `$NOTIFY_SOCKET`, if there is one.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    if let Err(e) = send(&path, state) {
        tracing::debug!("sd_notify to {}: {e}", path.to_string_lossy());
    }
}

fn send(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let socket = UnixDatagram::unbound()?;
    match path.as_bytes().strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            socket.send_to(state.as_bytes(), path)?;
        }
    }
    Ok(())
}

/// How often systemd wants `WATCHDOG=1`: `$WATCHDOG_USEC`, when `$WATCHDOG_PID` (if set) is us.
pub fn watchdog_timeout() -> Option<Duration> {
    let pid = std::env::var("WATCHDOG_PID").ok();
    if pid.is_some_and(|p| p.trim() != std::process::id().to_string()) {
        return None;
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// Sends `WATCHDOG=1` at half the watchdog timeout until `shutdown` (only waits for it when
/// the unit has no watchdog: the daemon stops when any of its tasks ends). It runs as a task of the daemon's runtime, so it stops pinging when
/// that runtime stops making progress, which is what the watchdog is there to catch.
pub async fn watchdog(shutdown: CancellationToken) -> anyhow::Result<()> {
    let Some(timeout) = watchdog_timeout() else {
        shutdown.cancelled().await;
        return Ok(());
    };
    tracing::debug!("systemd watchdog every {timeout:?}: pinging at half that");
    let mut tick = tokio::time::interval(timeout / 2);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => notify("WATCHDOG=1"),
            _ = shutdown.cancelled() => return Ok(()),
        }
    }
}

fn monotonic_usec() -> u64 {
    use nix::time::{ClockId, clock_gettime};
    // CLOCK_MONOTONIC always exists on Linux; 0 only tells systemd the time is unknown.
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1_000)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_socket() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).expect("bind the fake notify socket");
        send(path.as_os_str(), "READY=1").expect("send");
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).expect("a datagram");
        assert_eq!(&buf[..n], b"READY=1");
    }

    #[test]
    fn sends_to_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("polestar-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .expect("a valid abstract name");
        let server = UnixDatagram::bind_addr(&addr).expect("bind the abstract socket");
        send(std::ffi::OsStr::new(&format!("@{name}")), "STOPPING=1").expect("send");
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).expect("a datagram");
        assert_eq!(&buf[..n], b"STOPPING=1");
    }

    #[test]
    fn the_monotonic_clock_is_read() {
        assert!(monotonic_usec() > 0);
    }
}
