#!/usr/bin/env bash
# polestar against HAProxy (docs/failover.md, "Socket sweeping"): recovery of a persistent writer
# and a BLPOP-0 client (fault -> first success on the new primary) when the primary hangs (SIGSTOP)
# or its host goes dark (link down), with polestar (node-side sweep for hung, client-side sweep for
# dark) and with HAProxy role checks (inter 500ms fall 2 rise 1, on-marked-down shutdown-sessions),
# side by side, in network namespaces (10.77.0.0/24, private to this machine). Needs root.
#
#   bench/haproxy.sh [ROUNDS]      rounds per case and method (default 3)
#   BENCH_DOWN_AFTER_MS=1000 ...   Sentinel down-after-milliseconds (default 2000)
#   BENCH_PROFILE=release ...      cargo profile (default: dev, as the test suite)
#
# Prints each round and a median/max table; also writes target/bench-haproxy.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "bench/haproxy.sh needs root (network namespaces, CAP_NET_ADMIN)" >&2
  exit 1
fi
bash tests/deps.sh demo
need=()
command -v haproxy >/dev/null || need+=(haproxy)
command -v ip      >/dev/null || need+=(iproute2)
command -v ss      >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi
# The packaged service is not used (the bench starts its own HAProxy inside a namespace).
if command -v systemctl >/dev/null && systemctl is-active --quiet haproxy 2>/dev/null; then
  systemctl stop haproxy || true
fi
profile=()
[ "${BENCH_PROFILE:-dev}" = release ] && profile=(--release)
BENCH_ROUNDS="${1:-${BENCH_ROUNDS:-3}}" \
  cargo test "${profile[@]}" --quiet --test tests bench_haproxy:: -- --ignored --nocapture --test-threads 1
