use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};
use tokio::time::sleep;

use super::*;
use crate::events::Kind;
use crate::reload::Reloader;
use crate::topology::{Master, MasterState, Node, SentinelCounts, Withdrawn};

const BASE: &str = "sentinels: { addresses: [\"127.0.0.1:26379\"] }\nmasters: [{ name: a }]\n";

fn snapshot(names: &[String], known: bool) -> Snapshot {
    let master = |name: &String| Master {
        withdrawn: None,
        provisional: false,
        name: name.clone(),
        label: name.clone(),
        primary: known.then(|| Node { ip: [127, 0, 0, 1].into(), port: 6379, hostname: None }),
        epoch: known.then_some(1),
        since: None,
        state: if known { MasterState::Ok } else { MasterState::Unknown },
        replicas: vec![],
        sentinels: SentinelCounts::default(),
    };
    let masters: BTreeMap<_, _> = names.iter().map(|n| (n.clone(), Arc::new(master(n)))).collect();
    Snapshot { version: 1, masters, source_reachable: known }
}

/// A watcher like the real one: publishes a blank state, then a full one 100 ms later, and
/// an event for each; then a `later` event every second until stopped.
fn fake(
    config: &Config,
    publisher: Publisher,
    events: Arc<EventLog>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let names: Vec<String> = config.masters.iter().flatten().map(|m| m.name.clone()).collect();
    tokio::spawn(async move {
        publisher.replace(snapshot(&names, false));
        events.push(Kind::Stale, None, Value::Null);
        sleep(Duration::from_millis(100)).await;
        publisher.replace(snapshot(&names, true));
        loop {
            tokio::select! {
                _ = sleep(Duration::from_secs(1)) => {
                    events.push(Kind::Ok, None, json!({ "masters": names.len() }));
                }
                _ = stop.cancelled() => return,
            }
        }
    })
}

/// `follow_reloads` running the fake watcher on a config file with `BASE`, its first state out.
struct Supervised {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    reloader: Reloader,
    reader: TopologyReader,
    events: Arc<EventLog>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Supervised {
    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("polestar.yaml");
        std::fs::write(&path, BASE).expect("write");
        let (reloader, config) = Reloader::new(Config::load(&path).expect("valid"));
        let (publisher, mut reader) = topology::channel();
        let events = Arc::new(EventLog::new());
        let shutdown = CancellationToken::new();
        let task =
            tokio::spawn(follow_reloads(config, publisher, events.clone(), shutdown.clone(), fake));
        reader.wait_for(|s| complete(s)).await.expect("the first watcher publishes");
        Self { _dir: dir, path, reloader, reader, events, shutdown, task }
    }
}

#[tokio::test(start_paused = true)]
async fn a_restart_never_publishes_a_blank_state_and_versions_keep_growing() {
    let Supervised { _dir, path, reloader, mut reader, events, shutdown, task } =
        Supervised::start().await;
    let watch = tokio::spawn(record(reader.clone()));

    std::fs::write(&path, BASE.replace("[{ name: a }]", "[{ name: a }, { name: b }]"))
        .expect("write");
    reloader.reload().expect("a valid file");
    reader.wait_for(|s| complete(s) && s.masters.len() == 2).await.expect("the new watcher");
    sleep(Duration::from_millis(1500)).await;
    shutdown.cancel();
    task.await.expect("follow_reloads ends at shutdown");
    drop(reloader);

    let seen = watch.await.expect("the recorder ends with the channel");
    assert!(seen.iter().all(|(_, complete)| *complete), "a blank state was published: {seen:?}");
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "versions must grow: {seen:?}");
    let kinds: Vec<(Kind, Value)> = events
        .since(None)
        .into_iter()
        .map(|e| (e.kind, e.data.get("masters").cloned().unwrap_or_default()))
        .collect();
    assert_eq!(kinds.iter().filter(|(k, _)| *k == Kind::Stale).count(), 1, "{kinds:?}");
    assert!(kinds.contains(&(Kind::Ok, json!(2))), "the new watcher's events: {kinds:?}");
}

/// Every snapshot published from now on: its version and whether it was complete.
async fn record(mut reader: TopologyReader) -> Vec<(u64, bool)> {
    let mut seen = Vec::new();
    while reader.changed().await.is_ok() {
        let s = reader.borrow_and_update().clone();
        seen.push((s.version, complete(&s)));
    }
    seen
}

#[tokio::test(start_paused = true)]
async fn a_drain_change_leaves_the_watcher_alone() {
    let Supervised { _dir, path, reloader, reader: _reader, events, shutdown, task } =
        Supervised::start().await;
    std::fs::write(&path, format!("{BASE}drain: {{ rate: 5 }}\n")).expect("write");
    reloader.reload().expect("a valid file");
    sleep(Duration::from_secs(2)).await;
    shutdown.cancel();
    task.await.expect("follow_reloads ends at shutdown");
    let warmed = events.since(None).iter().filter(|e| e.kind == Kind::Stale).count();
    assert_eq!(warmed, 1, "no second watcher was started");
    assert!(Path::new(&path).exists());
}

