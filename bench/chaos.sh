#!/usr/bin/env bash
# The chaos soak: polestar on every side of a Sentinel deployment in network namespaces, with
# Lettuce-like clients writing through it, under a seeded random schedule of faults (planned
# failovers, SIGKILL/SIGSTOP of the primary, a dark primary host, a Sentinel down or hung,
# the central polestar restarted mid-failover, the primary partitioned from the Sentinels).
#
#   bench/chaos.sh [SEED] [FAULTS] [MINUTES]      (defaults: 1 50 10; needs root)
#
# No new fault starts after MINUTES. Prints a line per fault and a table per fault kind (recovery
# median/max, acknowledged writes lost, seconds of wrong answers beyond the grace, seconds without
# an answer, stuck clients), also appended to target/chaos-report.txt. The same SEED gives the same
# schedule. Exits non-zero if a goal was missed: a stuck client, a wrong answer beyond the grace, an
# acknowledged write lost on a planned failover.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh
CHAOS_SEED=${1:-1} CHAOS_FAULTS=${2:-50} CHAOS_MINUTES=${3:-10} \
    exec cargo test --test tests -- --ignored --exact chaos_netns::chaos_soak --nocapture
