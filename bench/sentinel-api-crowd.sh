#!/usr/bin/env bash
# Crowds (bench/README.md): SUBSCRIBERS subscribers of `+switch-master` on one release polestar's
# Sentinel endpoint (a real lab of 3 nodes and 3 Sentinels, a real `SENTINEL FAILOVER`):
# polestar's RSS before, attached, after the switch and at its peak; when each subscriber
# heard the switch, from polestar's publication (the `switch` event's time_ms) and from the
# first subscriber: p50, p99, max, share within 100 ms; the CPU the endpoint's threads spent
# per subscriber; DNS and HTTP answer times (a query and a `GET .../primary` every 2 ms, on
# a thread of their own) in the 2 s before the failover and during the fan-out; the load.
#
#   bench/sentinel-api-crowd.sh                 20,000 subscribers
#   SUBSCRIBERS=2000 bench/sentinel-api-crowd.sh
#   POLESTAR_NICE=-10 bench/sentinel-api-crowd.sh   polestar's threads at nice -10 (as on a
#                                                   host of its own: the machine is shared)
#   CROWD_NICE=0 bench/sentinel-api-crowd.sh        the crowd and the lab not reniced
#
# The client is examples/crowd/, built in release (a task per connection on tokio's epoll
# runtime). It takes each arrival from the kernel's receive stamp (SO_TIMESTAMPING; on
# loopback, when polestar's write handed the bytes over), so that it and the lab's Redis and
# Sentinel processes can run at nice 10 (CROWD_NICE) while polestar fans out: in a deployment
# they are other hosts. Loopback only: sources 127.0.20.1..., 200 each (the per-address cap is
# 256); bounded: 240 s of setup, 30 s to hear the switch. The count is clamped to
# RLIMIT_NOFILE's hard limit (see the output's note).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh
ulimit -n "$(ulimit -Hn)"
cargo build --release --quiet --bin polestar --example crowd
exec target/release/examples/crowd sentinel "${SUBSCRIBERS:-20000}"
