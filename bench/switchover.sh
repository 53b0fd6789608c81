#!/bin/sh
# The lossless switchover beside a plain SENTINEL FAILOVER at the same replication lag, in one
# run (real Redis servers and Sentinels in network namespaces, tbf at 40 Mbit/s toward the
# replicas; see tests/bench_switchover.rs). Needs root. Prints a Markdown table.
set -eu
cd "$(dirname "$0")/.."
exec cargo nextest run --locked --test tests --run-ignored only --no-capture \
    bench_switchover::bench_switchover_loss_beside_a_plain_sentinel_failover
