//! Authoritative DNS for `dns.zone`: the way most applications find the current primary.
//!
//! Every topology change is turned into a new immutable [`zone::Zone`] (with a higher SOA
//! serial) and swapped in whole, so a query never sees half of a change and never takes a lock
//! on the zone. UDP is served by one task per `SO_REUSEPORT` socket that decodes with
//! hickory-server and answers through the same [`handler::Service`] that the connections of
//! [`tcp`] use (where zone transfers happen). UDP answers are rate-limited per client prefix
//! and name ([`rrl`]), so polestar cannot be used to reflect a flood. After each change NOTIFY goes to every
//! `dns.notify` target so standard secondaries follow by AXFR.

mod batch;
mod handler;
mod listen;
mod notify;
mod rrl;
mod server;
mod tcp;
mod udp;
pub mod zone;

use std::net::SocketAddr;

pub use listen::Listeners;
pub use server::serve;

/// Failures of the DNS server's setup, each naming the resource.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("failed to bind DNS UDP socket on {addr}: {source}")]
    BindUdp { addr: SocketAddr, source: std::io::Error },
    #[error("failed to bind DNS TCP socket on {addr}: {source}")]
    BindTcp { addr: SocketAddr, source: std::io::Error },
    #[error("dns: {name:?} is not a domain name: {reason}")]
    Name { name: String, reason: String },
}
