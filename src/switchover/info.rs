//! The few `INFO` fields a switchover reads, parsed from the text a node answers: the
//! primary's replication offset and what it knows of each replica's, and a replica's own
//! offset.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

/// `field:value` lines of an `INFO` answer.
fn fields(info: &str) -> HashMap<&str, &str> {
    info.lines().filter_map(|l| l.trim_end().split_once(':')).collect()
}

/// A primary's `INFO replication`: its offset and, per replica, the offset it acknowledged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Primary {
    pub role_master: bool,
    pub offset: u64,
    pub acked: HashMap<SocketAddr, u64>,
}

impl Primary {
    pub fn parse(info: &str) -> Option<Self> {
        let fields = fields(info);
        let offset = fields.get("master_repl_offset")?.parse().ok()?;
        let acked = fields
            .iter()
            .filter(|(k, _)| k.starts_with("slave") && k[5..].chars().all(|c| c.is_ascii_digit()))
            .filter_map(|(_, v)| replica_line(v))
            .collect();
        Some(Self { role_master: fields.get("role") == Some(&"master"), offset, acked })
    }
}

/// `ip=10.0.0.2,port=6379,state=online,offset=123,lag=0`.
fn replica_line(line: &str) -> Option<(SocketAddr, u64)> {
    let parts: HashMap<&str, &str> = line.split(',').filter_map(|p| p.split_once('=')).collect();
    let ip: IpAddr = parts.get("ip")?.parse().ok()?;
    let port = parts.get("port")?.parse().ok()?;
    Some((SocketAddr::new(ip, port), parts.get("offset")?.parse().ok()?))
}

/// A replica's own `INFO replication`: the offset of the stream it has processed.
pub fn replica_offset(info: &str) -> Option<u64> {
    let fields = fields(info);
    (fields.get("role") == Some(&"slave")).then_some(())?;
    fields.get("slave_repl_offset")?.parse().ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use super::*;

    #[test]
    fn a_primarys_offsets_are_read_per_replica() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
            slave0:ip=10.0.0.2,port=6379,state=online,offset=90,lag=0\r\n\
            slave1:ip=10.0.0.3,port=6380,state=online,offset=100,lag=1\r\n\
            master_failover_state:no-failover\r\nmaster_repl_offset:100\r\n\
            slave_read_repl_offset:5\r\n";
        let p = Primary::parse(info).unwrap();
        assert!(p.role_master);
        assert_eq!(p.offset, 100);
        assert_eq!(p.acked.len(), 2, "slave_read_repl_offset is no replica line");
        assert_eq!(p.acked[&"10.0.0.2:6379".parse().unwrap()], 90);
        assert!(Primary::parse("role:master\r\n").is_none());
        assert!(Primary::parse("master_repl_offset:x\r\n").is_none());
    }

    #[test]
    fn a_replica_says_its_own_offset() {
        let info = "role:slave\r\nmaster_host:10.0.0.1\r\nslave_repl_offset:77\r\n";
        assert_eq!(replica_offset(info), Some(77));
        assert_eq!(replica_offset("role:master\r\nslave_repl_offset:77\r\n"), None);
        assert_eq!(replica_offset("garbage"), None);
    }
}
