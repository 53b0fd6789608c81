//! What the Sentinel links already read, kept for the readiness poll: each configured
//! Sentinel's own record of every master it monitors (`SENTINEL MASTERS`/`MASTER`) and of its
//! replicas (`SENTINEL REPLICAS`), as of the link's last reconciliation of that master. The
//! poll takes these instead of asking the same questions again, and asks a Sentinel only what
//! no link asks (`INFO` for TILT, `CKQUORUM`): at 1,000 masters that is one command per master
//! and Sentinel a round instead of three.
//!
//! A link writes here only between a full reconciliation and the end of its session; a
//! Sentinel without an entry (its link is down, or has not reconciled yet) is asked everything
//! by the poll as before. Nothing here is trusted more than the poll's own answers were: each
//! entry is one configured Sentinel's word, counted for that Sentinel only.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use super::facts::{MasterFacts, ReplicaFacts};

/// A Sentinel's records of one master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Records {
    pub master: Result<MasterFacts, String>,
    pub replicas: Result<Vec<ReplicaFacts>, String>,
}

/// Shared by the links (writers) and the poll (reader); keyed by the Sentinel's `host:port`
/// as configured ([`crate::sentinel::Endpoint::name`]).
#[derive(Clone, Default)]
pub struct Heard(Arc<Mutex<HashMap<String, HashMap<String, Records>>>>);

impl Heard {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, HashMap<String, Records>>> {
        // A writer never panics while holding the lock: the map is always whole.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A full reconciliation of `sentinel`: every master it monitors (that is served).
    pub fn all(&self, sentinel: &str, masters: HashMap<String, Records>) {
        self.lock().insert(sentinel.to_string(), masters);
    }

    /// A reconciliation of the masters in `scope`: those absent from `masters` are no longer
    /// monitored there. Ignored before the first full reconciliation.
    pub fn some(
        &self,
        sentinel: &str,
        scope: &BTreeSet<String>,
        mut masters: HashMap<String, Records>,
    ) {
        let mut all = self.lock();
        let Some(known) = all.get_mut(sentinel) else { return };
        for name in scope {
            match masters.remove(name) {
                Some(records) => known.insert(name.clone(), records),
                None => known.remove(name),
            };
        }
    }

    /// The link's session ended (or it stopped): nothing it read is current any more.
    pub fn forget(&self, sentinel: &str) {
        self.lock().remove(sentinel);
    }

    /// What `sentinel` said of each of `masters` (`None`: it does not monitor it), or `None`
    /// when no link has a current full picture of it.
    pub fn of(&self, sentinel: &str, masters: &[String]) -> Option<Vec<Option<Records>>> {
        let all = self.lock();
        let known = all.get(sentinel)?;
        Some(masters.iter().map(|m| known.get(m).cloned()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(epoch: u64) -> Records {
        Records {
            master: Ok(MasterFacts { primary: "10.0.0.1:6379".into(), epoch }),
            replicas: Ok(Vec::new()),
        }
    }

    #[test]
    fn a_partial_reconciliation_updates_only_its_scope_and_only_after_a_full_one() {
        let heard = Heard::default();
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let ask = || vec!["a".to_string(), "b".to_string()];
        heard.some("s:1", &names(&["a"]), HashMap::from([("a".into(), records(1))]));
        assert_eq!(heard.of("s:1", &ask()), None, "no full picture yet");
        heard.all("s:1", HashMap::from([("a".into(), records(1)), ("b".into(), records(1))]));
        heard.some("s:1", &names(&["a"]), HashMap::from([("a".into(), records(2))]));
        assert_eq!(heard.of("s:1", &ask()), Some(vec![Some(records(2)), Some(records(1))]));
        heard.some("s:1", &names(&["b"]), HashMap::new());
        assert_eq!(heard.of("s:1", &ask()), Some(vec![Some(records(2)), None]), "b not monitored");
        heard.forget("s:1");
        assert_eq!(heard.of("s:1", &ask()), None);
    }
}
