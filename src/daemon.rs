//! `polestar run`: load, bind, spawn, wait for shutdown.

use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// Runs the daemon until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let _ = config;
    shutdown.cancelled().await;
    Ok(())
}
