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

#[cfg(test)]
mod fuzz {
    //! The `INFO` a switchover reads comes from the nodes: any bytes, read lossily as the
    //! switchover reads them, parse without a panic, and what parses is what the text says.
    use proptest::prelude::*;

    use super::*;
    use crate::switchover::version::Server;

    fn config() -> ProptestConfig {
        let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok());
        ProptestConfig { cases: cases.unwrap_or(1000), ..ProptestConfig::default() }
    }

    fn info_bytes() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            3 => prop::sample::select(vec![
                "role:master", "role:slave", "master_repl_offset:", "slave_repl_offset:",
                "slave", "slave0:", "slavex:", "ip=", "10.0.0.2", "::1", ",port=", "6379",
                ",offset=", "=", ",", ":", "\r\n", "\n", "\r", "-1", "18446744073709551616",
                "server_name:valkey", "valkey_version:", "9.1.2", ".", "é",
            ])
            .prop_map(|s| s.as_bytes().to_vec()),
            1 => prop::collection::vec(any::<u8>(), 0..8),
        ];
        prop::collection::vec(piece, 0..40).prop_map(|p| p.concat())
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn info_from_raw_bytes_never_panics(raw in info_bytes()) {
            let text = String::from_utf8_lossy(&raw);
            if let Some(primary) = Primary::parse(&text) {
                prop_assert!(text.contains("master_repl_offset:"));
                let says_master = text.lines().any(|l| l.trim_end() == "role:master");
                prop_assert!(says_master || !primary.role_master);
                prop_assert!(primary.acked.len() <= text.matches("slave").count());
            }
            if replica_offset(&text).is_some() {
                prop_assert!(text.contains("slave_repl_offset:") && text.contains("role:slave"));
            }
            if let Server::Valkey(..) = Server::parse(&text) {
                prop_assert!(text.contains("server_name:valkey"));
            }
        }
    }
}
