//! Replication lag in bytes, from `INFO replication`: the primary's `master_repl_offset` minus
//! each replica's acknowledged `offset` (its `slaveN:` lines), or, when the primary does not
//! answer, each replica's own `slave_repl_offset` behind the most advanced replica's (the one
//! a failover would pick has lag 0).

use std::collections::BTreeMap;

use super::parse::info_fields;

/// Lag of every replica the primary lists, by `ip:port`.
pub fn from_primary(info: &str) -> Result<BTreeMap<String, u64>, String> {
    let fields = info_fields(info);
    let offset: u64 = fields
        .get("master_repl_offset")
        .and_then(|o| o.parse().ok())
        .ok_or_else(|| "INFO replication has no master_repl_offset".to_string())?;
    let mut lags = BTreeMap::new();
    for (key, value) in &fields {
        let is_replica_line =
            key.strip_prefix("slave").is_some_and(|n| n.chars().all(|c| c.is_ascii_digit()));
        if !is_replica_line || key.len() == "slave".len() {
            continue;
        }
        if let Some((addr, acked)) = replica_line(value) {
            lags.insert(addr, offset.saturating_sub(acked));
        }
    }
    Ok(lags)
}

/// `ip=10.0.0.2,port=6379,state=online,offset=1234,lag=0`.
fn replica_line(value: &str) -> Option<(String, u64)> {
    let parts: BTreeMap<&str, &str> = value.split(',').filter_map(|p| p.split_once('=')).collect();
    let ip = parts.get("ip")?;
    let port: u16 = parts.get("port")?.parse().ok()?;
    let offset = parts.get("offset")?.parse().ok()?;
    let addr = if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") };
    Some((addr, offset))
}

/// A replica's own processed offset (`slave_repl_offset`), when it says.
pub fn replica_offset(info: &str) -> Option<u64> {
    info_fields(info).get("slave_repl_offset")?.parse().ok()
}

/// Lags relative to the most advanced of these replicas.
pub fn from_replicas(offsets: &[(String, u64)]) -> BTreeMap<String, u64> {
    let best = offsets.iter().map(|(_, o)| *o).max().unwrap_or(0);
    offsets.iter().map(|(addr, o)| (addr.clone(), best - o)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRIMARY: &str = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
        slave0:ip=127.0.0.1,port=6380,state=online,offset=900,lag=0\r\n\
        slave1:ip=::1,port=6381,state=online,offset=1000,lag=1\r\n\
        master_failover_state:no-failover\r\nmaster_repl_offset:1000\r\n";

    #[test]
    fn the_primary_names_each_replicas_lag() {
        let lags = from_primary(PRIMARY).expect("a primary's INFO");
        assert_eq!(
            lags,
            BTreeMap::from([("127.0.0.1:6380".into(), 100), ("[::1]:6381".into(), 0)])
        );
    }

    #[test]
    fn odd_lines_are_skipped_and_no_offset_is_an_error() {
        let odd = "slave0:garbage\r\nslave1:ip=1.2.3.4,port=x,offset=1\r\nslaves:3\r\n\
                   slave_repl_offset:5\r\nmaster_repl_offset:10\r\n";
        assert_eq!(from_primary(odd), Ok(BTreeMap::new()));
        assert!(from_primary("hello").is_err());
        let ahead = "slave0:ip=1.2.3.4,port=1,offset=99\r\nmaster_repl_offset:10\r\n";
        assert_eq!(from_primary(ahead), Ok(BTreeMap::from([("1.2.3.4:1".into(), 0)])));
    }

    #[test]
    fn without_the_primary_the_best_replica_has_no_lag() {
        assert_eq!(replica_offset("role:slave\r\nslave_repl_offset:77\r\n"), Some(77));
        assert_eq!(replica_offset("role:master\r\n"), None);
        let lags = from_replicas(&[("a:1".into(), 50), ("b:1".into(), 80)]);
        assert_eq!(lags, BTreeMap::from([("a:1".into(), 30), ("b:1".into(), 0)]));
    }
}
