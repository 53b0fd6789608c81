use std::collections::BTreeSet;

use metrics::with_local_recorder;
use metrics_exporter_prometheus::PrometheusBuilder;

use super::*;

/// What the daemon does with the series of a few masters, one of them named to need escaping,
/// plus series that are not per-master or not shaped like one (which the exporter keeps).
fn record_a_day() {
    describe_like_the_daemon();
    for master in ["m0", "m1", "we\"ird\\na\nme"] {
        register_master(master);
        crate::readiness::register_master(master);
        for state in MasterState::ALL {
            let value = if state == MasterState::Ok { 1.0 } else { 0.0 };
            metrics::gauge!(MASTER_STATE, "master" => master.to_string(), "state" => state.as_str())
                .set(value);
        }
        metrics::gauge!(MASTER_EPOCH, "master" => master.to_string()).set(7.0);
    }
    metrics::counter!(PRIMARY_CHANGES, "master" => "m1").increment(3);
    metrics::counter!(PRIMARY_CHANGES, "master" => "m1").absolute(2);
    metrics::counter!(DRAIN_KILLED, "master" => "m0", "method" => "client_kill").increment(5);
    metrics::gauge!(OLD_PRIMARY_CLIENTS, "master" => "m0").increment(4.0);
    metrics::gauge!(OLD_PRIMARY_CLIENTS, "master" => "m0").decrement(1.5);
    for wait in [0.003, 0.2, 0.2, 75.0] {
        metrics::histogram!(SWITCHOVER_WAIT, "master" => "m1").record(wait);
    }
    let lag = |replica: &str| {
        let labels = [("master", "m0".to_string()), ("replica", replica.to_string())];
        metrics::gauge!(REPLICA_LAG, &labels)
    };
    lag("10.0.0.2:6379").set(1234.0);
    lag("10.0.0.3:6379").set(f64::NAN);
    lag("10.0.0.2:6379").set(99.0);
    // Not per-master: the exporter's.
    metrics::gauge!(SENTINEL_UP, "sentinel" => "127.0.0.1:26379").set(1.0);
    metrics::counter!(DNS_QUERIES, "rcode" => "NOERROR").increment(9);
}

/// Keys of per-master families without the family's shape (no call in polestar makes one).
fn record_misshapen() {
    metrics::counter!(DRAIN_KILLED, "master" => "m0", "method" => "carrier_pigeon").increment(1);
    metrics::counter!(PRIMARY_CHANGES, "master" => "m0", "shard" => "a").increment(1);
    metrics::counter!(PRIMARY_CHANGES, "shard" => "a", "master" => "m0").increment(1);
    metrics::gauge!(REPLICA_LAG, "master" => "m0").set(1.0);
}

fn describe_like_the_daemon() {
    describe_counter!(PRIMARY_CHANGES, "Published primary changes");
    describe_gauge!(REPLICA_LAG, Unit::Bytes, "Bytes behind");
    describe_histogram!(SWITCHOVER_WAIT, Unit::Seconds, "How long a switchover held the fence");
    describe_gauge!(SENTINEL_UP, "1 while connected");
}

/// The exposition as a set of lines, and the series' families each under one TYPE line.
fn lines(text: &str) -> BTreeSet<String> {
    text.lines().filter(|l| !l.is_empty()).map(str::to_string).collect()
}

fn exporter_alone() -> String {
    let builder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(SWITCHOVER_WAIT.into()),
            &SWITCHOVER_WAIT_BUCKETS,
        )
        .expect("buckets");
    let exporter = builder.build_recorder();
    let handle = exporter.handle();
    with_local_recorder(&exporter, record_a_day);
    handle.render()
}

fn ours_after(record: impl FnOnce()) -> String {
    let recorder = recorder();
    let handle =
        Handle { exporter: recorder.exporter.handle(), per_master: recorder.per_master.clone() };
    with_local_recorder(&recorder, record);
    handle.render()
}

fn ours() -> String {
    ours_after(record_a_day)
}

#[test]
fn the_exposition_is_the_exporters_line_for_line() {
    let (theirs, ours) = (exporter_alone(), ours());
    let (theirs, ours) = (lines(&theirs), lines(&ours));
    let only_theirs: Vec<_> = theirs.difference(&ours).collect();
    let only_ours: Vec<_> = ours.difference(&theirs).collect();
    assert!(only_theirs.is_empty() && only_ours.is_empty(), "{only_theirs:#?}\n{only_ours:#?}");
    // What was recorded is there, not only the same nothing on both sides.
    assert!(ours.contains("polestar_primary_changes_total{master=\"m1\"} 3"));
    assert!(ours.contains("polestar_old_primary_clients{master=\"m0\"} 2.5"));
    assert!(
        ours.contains("polestar_replica_lag_bytes{master=\"m0\",replica=\"10.0.0.2:6379\"} 99")
    );
    assert!(ours.contains("polestar_switchover_wait_seconds_bucket{master=\"m1\",le=\"0.25\"} 3"));
    assert!(ours.contains("polestar_switchover_wait_seconds_count{master=\"m1\"} 4"));
    assert!(ours.contains("polestar_master_epoch{master=\"we\\\"ird\\\\na\\nme\"} 7"));
}

#[test]
fn each_family_is_one_block_under_one_type_line_whatever_is_recorded() {
    let text = ours_after(|| {
        record_a_day();
        record_misshapen();
    });
    assert_eq!(lines(&text), lines(&ours()), "a misshapen key is not kept");
    let mut seen = BTreeSet::new();
    let mut current = String::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| f.ends_with("_seconds")))
            .unwrap_or(name)
            .to_string();
        if family != current {
            assert!(seen.insert(family.clone()), "{family} appears in two blocks:\n{text}");
            current = family;
        }
    }
    for family in &seen {
        let types = text.matches(&format!("# TYPE {family} ")).count();
        assert_eq!(types, 1, "{family}: {types} TYPE lines");
    }
}

#[test]
fn a_masters_record_holds_every_fixed_series_in_one_word_of_presence() {
    let layout = Layout::new();
    let fixed: usize = layout.families.iter().map(Family::series).sum();
    assert!(fixed <= 64, "{fixed} fixed series");
    // Every family the daemon registers per master is laid out here.
    for name in [PRIMARY_CHANGES, FAILOVER_BLOCKED, MASTER_STATE, REPLICA_LAG, SWITCHOVER_WAIT] {
        assert!(layout.family(name).is_some(), "{name}");
    }
    // And a master's record is small: its slots, not a key and a handle per series.
    assert!(layout.slots * 8 <= 512, "{} slots", layout.slots);
}