/// One master `a` at `port` and `epoch`.
fn at(port: u16, epoch: u64) -> Snapshot {
    let mut s = snapshot(&["a".to_string()], true);
    let m = Arc::make_mut(s.masters.get_mut("a").expect("a"));
    m.primary = Some(Node { ip: [127, 0, 0, 1].into(), port, hostname: None });
    m.epoch = Some(epoch);
    s
}

fn primary(s: &Snapshot) -> Option<(u16, u64)> {
    let m = s.master("a")?;
    Some((m.primary.as_ref()?.port, m.epoch?))
}

/// Regression (docs/deciding.md, "Start-up, restarts and reloads"): a reload mid-failover took over
/// with the new watcher's first picture (the old primary, epoch 1) over the flip the old watcher
/// had published (epoch 2): a lower epoch was published.
#[test]
fn a_reload_mid_failover_never_publishes_a_lower_epoch() {
    let mut floors = floors(&at(7002, 2));
    let cases = [
        ("the new watcher is behind: the floor stays", at(7001, 1), Some((7002, 2))),
        ("it reached the floor: its own view", at(7002, 2), Some((7002, 2))),
        ("then a withdrawal of its own is its own", at(7001, 1), Some((7001, 1))),
    ];
    for (why, side, want) in cases {
        assert_eq!(primary(&hold(&mut floors, side)), want, "{why}");
    }
    assert!(behind(&super::floors(&at(7002, 2)), &at(7001, 1)));
    assert!(!behind(&super::floors(&at(7002, 2)), &at(7003, 3)));
}

/// `s` with its master's primary a provisional flip.
fn flip(mut s: Snapshot) -> Snapshot {
    Arc::make_mut(s.masters.get_mut("a").expect("a")).provisional = true;
    s
}

/// `s` naming the flip to `port` at `epoch` withdrawn.
fn undoing(mut s: Snapshot, port: u16, epoch: u64) -> Snapshot {
    let node = Node { ip: [127, 0, 0, 1].into(), port, hostname: None };
    Arc::make_mut(s.masters.get_mut("a").expect("a")).withdrawn = Some(Withdrawn { node, epoch });
    s
}

/// A watcher per generation, each publishing its script (`(after, snapshot)`, from its own
/// start) and then running until stopped.
fn scripted(scripts: Vec<Vec<(u64, Snapshot)>>) -> impl Start {
    let generation = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    move |_: &Config, publisher: Publisher, _: Arc<EventLog>, stop: CancellationToken| {
        let n = generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let script = scripts.get(n).cloned().unwrap_or_default();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            for (after, snapshot) in script {
                tokio::select! {
                    _ = tokio::time::sleep_until(started + Duration::from_secs(after)) => {}
                    _ = stop.cancelled() => return,
                }
                publisher.replace(snapshot);
            }
            stop.cancelled().await;
        })
    }
}

/// Runs `follow_reloads` over `scripts`; reloads (a new masters list) at second 1 and watches the
/// daemon's primaries `(port, epoch, provisional, withdrawn epoch)` until second `until`.
async fn reload_over(
    scripts: Vec<Vec<(u64, Snapshot)>>,
    until: u64,
) -> Vec<(u16, u64, bool, Option<u64>)> {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("polestar.yaml");
    std::fs::write(&path, BASE).expect("write");
    let (reloader, config) = Reloader::new(Config::load(&path).expect("valid"));
    let (publisher, reader) = topology::channel();
    let events = Arc::new(EventLog::new());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(follow_reloads(
        config,
        publisher,
        events,
        shutdown.clone(),
        scripted(scripts),
    ));
    let watch = tokio::spawn(async move {
        let mut reader = reader;
        let mut seen = Vec::new();
        while reader.changed().await.is_ok() {
            let s = reader.borrow_and_update().clone();
            let Some(m) = s.master("a") else { continue };
            let (Some(p), Some(e)) = (m.primary.as_ref(), m.epoch) else { continue };
            seen.push((p.port, e, m.provisional, m.withdrawn.as_ref().map(|w| w.epoch)));
        }
        seen
    });
    sleep(Duration::from_millis(1500)).await;
    std::fs::write(&path, BASE.replace("[{ name: a }]", "[{ name: a, dns_name: x }]"))
        .expect("write");
    reloader.reload().expect("a valid file");
    sleep(Duration::from_secs(until) - Duration::from_millis(1500)).await;
    shutdown.cancel();
    task.await.expect("follow_reloads ends at shutdown");
    drop(reloader);
    watch.await.expect("the recorder ends with the channel")
}

