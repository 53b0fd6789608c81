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
//!
//! A reconciliation that brings a master's records changed (a replica flagged `s_down`, its
//! priority, its `s-down-time`, another primary) notes that master as news ([`Heard::news`]):
//! the poll judges it again at once from these records and its last answers, so a change the
//! Sentinels show reaches the verdict one reconciliation after it, not one reconciliation plus
//! one `readiness.interval`.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::facts::{MasterFacts, ReplicaFacts};

/// A Sentinel's records of one master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Records {
    pub master: Result<MasterFacts, String>,
    pub replicas: Result<Vec<ReplicaFacts>, String>,
}

impl Records {
    /// The records of a master `sentinel` does not monitor (`None`), or these.
    pub fn or_unmonitored(records: Option<Records>) -> Records {
        records.unwrap_or_else(|| {
            let not = || "SENTINEL MASTERS does not list this master".to_string();
            Records { master: Err(not()), replicas: Err(not()) }
        })
    }
}

/// Shared by the links (writers) and the poll (reader); keyed by the Sentinel's `host:port`
/// as configured ([`crate::node::Endpoint::name`]).
#[derive(Clone, Default)]
pub struct Heard(Arc<Shared>);

#[derive(Default)]
struct Shared {
    known: Mutex<Known>,
    /// Signalled (one stored permit) whenever `Known::news` gains a master; the poll waits.
    news: Notify,
}

#[derive(Default)]
struct Known {
    /// By Sentinel, by master.
    records: HashMap<String, HashMap<String, Records>>,
    /// Masters whose records changed since the poll last took them.
    news: BTreeSet<String>,
}

impl Known {
    /// Notes `master` as news when its records changed from `before`.
    fn compare(&mut self, master: &str, before: Option<&Records>, now: Option<&Records>) {
        if before != now {
            self.news.insert(master.to_string());
        }
    }
}

impl Heard {
    fn lock(&self) -> MutexGuard<'_, Known> {
        // A writer never panics while holding the lock: the map is always whole.
        self.0.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Wakes the poll when a change was noted.
    fn tell(&self, known: MutexGuard<'_, Known>) {
        let news = !known.news.is_empty();
        drop(known);
        if news {
            self.0.news.notify_one();
        }
    }

    /// A full reconciliation of `sentinel`: every master it monitors (that is served).
    pub fn all(&self, sentinel: &str, masters: HashMap<String, Records>) {
        let mut known = self.lock();
        let before = known.records.remove(sentinel).unwrap_or_default();
        let names: BTreeSet<&String> = before.keys().chain(masters.keys()).collect();
        for name in names {
            known.compare(name, before.get(name), masters.get(name));
        }
        known.records.insert(sentinel.to_string(), masters);
        self.tell(known);
    }

    /// A reconciliation of the masters in `scope`: those absent from `masters` are no longer
    /// monitored there. Ignored before the first full reconciliation.
    pub fn some(
        &self,
        sentinel: &str,
        scope: &BTreeSet<String>,
        mut masters: HashMap<String, Records>,
    ) {
        let mut known = self.lock();
        let Known { records, news } = &mut *known;
        let Some(of) = records.get_mut(sentinel) else { return };
        for name in scope {
            let before = match masters.remove(name) {
                Some(records) => of.insert(name.clone(), records),
                None => of.remove(name),
            };
            if before.as_ref() != of.get(name) {
                news.insert(name.clone());
            }
        }
        self.tell(known);
    }

    /// The link's session ended (or it stopped): nothing it read is current any more. No news:
    /// the poll keeps what it last knew of that Sentinel until it asks it again.
    pub fn forget(&self, sentinel: &str) {
        self.lock().records.remove(sentinel);
    }

    /// What `sentinel` said of each of `masters` (`None`: it does not monitor it), or `None`
    /// when no link has a current full picture of it.
    pub fn of(&self, sentinel: &str, masters: &[String]) -> Option<Vec<Option<Records>>> {
        let known = self.lock();
        let of = known.records.get(sentinel)?;
        Some(masters.iter().map(|m| of.get(m).cloned()).collect())
    }

    /// The masters whose records changed since the last call, once there are any. Cancel-safe:
    /// nothing is taken across an await.
    pub async fn news(&self) -> BTreeSet<String> {
        loop {
            let news = std::mem::take(&mut self.lock().news);
            if !news.is_empty() {
                return news;
            }
            self.0.news.notified().await;
        }
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

    /// The news the poll is woken with: a master whose records changed, once.
    fn news(heard: &Heard) -> Vec<String> {
        let taken = std::mem::take(&mut heard.lock().news);
        taken.into_iter().collect()
    }

    #[test]
    fn only_changed_records_are_news() {
        let heard = Heard::default();
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        heard.some("s:1", &names(&["a"]), HashMap::from([("a".into(), records(1))]));
        assert!(news(&heard).is_empty(), "nothing kept before a full reconciliation");
        heard.all("s:1", HashMap::from([("a".into(), records(1)), ("b".into(), records(1))]));
        assert_eq!(news(&heard), ["a", "b"], "a first picture is news");
        heard.all("s:1", HashMap::from([("a".into(), records(1)), ("b".into(), records(1))]));
        assert!(news(&heard).is_empty(), "the same records again are not");
        heard.all("s:1", HashMap::from([("a".into(), records(2)), ("c".into(), records(1))]));
        assert_eq!(news(&heard), ["a", "b", "c"], "changed, gone and new");
        heard.some("s:1", &names(&["a", "c"]), HashMap::from([("a".into(), records(2))]));
        assert_eq!(news(&heard), ["c"], "no longer monitored");
        heard.all("s:2", HashMap::from([("a".into(), records(2))]));
        heard.forget("s:1");
        assert_eq!(news(&heard), ["a"], "another Sentinel's first picture; a forget is none");
    }

    #[tokio::test]
    async fn the_poll_is_woken_by_news_that_came_while_it_was_busy() {
        let heard = Heard::default();
        heard.all("s:1", HashMap::from([("a".into(), records(1))]));
        let wait = std::time::Duration::from_secs(5);
        let got = tokio::time::timeout(wait, heard.news()).await.expect("news at once");
        assert_eq!(got, names(&["a"]));
        let later = heard.clone();
        let waiting = tokio::spawn(async move { later.news().await });
        tokio::task::yield_now().await;
        heard.all("s:1", HashMap::from([("a".into(), records(2))]));
        let got = tokio::time::timeout(wait, waiting).await.expect("woken").expect("joined");
        assert_eq!(got, names(&["a"]));
    }

    fn names(n: &[&str]) -> BTreeSet<String> {
        n.iter().map(|s| s.to_string()).collect()
    }
}
