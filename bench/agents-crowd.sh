#!/usr/bin/env bash
# Crowds (bench/README.md): AGENTS agent-equivalents following one release polestar over HTTP with
# the agent token (a real lab of 3 nodes and 3 Sentinels, a real `SENTINEL FAILOVER`). Each
# does what src/agent/mod.rs's follower does, with the agent's own SSE reader and feed code:
#   AGENT_FOLLOW=feed (default)  holds `GET /v1/events/stream?masters=only` and applies every
#                                `masters` event (the stream carries the state; no request)
#   AGENT_FOLLOW=reread          what agents did before the feed (and do with an upstream
#                                without it): holds the event stream and reads `GET
#                                /v1/masters` on a second, kept-alive connection at the
#                                start, after every chunk that holds an event and after 5 s
#                                without one
# Prints when each had the new primary (the kernel's receive stamp of the bytes that told it)
# from polestar's publication (the `switch` event's time_ms) and from the first agent (p50,
# p99, max, share within 100 ms), when this client had applied it, polestar's CPU from the
# publication to the last arrival (per agent, and the cores it had), its RSS, and the load.
#
#   bench/agents-crowd.sh                              10,000 agents following the feed
#   AGENTS=2000 bench/agents-crowd.sh
#   AGENTS=9800 AGENT_FOLLOW=reread bench/agents-crowd.sh
#   POLESTAR_BIN=path/to/polestar bench/agents-crowd.sh   another build (an older polestar)
#
# The client is examples/crowd/ in release, its threads and the lab's Redis and Sentinel
# processes at nice CROWD_NICE (10). Loopback only: sources 127.0.20.1..., 100 agents each
# (the per-address cap is 512 connections); bounded: 240 s of setup, 30 s to have the new
# primary. One descriptor per agent in both processes (two when re-reading): the count is
# clamped to RLIMIT_NOFILE's hard limit (see the output's note).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh
ulimit -n "$(ulimit -Hn)"
cargo build --release --quiet --bin polestar --example crowd
exec target/release/examples/crowd agents "${AGENTS:-10000}" "${AGENT_FOLLOW:-feed}"
