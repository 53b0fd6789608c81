use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};
use tokio::time::sleep;

use super::*;
use crate::reload::Reloader;
use crate::topology::{Master, MasterState, Node, SentinelCounts};

const BASE: &str = "sentinels: { addresses: [\"127.0.0.1:26379\"] }\nmasters: [{ name: a }]\n";

fn snapshot(names: &[String], known: bool) -> Snapshot {
    let master = |name: &String| Master {
        withdrawn: None,
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
    writer: TopologyWriter,
    events: Arc<EventLog>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let names: Vec<String> = config.masters.iter().flatten().map(|m| m.name.clone()).collect();
    tokio::spawn(async move {
        writer.send_replace(Arc::new(snapshot(&names, false)));
        events.push("warming", None, Value::Null);
        sleep(Duration::from_millis(100)).await;
        writer.send_replace(Arc::new(snapshot(&names, true)));
        loop {
            tokio::select! {
                _ = sleep(Duration::from_secs(1)) => {
                    events.push("later", None, json!({ "masters": names.len() }));
                }
                _ = stop.cancelled() => return,
            }
        }
    })
}

/// `supervise` running the fake watcher on a config file with `BASE`, its first state out.
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
        let (writer, mut reader) = topology::channel();
        let events = Arc::new(EventLog::new());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(supervise(config, writer, events.clone(), shutdown.clone(), fake));
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
    task.await.expect("supervise ends at shutdown");
    drop(reloader);

    let seen = watch.await.expect("the recorder ends with the channel");
    assert!(seen.iter().all(|(_, complete)| *complete), "a blank state was published: {seen:?}");
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "versions must grow: {seen:?}");
    let kinds: Vec<(&str, Value)> = events
        .since(None)
        .into_iter()
        .map(|e| (e.kind, e.data.get("masters").cloned().unwrap_or_default()))
        .collect();
    assert_eq!(kinds.iter().filter(|(k, _)| *k == "warming").count(), 1, "{kinds:?}");
    assert!(kinds.contains(&("later", json!(2))), "the new watcher's events: {kinds:?}");
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
    task.await.expect("supervise ends at shutdown");
    let warmed = events.since(None).iter().filter(|e| e.kind == "warming").count();
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

/// Regression (issue 25, item 4): a reload mid-failover took over with the new watcher's
/// first picture (the old primary, epoch 1) over the flip the old watcher had published
/// (epoch 2): a lower epoch was published.
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
