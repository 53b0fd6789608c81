#!/usr/bin/env bash
# Scale: MASTERS master groups (tiny redis-servers on loopback), STORM of them with a replica,
# 3 Sentinels monitoring all of them, one release polestar serving DNS and HTTP with drain.
# Prints the time from polestar's start to every master published, its RSS, its CPU at idle
# over IDLE seconds, and during a failover storm of the STORM masters at once: its CPU, DNS
# QPS (dnsperf) and HTTP requests/s (a bounded load loop), and how long until all were
# published on their new primary (and, from polestar's own switch events, when it flipped
# each one); a storm that does not finish is reported, not an abort. Also the RSS after the
# idle time. SCALE_HOLD=1 keeps the cluster up without polestar (to profile polestar against
# it by hand) until Ctrl-C.
# SCALE_SEEDED=1 writes into the Sentinels' configs what they would learn (their ids, the
# other Sentinels, the replicas): without it they need O(N²) to learn N masters (18 minutes
# for 4,000 here; see bench/README.md, "Where it stops").
#
#   bench/scale.sh [MASTERS] [STORM] [IDLE]      (defaults: 1000 50 30)
#
# Loopback only; ports from 21000 up (below the ephemeral range). About 3 MB of RSS per
# redis-server; everything started is killed on exit (or, after a kill -9, by the next run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh
if ! command -v dnsperf >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q dnsperf >/dev/null
fi
masters=${1:-1000}
storm=${2:-50}
# Sentinel and the servers need a descriptor per link: 3 per master per Sentinel and more.
ulimit -n "$(( masters * 8 + 4096 ))" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
cargo build --release --quiet --bin polestar --example scale
exec target/release/examples/scale "$masters" "$storm" "${3:-30}"
