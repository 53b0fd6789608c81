#!/usr/bin/env bash
# Crowds (bench/README.md): AGENTS agent-equivalents following one release polestar over HTTP with
# the agent token (a real lab of 3 nodes and 3 Sentinels, a real `SENTINEL FAILOVER`). Each
# does what src/agent/mod.rs's follower does: holds `GET /v1/events/stream`, reads
# `GET /v1/masters` on a second, kept-alive connection at the start, after every chunk that
# holds an event and after 5 s without one. Prints when each had the new primary from
# /v1/masters, from polestar's publication (the `switch` event's time_ms) and from the first
# agent (p50, p99, max, share within 100 ms), polestar's RSS, and the load average.
#
#   bench/agents-crowd.sh               10,000 agents
#   AGENTS=2000 bench/agents-crowd.sh
#
# The client is examples/crowd/ in release. Loopback only: sources 127.0.20.1..., 100
# agents (200 connections) each (the per-address cap is 512); bounded: 240 s of setup, 30 s
# to have the new primary. Two descriptors per agent in both processes: the count is clamped
# to RLIMIT_NOFILE's hard limit (see the output's note).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh
ulimit -n "$(ulimit -Hn)"
cargo build --release --quiet --bin polestar --example crowd
exec target/release/examples/crowd agents "${AGENTS:-10000}"
