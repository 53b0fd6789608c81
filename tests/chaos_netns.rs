//! Chaos in network namespaces (bench/README.md, "Chaos soak"): polestar on every side of a
//! Sentinel deployment while a seeded schedule of faults runs, with clients writing through it. The
//! short run is part of CI; the long soak is `bench/chaos.sh [SEED] [FAULTS] [MINUTES]`. Both print
//! a table per fault kind and append it to `target/chaos-report.txt`. Needs root (namespaces,
//! iptables).

use crate::chaos;

use std::time::Duration;

use chaos::Settings;
use polestar_lab::Flavor;

fn save(table: &str) {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/target/chaos-report.txt");
    let _ = std::fs::OpenOptions::new().create(true).append(true).open(file).and_then(|mut f| {
        use std::io::Write;
        writeln!(f, "{table}")
    });
}

async fn soak_and_check(defaults: Settings) {
    let settings = Settings::from_env(defaults);
    eprintln!("CHAOS settings: {settings:?}");
    let report = chaos::soak(&settings).await.unwrap_or_else(|e| panic!("{e:#}"));
    let table = report.table();
    eprintln!("{table}");
    save(&table);
    let violations = report.violations();
    assert!(violations.is_empty(), "seed {}: {violations:#?}\n{table}", settings.seed);
}

/// Four faults, a planned failover first: no stuck client, no wrong answer beyond the grace,
/// no acknowledged write lost on a planned failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_chaos_run_strands_no_client_and_loses_no_planned_write() {
    let flavor = Flavor::Redis;
    soak_and_check(Settings { seed: 7, faults: 4, duration: Duration::from_secs(120), flavor })
        .await;
}

/// Valkey 8 (valkey-server, Sentinels with --sentinel): a shorter run, the faults of every
/// kind that the seed picks first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_short_chaos_run_strands_no_client_and_loses_no_planned_write() {
    let flavor = crate::common::valkey();
    soak_and_check(Settings { seed: 7, faults: 3, duration: Duration::from_secs(90), flavor })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the long soak: bench/chaos.sh [SEED] [FAULTS] [MINUTES]"]
async fn chaos_soak() {
    let flavor = polestar_lab::Flavor::from_env();
    soak_and_check(Settings { seed: 1, faults: 50, duration: Duration::from_secs(600), flavor })
        .await;
}
