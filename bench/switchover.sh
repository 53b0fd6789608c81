#!/bin/sh
# The lossless switchover beside a plain SENTINEL FAILOVER at the same replication lag (each
# started once the replicas are BENCH_LAG_MB, default 8, behind), in one run, on Redis 7.0,
# Valkey 8.1 and Valkey 9.1 (there also Valkey's own SENTINEL FAILOVER COORDINATED): real
# servers and Sentinels in network namespaces, tbf at 40 Mbit/s toward the replicas; see
# tests/bench_switchover.rs. Needs root and tests/deps.sh. Prints a Markdown table.
set -eu
cd "$(dirname "$0")/.."
exec cargo nextest run --locked --test tests --run-ignored only --no-capture \
    bench_switchover::bench_switchover_loss_beside_a_plain_sentinel_failover
