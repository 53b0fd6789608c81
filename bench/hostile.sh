#!/usr/bin/env bash
# The attacks of tests/hostile_load.rs (docs/limits.md) against the real polestar binary on loopback
# (a flooding fake Sentinel beside a real lab; 3000 anonymous SSE/long-polls; 2000 slow bodies; 1100
# clients holding DNS TCP connections; a UDP burst from one address), each measured twice in the
# same run: the real work's latency (slowest of a few) and polestar's peak RSS (VmRSS), unloaded and
# under the attack, side by side.
#
#   bench/hostile.sh
#   BENCH_PROFILE=release bench/hostile.sh   cargo profile (default: dev, as the test suite)
#
# Loopback only; every attack is bounded in count and time. Also writes
# target/bench-hostile.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh demo
profile=()
[ "${BENCH_PROFILE:-dev}" = release ] && profile=(--release)
# Thousands of sockets here too (polestar raises its own limit).
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
cargo test "${profile[@]}" --quiet --test tests hostile_load::bench_hostile -- --ignored \
  --nocapture --exact 2>&1 | grep -vE "^(running|test result|$)|^test hostile_load" || true
