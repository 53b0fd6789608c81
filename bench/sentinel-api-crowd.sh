#!/usr/bin/env bash
# Issue 26, item 5: 20,000 subscribers on polestar's Sentinel endpoint (a real lab, a real
# failover): polestar's RSS with them attached and after the switch, and the share that hears
# `+switch-master` within 100 ms of the first of them (p99, last), with the load average.
#
#   bench/sentinel-api-crowd.sh                       20,000 subscribers
#   SUBSCRIBERS=5000 bench/sentinel-api-crowd.sh
#   BENCH_PROFILE=release bench/sentinel-api-crowd.sh (default: dev, as the test suite)
#
# Loopback only (sources 127.0.10.1 ... so the 256-per-address cap holds); bounded: 120 s of
# setup, the switch within twice the failover bound. The test raises RLIMIT_NOFILE itself.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh
profile=()
[ "${BENCH_PROFILE:-dev}" = release ] && profile=(--release)
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
cargo test "${profile[@]}" --locked --quiet --test tests \
  bench_sentinel_api::bench_twenty_thousand_subscribers_hear_the_switch -- --ignored \
  --nocapture --exact 2>&1 | grep -E "SENTINEL_API_CROWD|panicked|FAILED" || true
