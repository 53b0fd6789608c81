//! Every conversation with a Redis or Valkey process. The transport (`conn`: TCP with
//! keepalive, TLS as configured, `HELLO`) is the Sentinel side's too; over it, data nodes are
//! talked to through one [`Link`] (connected, named [`CONNECTION_NAME`] so that no drain or
//! sweep, ours or another polestar's, cuts it, knowing its client id, a deadline per
//! command), kept open by the drain side ([`KeptLink`]) and the Sentinel side's promotion
//! polls ([`Nodes`]). What nodes say is read here once: `ROLE` ([`Role`]), `CLIENT LIST`
//! ([`clients`]) and whose each of their connections is ([`infrastructure`]).
//!
//! A neutral module: `sentinel`, `drain`, `sweep`, `readiness` and `switchover` all talk to
//! data nodes and must agree on what a node says; before it existed three parsers disagreed
//! on whether `replica` (Valkey's spelling in some replies) is `slave`, two read `CLIENT LIST`
//! and two wrote down which connections are the infrastructure's. It imports none of them.

pub mod clients;
mod conn;
pub mod infrastructure;
mod kept;
mod link;
pub mod pool;
mod raw;
pub mod reply;

use redis::Value;

pub use conn::{CONNECT_TIMEOUT, Endpoint, PushSink, RESPONSE_TIMEOUT, connect};
pub use kept::{DEMOTION_DEADLINES, Fenced, KeptLink, Listing};
pub use link::{DEFAULT_COMMAND_DEADLINE, DEFAULT_OPEN_DEADLINE, Link, NodeError};
pub use pool::Nodes;
pub use raw::RawConn;

/// The name polestar gives the connections it opens to data nodes (`CLIENT SETNAME`).
pub const CONNECTION_NAME: &str = "polestar";

/// What `ROLE` says a node is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Master,
    /// `slave` (Redis) or `replica`.
    Replica,
    /// `sentinel`, or a reply polestar does not understand (kept for the log line).
    Other(String),
}

impl Role {
    /// Reads a `ROLE` reply: an array whose first element names the role. Anything else is
    /// [`Role::Other`], never a panic.
    pub fn parse(reply: &Value) -> Role {
        let first = match reply {
            Value::Array(items) => items.first().and_then(text),
            _ => None,
        };
        match first.as_deref() {
            Some("master") => Role::Master,
            Some("slave") | Some("replica") => Role::Replica,
            Some(other) => Role::Other(other.to_string()),
            None => Role::Other("unreadable".to_string()),
        }
    }

    pub fn is_master(&self) -> bool {
        *self == Role::Master
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(first: &str) -> Value {
        Value::Array(vec![Value::BulkString(first.as_bytes().to_vec()), Value::Int(0)])
    }

    #[test]
    fn every_spelling_of_a_role_reads_the_same() {
        assert_eq!(Role::parse(&reply("master")), Role::Master);
        assert_eq!(Role::parse(&reply("slave")), Role::Replica);
        assert_eq!(Role::parse(&reply("replica")), Role::Replica);
        let simple = Value::Array(vec![Value::SimpleString("slave".into())]);
        assert_eq!(Role::parse(&simple), Role::Replica);
        assert_eq!(Role::parse(&reply("sentinel")), Role::Other("sentinel".into()));
    }

    #[test]
    fn odd_replies_are_other_not_a_panic() {
        assert_eq!(Role::parse(&Value::Nil), Role::Other("unreadable".into()));
        assert_eq!(Role::parse(&Value::Array(vec![])), Role::Other("unreadable".into()));
        assert_eq!(Role::parse(&Value::Int(3)), Role::Other("unreadable".into()));
        assert!(!Role::parse(&reply("MASTER")).is_master(), "ROLE answers lower case");
    }
}
