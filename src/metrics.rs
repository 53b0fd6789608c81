//! Metric names (one place, as constants), the Prometheus recorder, and the series that
//! exist from the start: every series of a known master is registered (counters at 0) as soon
//! as the master is known, so that `rate()` and absence alerts work before the first failover.

use std::sync::Arc;

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

mod per_master;

use per_master::PerMaster;

pub const SENTINEL_UP: &str = "polestar_sentinel_up";
pub const SENTINELS_DISCOVERED: &str = "polestar_sentinels_discovered";
pub const MASTER_EPOCH: &str = "polestar_master_epoch";
pub const MASTER_STATE: &str = "polestar_master_state";
pub const PRIMARY_CHANGES: &str = "polestar_primary_changes_total";
pub const PUBLISH_LATENCY: &str = "polestar_publish_latency_seconds";
pub const DRAIN_KILLED: &str = "polestar_drain_killed_total";
pub const DNS_QUERIES: &str = "polestar_dns_queries_total";
pub const DNS_RATE_LIMITED: &str = "polestar_dns_rate_limited_total";
pub const DNS_RATE_LIMIT_EVICTIONS: &str = "polestar_dns_rate_limit_evictions_total";
pub const DNS_TCP_REFUSED: &str = "polestar_dns_tcp_refused_total";
pub const HTTP_REQUESTS: &str = "polestar_http_requests_total";
pub const HTTP_CONNECTIONS_REFUSED: &str = "polestar_http_connections_refused_total";
pub const SENTINEL_API_CONNECTIONS: &str = "polestar_sentinel_api_connections";
pub const SENTINEL_API_ACCEPTED: &str = "polestar_sentinel_api_connections_total";
pub const SENTINEL_API_DISCONNECTS: &str = "polestar_sentinel_api_disconnects_total";
pub const SENTINEL_API_COMMANDS: &str = "polestar_sentinel_api_commands_total";
pub const SENTINEL_API_PUBLISHED: &str = "polestar_sentinel_api_published_total";
pub const FAILOVER_READY: &str = "polestar_failover_ready";
pub const FAILOVER_BLOCKED: &str = "polestar_failover_blocked";
pub const REPLICA_LAG: &str = "polestar_replica_lag_bytes";
pub const OLD_PRIMARY_CLIENTS: &str = "polestar_old_primary_clients";
pub const OLD_PRIMARY_STALE_CLIENTS: &str = "polestar_old_primary_stale_clients_total";
pub const FAILOVER_SECONDS: &str = "polestar_failover_seconds";
pub const SENTINEL_API_LIMITED: &str = "polestar_sentinel_api_limited_total";
pub const SWITCHOVERS: &str = "polestar_switchovers_total";
pub const SWITCHOVER_WAIT: &str = "polestar_switchover_wait_seconds";
pub const BAD_REPLIES: &str = "polestar_bad_replies_total";

/// The `method` label values of [`DRAIN_KILLED`].
pub const KILL_METHODS: [&str; 2] = ["client_kill", "sock_destroy"];

/// The `outcome` label values of [`SWITCHOVERS`].
pub const SWITCHOVER_OUTCOMES: [&str; 4] =
    ["failed_over", "not_caught_up", "too_far_behind", "refused"];

/// The buckets of [`SWITCHOVER_WAIT`], in seconds: a fence is held at most 40% of Sentinel's
/// `down-after-milliseconds`, and `max_wait` is at most a minute.
const SWITCHOVER_WAIT_BUCKETS: [f64; 12] =
    [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0];

/// Registers every per-master series of `master` that counts events (at 0 when new; an
/// existing counter keeps its value). The gauges are set by the decider with the state.
pub fn register_master(master: &str) {
    metrics::counter!(PRIMARY_CHANGES, "master" => master.to_string()).increment(0);
    metrics::gauge!(OLD_PRIMARY_CLIENTS, "master" => master.to_string()).increment(0.0);
    metrics::counter!(OLD_PRIMARY_STALE_CLIENTS, "master" => master.to_string()).increment(0);
    for method in KILL_METHODS {
        metrics::counter!(DRAIN_KILLED, "master" => master.to_string(), "method" => method)
            .increment(0);
    }
    for outcome in SWITCHOVER_OUTCOMES {
        metrics::counter!(SWITCHOVERS, "master" => master.to_string(), "outcome" => outcome)
            .increment(0);
    }
    // Registered, not observed: the histogram's series exist with a count of 0.
    drop(metrics::histogram!(SWITCHOVER_WAIT, "master" => master.to_string()));
}

/// What `GET /metrics` renders: the exporter's series, then the per-master ones.
#[derive(Clone)]
pub struct Handle {
    exporter: PrometheusHandle,
    per_master: Arc<PerMaster>,
}

impl Handle {
    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = self.exporter.render();
        self.per_master.render(&mut out);
        out
    }
}

