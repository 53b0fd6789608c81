//! The one integration-test binary (ripgrep's layout): every module below starts real
//! processes (redis-server, redis-sentinel, knotd, the polestar binary) or real sockets.
//! One build and one link for the whole suite; the harness modules are compiled once. Every
//! redis-server, valkey-server and Sentinel is started through the lab crate (`polestar_lab`,
//! crates/lab): its `Lab` and `Server` on loopback, its `Launch` in the namespace labs.
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

// Shared harnesses.
mod chaos;
mod common;
mod dns_support;
mod netns;

// Test modules, one topic each.
mod agent;
mod bench_drain;
mod bench_haproxy;
mod bench_switchover;
mod chaos_netns;
mod cli;
mod client_results;
mod clients_netns;
mod clients_sentinel;
mod demotion_netns;
mod deployment_netns;
mod discovery;
mod dns_cluster;
mod dns_server;
mod drain;
mod examples;
mod failover;
mod fuzz_dns_socket;
mod fuzz_parsers;
mod hostile_config;
mod hostile_dns;
mod hostile_http;
mod hostile_load;
mod hostile_sentinel;
mod http_api;
mod lab;
mod metrics;
mod observability;
mod operation;
mod readiness;
mod readiness_netns;
mod sentinel_api;
mod sentinel_api_limits;
mod status_page;
mod sweep_netns;
mod switchover_netns;
mod tls;
mod trust;
