//! glibc malloc, set for a daemon whose heap is a steady state plus a periodic peak. Every
//! reconciliation and readiness round (every 10 s at 1,000 masters) allocates a few MB of
//! replies and frees them; by default each runtime worker thread gets an arena of its own and
//! every arena keeps the pages of the largest peak it held, so at 1,000 masters the process
//! held 36 MB of anonymous memory for about 23 MB in use. One arena for the process, and the
//! free pages handed back to the kernel every [`TRIM_EVERY`], held about 28 MB (bench/README.md,
//! "Issue 24, RSS"). glibc's tcache serves most small allocations per thread, without the
//! arena's lock: DNS throughput under one arena was within the noise of the default's.
//!
//! Other C libraries (musl) have neither call: there both are no-ops.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often the free pages go back to the kernel. A trim walks the arena's free chunks under
/// its lock, and with one arena every thread's allocations past its tcache wait for it: 1.6 to
/// 4.3 ms on a synthetic 38 MB heap with 25,000 free chunks (`malloc_trim` timed in C). Every
/// 2 s and every 10 s measured the same RSS at idle (37.7 and 38.5 MB at 1,000 masters), so the
/// longer one, which stalls allocations five times less often.
pub const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Once, first thing in `main`, before any thread allocates: one malloc arena for the process.
pub fn configure() {
    glibc(Call::OneArena);
}

/// Hands the heap's free pages back to the kernel every [`TRIM_EVERY`] until shutdown.
pub async fn trim(shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(TRIM_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => glibc(Call::Trim),
            _ = shutdown.cancelled() => return Ok(()),
        }
    }
}

enum Call {
    OneArena,
    Trim,
}

/// The only unsafe code of polestar: two glibc calls that take plain integers and touch no
/// Rust memory. `mallopt(M_ARENA_MAX, 1)` caps the arenas (it does not move any allocation);
/// `malloc_trim(0)` takes each arena's lock and `madvise`s away the pages of its free chunks,
/// which are glibc's own. Both are thread-safe; their results (0 or 1: done or nothing to do)
/// change nothing for polestar.
#[allow(unsafe_code)]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn glibc(call: Call) {
    // SAFETY: see above; neither call reads or writes memory that Rust owns.
    unsafe {
        match call {
            Call::OneArena => libc::mallopt(libc::M_ARENA_MAX, 1),
            Call::Trim => libc::malloc_trim(0),
        };
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn glibc(_: Call) {}
