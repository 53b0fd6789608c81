#!/usr/bin/env bash
# Planned-failover figures (docs/failover.md) on a real local cluster (3 redis-server,
# 3 redis-sentinel on loopback, the real polestar binary with DNS and drain on):
#  1. over ROUNDS planned failovers (SENTINEL FAILOVER), recovery of an INCR writer and of a
#     BLPOP-0 client that find the primary through polestar's DNS name (from the command and
#     from the leader's +promoted-slave), and acknowledged writes lost;
#  2. the time to kill 10,000 clients at the default rate (drain.rate 2000/s), from the flip.
#
#   bench/drain.sh [ROUNDS]        planned failovers (default 5)
#   BENCH_PROFILE=release ...      cargo profile (default: dev, as the test suite)
#
# Loopback only. Also writes target/bench-drain.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh demo
profile=()
[ "${BENCH_PROFILE:-dev}" = release ] && profile=(--release)
BENCH_ROUNDS="${1:-${BENCH_ROUNDS:-5}}" \
  cargo test "${profile[@]}" --quiet --test tests bench_drain:: -- --ignored --nocapture
echo
echo "# 10,000 clients of the old primary, drain.rate 2000/s (default): flip -> last one killed"
# 10,000 client sockets here and 10,000 in redis-server.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
cargo test "${profile[@]}" --quiet --test tests drain::ten_thousand_clients_at_the_default_rate \
  -- --ignored --nocapture 2>&1 | grep -E "10,000 clients|panicked|FAILED" || true
