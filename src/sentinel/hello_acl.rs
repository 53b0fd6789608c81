//! The hello ACL warning (docs/trust.md, "Sentinels", forged hellos): a data node whose `default`
//! user may `PUBLISH` on `__sentinel__:hello` lets any unauthenticated client move every Sentinel
//! to a node of its choice with one forged hello. polestar refuses such a primary (see `core`'s
//! lineage), but Sentinel itself still demotes the real primary; only the ACL prevents that, so
//! polestar says so, once per node: an event each, and a warning line once per interval with
//! how many were found (a fleet of a thousand open nodes is one finding, not a thousand lines
//! at start-up).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::events::{EventLog, Kind};
use crate::log_every::LogEvery;
use crate::node::Nodes;

/// How long the node may take to answer.
const DEADLINE: Duration = Duration::from_secs(2);

/// What the node answered to `ACL DRYRUN default PUBLISH __sentinel__:hello x`.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `OK`: the default user may publish a hello.
    MayPublish,
    /// Any other answer: denied (or the user is off or does not exist).
    Denied,
    /// No answer we can read: an error (Redis before 7.0 has no `ACL DRYRUN`; polestar's own
    /// user may lack `+acl|dryrun`) or no answer in time.
    Unknown(String),
}

pub fn verdict(reply: Option<redis::RedisResult<Value>>) -> Verdict {
    match reply {
        Some(Ok(Value::Okay)) => Verdict::MayPublish,
        Some(Ok(Value::SimpleString(s))) if s.eq_ignore_ascii_case("ok") => Verdict::MayPublish,
        Some(Ok(_)) => Verdict::Denied,
        Some(Err(e)) if e.to_string().contains("not found") => Verdict::Denied,
        Some(Err(e)) => Verdict::Unknown(e.to_string()),
        None => Verdict::Unknown("no answer".into()),
    }
}

/// Checks in flight at once: every node of every master is checked once, at start-up, and a
/// thousand at once were a thousand connections open together.
pub const AT_ONCE: usize = 8;

/// What every check shares: the permits of the checks in flight, and the warning line (once
/// per [`crate::log_every::INTERVAL`], with the count of nodes found since).
pub struct Checks {
    permits: Semaphore,
    warned: LogEvery,
}

impl Default for Checks {
    fn default() -> Self {
        Self { permits: Semaphore::new(AT_ONCE), warned: LogEvery::new() }
    }
}

/// Asks the node at `addr` (of the lineage of `master`: the node credentials may go there)
/// over a connection of its own, once one of the [`AT_ONCE`] permits of `checks` is free, and
/// logs a warning, with an event, if its default user may publish a hello.
pub async fn check(
    nodes: Arc<Nodes>,
    events: Arc<EventLog>,
    checks: Arc<Checks>,
    master: String,
    addr: SocketAddr,
) {
    // The semaphore is never closed.
    let Ok(_permit) = checks.permits.acquire().await else { return };
    let mut cmd = redis::cmd("ACL");
    cmd.arg("DRYRUN").arg("default").arg("PUBLISH").arg("__sentinel__:hello").arg("x");
    match verdict(nodes.query_once(addr, &cmd, DEADLINE).await) {
        Verdict::MayPublish => {
            const FOUND: &str = "a data node lets its default user publish Sentinel hellos: any client can move every Sentinel to a node of its choice; deny PUBLISH on __sentinel__:* (see docs/operating.md, \"TLS, tokens and the ACL polestar needs\")";
            match checks.warned.hit(Instant::now()) {
                Some(found) => {
                    tracing::warn!(%master, node = %addr, found, "{FOUND} ({found} such node(s) since the last line; each one is a hello_acl event)")
                }
                None => tracing::debug!(%master, node = %addr, "{FOUND}"),
            }
            let data = json!({ "node": addr.to_string(), "user": "default" });
            events.push(Kind::HelloAcl, Some(&master), data);
        }
        Verdict::Denied => {
            tracing::debug!(%master, node = %addr, "the default user may not publish Sentinel hellos")
        }
        Verdict::Unknown(why) => {
            tracing::debug!(%master, node = %addr, %why, "could not check whether the default user may publish Sentinel hellos")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_ok_means_the_default_user_may_publish() {
        let err = |code: &'static str, text: &'static str| {
            Some(Err(redis::RedisError::from((redis::ErrorKind::Client, code, text.into()))))
        };
        let denied = "User default has no permissions to access the '__sentinel__:hello' channel";
        let cases = [
            ("OK", Some(Ok(Value::Okay)), Verdict::MayPublish),
            ("simple OK", Some(Ok(Value::SimpleString("OK".into()))), Verdict::MayPublish),
            ("denied", Some(Ok(Value::BulkString(denied.into()))), Verdict::Denied),
        ];
        for (why, reply, want) in cases {
            assert_eq!(verdict(reply), want, "{why}");
        }
        assert!(matches!(verdict(err("ERR", "unknown subcommand 'DRYRUN'")), Verdict::Unknown(_)));
        assert_eq!(verdict(err("ERR", "User 'default' not found")), Verdict::Denied);
        assert!(matches!(verdict(None), Verdict::Unknown(_)));
    }
}
