//! Sentinel and node replies turned into [`super::facts`] values. Nothing here panics on a
//! reply, however odd: what does not parse is an `Err` with a short, printable description
//! of what came back, which the verdict shows as it is.

use std::collections::HashMap;
use std::time::Duration;

use redis::Value;

use super::facts::{MasterFacts, ReplicaFacts};
use crate::sentinel::message::Fields;

/// Replies are quoted in blockers at most this long.
const QUOTE: usize = 120;

/// The text of a reply element, whatever RESP type carried it.
pub fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

/// A reply as a short string for a blocker's detail.
pub fn quote(value: &Value) -> String {
    let full = text(value).unwrap_or_else(|| format!("{value:?}"));
    let mut shown: String = full.chars().take(QUOTE).collect();
    if full.chars().count() > QUOTE {
        shown.push_str("...");
    }
    format!("{shown:?}")
}

/// `INFO` text as `field -> value` (sections and comments skipped).
pub fn info_fields(info: &str) -> HashMap<&str, &str> {
    info.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.trim_end().split_once(':'))
        .collect()
}

/// `INFO sentinel`'s `sentinel_tilt`.
pub fn tilt(reply: &Value) -> Result<bool, String> {
    let info = text(reply).ok_or_else(|| format!("INFO answered {}", quote(reply)))?;
    match info_fields(&info).get("sentinel_tilt") {
        Some(&"0") => Ok(false),
        Some(&"1") => Ok(true),
        Some(other) => Err(format!("INFO says sentinel_tilt:{other:?}")),
        None => Err(format!("INFO has no sentinel_tilt field: {}", quote(reply))),
    }
}

/// `SENTINEL CKQUORUM`: `OK <n> usable Sentinels...`; anything else is its text.
pub fn ckquorum(reply: &Value) -> Result<(), String> {
    match text(reply) {
        Some(t) if t.starts_with("OK") => Ok(()),
        _ => Err(format!("CKQUORUM answered {}", quote(reply))),
    }
}

/// `SENTINEL MASTER <name>`.
pub fn master(reply: &Value) -> Result<MasterFacts, String> {
    let bad = || format!("SENTINEL MASTER answered {}", quote(reply));
    record(reply).as_ref().and_then(master_record).ok_or_else(bad)
}

/// One master's record (of `SENTINEL MASTER`, or one of `SENTINEL MASTERS`, read in place).
pub fn master_record(r: &impl Fields) -> Option<MasterFacts> {
    let epoch = r.field("config-epoch")?.parse().ok()?;
    Some(MasterFacts { primary: join(&r.field("ip")?, &r.field("port")?)?, epoch })
}

/// `SENTINEL REPLICAS <name>`; one unreadable record makes the whole answer unreadable.
pub fn replicas(reply: &Value) -> Result<Vec<ReplicaFacts>, String> {
    let bad = || format!("SENTINEL REPLICAS answered {}", quote(reply));
    let (Value::Array(items) | Value::Set(items)) = reply else { return Err(bad()) };
    items.iter().map(|item| record(item).and_then(|r| replica(&r)).ok_or_else(bad)).collect()
}

fn replica(r: &HashMap<String, String>) -> Option<ReplicaFacts> {
    let flags: Vec<String> = r.get("flags")?.split(',').map(str::to_string).collect();
    let down_for = match r.get("s-down-time") {
        Some(ms) if flags.iter().any(|f| f == "s_down") => {
            Some(Duration::from_millis(ms.parse().ok()?))
        }
        _ => None,
    };
    Some(ReplicaFacts {
        addr: addr(r)?,
        link_ok: r.get("master-link-status").is_none_or(|s| s == "ok"),
        // Older servers name it `slave-priority`, newer ones may add `replica-priority`.
        priority: r.get("slave-priority").or(r.get("replica-priority"))?.parse().ok()?,
        flags,
        down_for,
    })
}

fn addr(r: &HashMap<String, String>) -> Option<String> {
    join(r.get("ip")?, r.get("port")?)
}

