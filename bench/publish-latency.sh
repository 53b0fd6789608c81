#!/usr/bin/env bash
# Publish latency on a real local cluster: leader's send-slaveof-noone -> HTTP long-poll and
# DNS answer the new primary, over ROUNDS planned failovers (default 5). Loopback only.
# `--tls` as second argument: a TLS-only cluster, polestar over TLS.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh
cargo run --release --quiet --example publish_latency -- "${1:-5}" ${2:-}
