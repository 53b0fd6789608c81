//! polestar: serves the current primary of every Sentinel-managed Redis/Valkey master by DNS
//! and HTTP, and makes stale client connections fail fast on failover.

pub mod config;
pub mod control;
pub mod daemon;
pub mod dns;
pub mod events;
pub mod metrics;
pub mod topology;
