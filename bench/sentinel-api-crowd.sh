#!/usr/bin/env bash
# Issue 26, item 5: SUBSCRIBERS subscribers of `+switch-master` on one release polestar's
# Sentinel endpoint (a real lab of 3 nodes and 3 Sentinels, a real `SENTINEL FAILOVER`):
# polestar's RSS before, attached, after the switch and at its peak, and when each subscriber
# heard the switch, from polestar's publication (the `switch` event's time_ms) and from the
# first subscriber: p50, p99, max, share within 100 ms; the load average.
#
#   bench/sentinel-api-crowd.sh                 20,000 subscribers
#   SUBSCRIBERS=2000 bench/sentinel-api-crowd.sh
#
# The client is examples/crowd/, built in release (a task per connection on tokio's
# epoll runtime), so that it is not the bottleneck. Loopback only: sources 127.0.20.1...,
# 200 each (the per-address cap is 256); bounded: 240 s of setup, 30 s to hear the switch.
# The count is clamped to RLIMIT_NOFILE's hard limit (see the output's note).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh
ulimit -n "$(ulimit -Hn)"
cargo build --release --quiet --bin polestar --example crowd
exec target/release/examples/crowd sentinel "${SUBSCRIBERS:-20000}"