fn join(ip: &str, port: &str) -> Option<String> {
    let port: u16 = port.parse().ok()?;
    Some(if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") })
}

/// One instance record: a RESP3 map or a RESP2 flat list of alternating keys and values.
fn record(value: &Value) -> Option<HashMap<String, String>> {
    let pairs: Vec<(&Value, &Value)> = match value {
        Value::Map(m) => m.iter().map(|(k, v)| (k, v)).collect(),
        Value::Array(a) if a.len() % 2 == 0 => a.chunks(2).map(|c| (&c[0], &c[1])).collect(),
        _ => return None,
    };
    pairs.into_iter().map(|(k, v)| Some((text(k)?, text(v).unwrap_or_default()))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn map(pairs: &[(&str, &str)]) -> Value {
        Value::Map(pairs.iter().map(|(k, v)| (bulk(k), bulk(v))).collect())
    }

    #[test]
    fn tilt_reads_info_sentinel() {
        let info =
            "# Sentinel\r\nsentinel_masters:1\r\nsentinel_tilt:1\r\nsentinel_running_scripts:0\r\n";
        assert_eq!(tilt(&bulk(info)), Ok(true));
        assert_eq!(tilt(&bulk(&info.replace("tilt:1", "tilt:0"))), Ok(false));
        let verbatim = Value::VerbatimString {
            format: redis::VerbatimFormat::Text,
            text: "sentinel_tilt:0".into(),
        };
        assert_eq!(tilt(&verbatim), Ok(false));
    }

    #[test]
    fn garbage_is_an_error_with_the_text_not_a_panic() {
        assert_eq!(tilt(&bulk("hello")), Err("INFO has no sentinel_tilt field: \"hello\"".into()));
        assert!(tilt(&bulk("sentinel_tilt:maybe")).is_err());
        assert!(tilt(&Value::Nil).is_err());
        assert!(tilt(&Value::Array(vec![Value::Int(1)])).is_err());
        assert_eq!(ckquorum(&bulk("BANANA")), Err("CKQUORUM answered \"BANANA\"".into()));
        assert!(ckquorum(&Value::Nil).is_err());
        assert!(master(&bulk("x")).is_err());
        assert!(master(&map(&[("ip", "1.2.3.4"), ("port", "x"), ("config-epoch", "1")])).is_err());
        assert!(replicas(&bulk("x")).is_err());
        assert!(replicas(&Value::Array(vec![bulk("odd")])).is_err());
        let long = "x".repeat(1000);
        assert!(ckquorum(&bulk(&long)).expect_err("long").len() < 200, "quotes are bounded");
        let binary = Value::BulkString(vec![0xff, 0xfe, 0]);
        assert!(ckquorum(&binary).is_err());
    }

    #[test]
    fn ckquorum_ok_is_ok() {
        let ok = Value::SimpleString(
            "OK 3 usable Sentinels. Quorum and failover authorization can be reached".into(),
        );
        assert_eq!(ckquorum(&ok), Ok(()));
    }

    #[test]
    fn master_and_replicas_read_resp3_and_resp2() {
        let m = map(&[("name", "m"), ("ip", "10.0.0.1"), ("port", "6379"), ("config-epoch", "7")]);
        assert_eq!(master(&m), Ok(MasterFacts { primary: "10.0.0.1:6379".into(), epoch: 7 }));
        let flat = Value::Array(
            [
                "ip",
                "::1",
                "port",
                "6380",
                "flags",
                "s_down,slave,disconnected",
                "s-down-time",
                "1500",
                "master-link-status",
                "err",
                "slave-priority",
                "0",
            ]
            .iter()
            .map(|s| bulk(s))
            .collect(),
        );
        let got = replicas(&Value::Array(vec![flat])).expect("a RESP2 record");
        assert_eq!(
            got,
            [ReplicaFacts {
                addr: "[::1]:6380".into(),
                flags: vec!["s_down".into(), "slave".into(), "disconnected".into()],
                link_ok: false,
                priority: 0,
                down_for: Some(Duration::from_millis(1500)),
            }]
        );
        assert_eq!(replicas(&Value::Array(vec![])), Ok(vec![]));
    }
}