/// Installs the process-wide recorder (once; later calls get a recorder that is not global,
/// which only happens in tests that start several daemons in one process).
pub fn install() -> Handle {
    let recorder = recorder();
    let handle = recorder.handle();
    if metrics::set_global_recorder(recorder).is_ok() {
        describe();
        crate::phases::register();
    }
    handle
}

/// The recorder: the exporter with the histograms' buckets, and the per-master records.
fn recorder() -> per_master::Recorder {
    let buckets = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
    let builder = PrometheusBuilder::new();
    let builder = builder
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(PUBLISH_LATENCY.into()),
            &buckets,
        )
        .unwrap_or_else(|_| PrometheusBuilder::new());
    // Never fails: the buckets are not empty.
    let builder = builder
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(FAILOVER_SECONDS.into()),
            &crate::phases::BUCKETS,
        )
        .expect("the failover phases have buckets");
    let exporter = builder.build_recorder();
    per_master::Recorder { exporter, per_master: Arc::default() }
}

/// Every metric's description, one entry per metric: as long as the list of metrics.
fn describe() {
    describe_counter!(
        BAD_REPLIES,
        "Replies from a Sentinel or a node that were not RESP or broke a bound: each costs its exchange only"
    );
    describe_counter!(
        SWITCHOVERS,
        "polestar's switchovers, by outcome (failed_over, not_caught_up, too_far_behind, refused)"
    );
    describe_histogram!(
        SWITCHOVER_WAIT,
        Unit::Seconds,
        "How long a switchover held the primary fenced for its replicas: until they had all of it (failed_over) or until max_wait (not_caught_up)"
    );
    describe_gauge!(SENTINEL_UP, "1 while polestar is connected to this Sentinel");
    describe_gauge!(
        SENTINELS_DISCOVERED,
        "Sentinels the configured ones list for this master that are not configured (never trusted)"
    );
    describe_gauge!(MASTER_EPOCH, "Config epoch of the published primary");
    describe_gauge!(
        MASTER_STATE,
        "1 for the master's current state (ok, failover, stale, unknown)"
    );
    describe_counter!(PRIMARY_CHANGES, "Published primary changes");
    describe_histogram!(
        PUBLISH_LATENCY,
        Unit::Seconds,
        "From a Sentinel event reaching polestar to the new primary being published"
    );
    describe_counter!(DRAIN_KILLED, "Client connections killed on old primaries");
    describe_counter!(DNS_QUERIES, "DNS queries answered, by response code");
    describe_counter!(
        DNS_RATE_LIMITED,
        "UDP answers past dns.rate_limit, by action (slip: sent truncated; drop: not sent)"
    );
    describe_counter!(
        DNS_RATE_LIMIT_EVICTIONS,
        "Rate-limit keys forgotten because the table was full (their clients answered as new)"
    );
    describe_counter!(
        DNS_TCP_REFUSED,
        "DNS TCP connections closed unserved, by reason (per_client: its address's share held and its turn did not come; full: every slot taken)"
    );
    describe_counter!(HTTP_REQUESTS, "HTTP requests, by route and status code");
    describe_counter!(
        HTTP_CONNECTIONS_REFUSED,
        "HTTP connections refused, by reason (per_client: its share held; connections_full: no token while every anonymous slot is taken; probation_evicted: silent on probation past its grace while the pool was full)"
    );
    describe_gauge!(SENTINEL_API_CONNECTIONS, "Open connections to the Sentinel API endpoint");
    describe_counter!(
        SENTINEL_API_ACCEPTED,
        "Sentinel API connections accepted: served, or refused at the connection cap"
    );
    describe_counter!(
        SENTINEL_API_DISCONNECTS,
        "Sentinel API connections ended, by reason (slow_subscriber: fell behind and was closed)"
    );
    describe_counter!(SENTINEL_API_COMMANDS, "Sentinel API commands, by command");
    describe_counter!(SENTINEL_API_PUBLISHED, "Messages published to Sentinel API subscribers");
    describe_gauge!(FAILOVER_READY, "1 while a failover of this master is possible now");
    describe_gauge!(FAILOVER_BLOCKED, "1 while this reason keeps a failover from being possible");
    describe_gauge!(
        OLD_PRIMARY_CLIENTS,
        "Clients (not spared) found on the node being drained at the latest pass; 0 once its episode ends"
    );
    describe_counter!(
        OLD_PRIMARY_STALE_CLIENTS,
        "Clients still writing to an old primary when its drain.window ended (they get READONLY until they resolve the name again)"
    );
    describe_histogram!(
        FAILOVER_SECONDS,
        Unit::Seconds,
        "Failover phases: odown_to_flip, selected_to_flip (+selected-slave), flip_to_drained (the last old-primary client gone)"
    );
    describe_gauge!(REPLICA_LAG, Unit::Bytes, "Bytes of replication stream the replica is behind");
    describe_counter!(
        SENTINEL_API_LIMITED,
        "Sentinel API limits hit, by limit (max_connections, per_client, subscriptions, unauthenticated_input, request_size, input_budget, request_timeout, auth_timeout, idle_timeout, slow_subscriber, write_timeout)"
    );
}
