//! polestar: serves the current primary of every Sentinel-managed Redis/Valkey master by DNS
//! and HTTP, and makes stale client connections fail fast on failover.

pub mod agent;
pub mod alloc;
pub mod client;
pub mod config;
pub mod control;
pub mod daemon;
pub mod dns;
pub mod drain;
pub mod events;
pub mod failover;
pub mod http;
pub mod limits;
pub mod log_every;
pub mod log_output;
pub mod metrics;
pub mod node;
pub mod phases;
pub mod reach;
pub mod readiness;
pub mod reload;
pub mod sentinel;
pub mod sentinel_api;
pub mod service;
pub mod source;
pub mod supervise;
pub mod sweep;
pub mod switchover;
pub mod tls;
pub mod topology;