/// Regression (a reload during a provisional flip): the old watcher had flipped to
/// 7002 at epoch 2 provisionally; a SIGHUP started the new watcher, whose first majority is
/// 7001 at epoch 1; the failover aborted during the warm-up and the old watcher withdrew the
/// flip. The floors had been copied when the warm-up began, so the takeover put the withdrawn
/// 7002 back and held it (the new watcher never reaches epoch 2): DNS named a replica.
#[tokio::test(start_paused = true)]
async fn a_reload_during_a_provisional_flip_then_withdrawn_never_publishes_it_again() {
    let old = vec![(0, at(7001, 1)), (1, flip(at(7002, 2))), (3, undoing(at(7001, 1), 7002, 2))];
    let new = vec![(0, at(7001, 1))];
    let seen = reload_over(vec![old, new], 40).await;
    let withdrawn = seen.iter().position(|s| s.0 == 7001 && s.3 == Some(2)).expect("withdrawn");
    assert!(seen[withdrawn..].iter().all(|s| s.0 == 7001), "published again: {seen:?}");
    assert_eq!(seen.last().map(|s| (s.0, s.1)), Some((7001, 1)), "{seen:?}");
}

/// The old watcher never resolves its provisional flip (SETTLE runs out): the new watcher,
/// which never saw that promotion and could never withdraw it, is not held below it; its view
/// is published, naming the flip withdrawn (so that agents follow the lower epoch).
#[tokio::test(start_paused = true)]
async fn a_provisional_flip_the_old_watcher_never_resolved_is_not_held_after_a_reload() {
    let old = vec![(0, at(7001, 1)), (1, flip(at(7002, 2)))];
    let new = vec![(0, at(7001, 1))];
    let seen = reload_over(vec![old, new], (WARMUP + SETTLE).as_secs() + 10).await;
    assert_eq!(seen.last(), Some(&(7001, 1, false, Some(2))), "{seen:?}");
}

/// A confirmed flip is never lowered by the takeover: the new watcher reaches it seconds later.
#[tokio::test(start_paused = true)]
async fn a_reload_after_a_confirmed_flip_never_lowers_its_epoch() {
    let old = vec![(0, at(7001, 1)), (1, at(7002, 2))];
    let new = vec![(0, at(7001, 1)), (20, at(7002, 2))];
    let seen = reload_over(vec![old, new], 40).await;
    let flipped = seen.iter().position(|s| s.0 == 7002).expect("the flip");
    assert!(seen[flipped..].iter().all(|s| (s.0, s.1) == (7002, 2)), "{seen:?}");
}

#[test]
fn floors_hold_confirmed_epochs_and_undo_unresolved_flips() {
    let get = |s: &Snapshot| {
        let m = s.master("a").expect("a");
        (primary(s), m.withdrawn.as_ref().map(|w| w.epoch))
    };
    // A confirmed floor the new watcher names withdrawn (an agent following its upstreams).
    let mut f = floors(&at(7002, 2));
    assert_eq!(get(&hold(&mut f, undoing(at(7001, 1), 7002, 2))), (Some((7001, 1)), Some(2)));
    assert!(f.is_empty(), "dropped for good");
    assert!(!behind(&floors(&at(7002, 2)), &undoing(at(7001, 1), 7002, 2)));
    // An unresolved flip: never held, named withdrawn while the new watcher is below it.
    let mut f = floors(&flip(at(7002, 2)));
    assert!(!behind(&f, &at(7001, 1)), "a provisional flip is no floor to wait for");
    assert_eq!(get(&hold(&mut f, at(7001, 1))), (Some((7001, 1)), Some(2)));
    assert_eq!(get(&hold(&mut f, at(7003, 3))), (Some((7003, 3)), None));
    assert!(f.is_empty());
}

/// The old watcher withdrew a flip before the takeover: the new watcher, which never saw it,
/// still says so while below it (agents lower an epoch only on a withdrawal they are shown).
#[test]
fn a_withdrawal_the_old_watcher_published_is_still_shown_after_the_takeover() {
    let mut f = floors(&undoing(at(7001, 1), 7002, 2));
    let held = hold(&mut f, at(7001, 1));
    let m = held.master("a").expect("a");
    assert_eq!((primary(&held), m.withdrawn.as_ref().map(|w| w.epoch)), (Some((7001, 1)), Some(2)));
    let again = hold(&mut f, at(7001, 1));
    assert!(again.master("a").is_some_and(|m| m.withdrawn.is_some()), "on every snapshot");
    let later = hold(&mut f, at(7003, 3));
    assert!(later.master("a").is_some_and(|m| m.withdrawn.is_none()) && f.is_empty());
}
