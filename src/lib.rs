//! polestar: serves the current primary of every Sentinel-managed Redis/Valkey master by DNS
//! and HTTP, and makes stale client connections fail fast on failover.

pub mod config;
pub mod events;
pub mod topology;
pub mod control;
pub mod metrics;
pub mod daemon;
pub mod http;
pub mod client;
