#!/usr/bin/env bash
# polestar's DNS server against knotd serving the same records, side by side with dnsperf.
#
#   bench/dns.sh [ROUNDS] [SECONDS]      (defaults: 3 rounds of 5 s per server)
#
# Loopback only. Builds the release example `dns_bench` (10 masters), writes a knotd zone with
# the same records into a temp dir, then runs dnsperf against knotd and polestar in turn for
# ROUNDS rounds (interleaved, so drift on a shared machine hits both), and one more pass with
# polestar's topology changing every 10 ms. Prints each QPS, the means and the ratio.
#
#   SUBSCRIBERS=20000 bench/dns.sh      also: polestar serves its Sentinel endpoint (its own
#                                       runtime, as the daemon) and, after the rounds above,
#                                       ROUNDS more of both servers run with SUBSCRIBERS
#                                       subscribers attached to it (examples/crowd/ `hold`,
#                                       sources 127.0.20.1...); prints polestar's QPS with them
#                                       over without, and over knotd. Clamped to what
#                                       RLIMIT_NOFILE's hard limit lets one process hold.
set -euo pipefail

ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-5}
MASTERS=10
ZONE=redis.internal.
DNSPERF_ARGS=(-c 4 -T 1 -q 200 -l "$SECONDS_PER_RUN")
SUBSCRIBERS=${SUBSCRIBERS:-0}
ulimit -n "$(ulimit -Hn)"

root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/tests/deps.sh"
if ! command -v dnsperf >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q dnsperf >/dev/null
fi
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

zone_file() {
    echo "\$ORIGIN $ZONE"
    echo "\$TTL 1"
    echo "@ SOA ns1 hostmaster 1 60 10 604800 1"
    echo "@ NS ns1"
    for i in $(seq 0 $((MASTERS - 1))); do
        local net="10.0.$i"
        echo "m$i A $net.1"
        echo "m$i TXT \"epoch=1\""
        echo "m$i TXT \"state=ok\""
        echo "_redis._tcp.m$i SRV 0 0 6379 m$i"
        echo "replicas.m$i A $net.2"
        echo "replicas.m$i A $net.3"
    done
}

query_file() {
    for i in $(seq 0 $((MASTERS - 1))); do
        echo "m$i.$ZONE A"
        echo "_redis._tcp.m$i.$ZONE SRV"
        echo "replicas.m$i.$ZONE A"
        echo "m$i.$ZONE TXT"
        echo "m$i.$ZONE AAAA"
        echo "nothing$i.$ZONE A"
    done
}

start_knot() {
    mkdir -p "$work/knot"
    zone_file | sed '/^$/d' > "$work/knot/$ZONE"zone
    cat > "$work/knot/knot.conf" <<CONF
server:
  rundir: "$work/knot"
  listen: 127.0.0.1@$knot_port
log:
  - target: stderr
    any: warning
database:
  storage: "$work/knot"
template:
  - id: default
    storage: "$work/knot"
    file: "%s.zone"
    zonefile-sync: -1
    journal-content: none
zone:
  - domain: $ZONE
CONF
    knotd -c "$work/knot/knot.conf" 2>"$work/knot/log" &
    knot_pid=$!
    pids+=($knot_pid)
}

start_polestar() { # [CHURN_MS]
    env ${api_addr:+SENTINEL_API=$api_addr} "$root/target/release/examples/dns_bench" "127.0.0.1:$polestar_port" "$MASTERS" "$@" >"$work/polestar.log" 2>&1 &
    polestar_pid=$!
    pids+=($polestar_pid)
}

wait_answers() { # PORT
    for _ in $(seq 100); do
        dig @127.0.0.1 -p "$1" +short +tries=1 +time=1 "m0.$ZONE" A | grep -q . && return 0
        sleep 0.1
    done
    echo "no answer on port $1" >&2
    cat "$work"/knot/log "$work"/polestar.log >&2 || true
    exit 1
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; } # utime + stime of PID

# Prints "QPS MICROSECONDS_OF_SERVER_CPU_PER_QUERY" for one dnsperf run against PORT served by PID.
qps() { # PORT PID
    local before after out
    before=$(cpu_ticks "$2")
    out=$(dnsperf -s 127.0.0.1 -p "$1" -d "$work/queries" "${DNSPERF_ARGS[@]}" 2>&1)
    after=$(cpu_ticks "$2")
    echo "$out" >> "$work/dnsperf.log"
    echo "$out" | awk -v ticks=$((after - before)) -v hz="$(getconf CLK_TCK)" '
        /Queries completed/ {done = $3}
        /Queries per second/ {qps = $4}
        END {printf "%.0f %.2f\n", qps, ticks / hz * 1e6 / done}'
}

check_answers() { # PORT NAME: both servers must answer the same records
    dig @127.0.0.1 -p "$1" +short +tries=1 +time=1 "$2" "$3" | sort
}

mean() { awk '{s+=$1; n++} END {printf "%.0f", s/n}'; }

cd "$root"
build=(cargo build --release --example dns_bench --example crowd)
"${build[@]}" >/dev/null 2>&1 || "${build[@]}"
query_file > "$work/queries"
knot_port=$(free_port)
polestar_port=$(free_port)
api_addr=
[ "$SUBSCRIBERS" -gt 0 ] && api_addr=127.0.0.1:$(free_port)
start_knot
start_polestar
wait_answers "$knot_port"
wait_answers "$polestar_port"
for q in "m3.$ZONE A" "_redis._tcp.m3.$ZONE SRV" "replicas.m3.$ZONE A" "m3.$ZONE TXT"; do
    # shellcheck disable=SC2086
    if [ "$(check_answers "$knot_port" $q)" != "$(check_answers "$polestar_port" $q)" ]; then
        echo "knotd and polestar disagree on $q" >&2
        exit 1
    fi
done

echo "dnsperf ${DNSPERF_ARGS[*]} on $(nproc) cores, $MASTERS masters, $(wc -l < "$work/queries") query names"
# ROUNDS rounds of knotd then polestar, into $work/knot$1.qps and $work/polestar$1.qps; each
# round's line starts with $2.
rounds() {
    : > "$work/knot$1.qps"; : > "$work/polestar$1.qps"
    for round in $(seq "$ROUNDS"); do
        read -r k kcpu < <(qps "$knot_port" "$knot_pid"); echo "$k $kcpu" >> "$work/knot$1.qps"
        read -r p pcpu < <(qps "$polestar_port" "$polestar_pid"); echo "$p $pcpu" >> "$work/polestar$1.qps"
        printf '%s %d: knotd %8.0f qps (%5.2f us CPU/query)   polestar %8.0f qps (%5.2f us CPU/query)\n' \
            "$2" "$round" "$k" "$kcpu" "$p" "$pcpu"
    done
}
rounds "" round
knot_mean=$(mean < "$work/knot.qps")
polestar_mean=$(mean < "$work/polestar.qps")
knot_cpu=$(awk '{s+=$2; n++} END {printf "%.2f", s/n}' "$work/knot.qps")
polestar_cpu=$(awk '{s+=$2; n++} END {printf "%.2f", s/n}' "$work/polestar.qps")
printf 'mean:    knotd %8d qps (%5.2f us CPU/query)   polestar %8d qps (%5.2f us CPU/query)\n' \
    "$knot_mean" "$knot_cpu" "$polestar_mean" "$polestar_cpu"
printf 'ratio polestar/knotd: %.2f in QPS, %.2f in CPU per query (lower is better)\n' \
    "$(echo "$polestar_mean / $knot_mean" | bc -l)" "$(echo "$polestar_cpu / $knot_cpu" | bc -l)"

if [ "$SUBSCRIBERS" -gt 0 ]; then
    rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
    rss_before=$(rss_kib "$polestar_pid")
    "$root/target/release/examples/crowd" hold "$api_addr" "$SUBSCRIBERS" >"$work/crowd.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 600); do
        grep -q '^attached' "$work/crowd.log" && break
        kill -0 "${pids[-1]}" 2>/dev/null || { cat "$work/crowd.log" >&2; exit 1; }
        sleep 0.5
    done
    grep -q '^attached' "$work/crowd.log" || { echo "the crowd did not attach in 300 s" >&2; exit 1; }
    attached=$(awk '/^attached/ {print $2}' "$work/crowd.log")
    grep '^note' "$work/crowd.log" || true
    printf '%d Sentinel-endpoint subscribers attached to polestar (RSS %d -> %d KiB); loadavg %s\n' \
        "$attached" "$rss_before" "$(rss_kib "$polestar_pid")" "$(cut -d' ' -f1-3 /proc/loadavg)"
    rounds -crowd "with $attached subscribers, round"
    knot_crowd=$(mean < "$work/knot-crowd.qps")
    polestar_crowd=$(mean < "$work/polestar-crowd.qps")
    printf 'crowd mean: knotd %d qps, polestar %d qps: %.2f of polestar without them, %.2f of knotd in the same rounds (%.2f before)\n' \
        "$knot_crowd" "$polestar_crowd" "$(echo "$polestar_crowd / $polestar_mean" | bc -l)" \
        "$(echo "$polestar_crowd / $knot_crowd" | bc -l)" "$(echo "$polestar_mean / $knot_mean" | bc -l)"
    kill "${pids[-1]}" 2>/dev/null || true
fi

kill "$polestar_pid"; wait "$polestar_pid" 2>/dev/null || true
api_addr=
start_polestar 10
wait_answers "$polestar_port"
: > "$work/churn.qps"
for round in $(seq "$ROUNDS"); do
    read -r c ccpu < <(qps "$polestar_port" "$polestar_pid"); echo "$c $ccpu" >> "$work/churn.qps"
    printf 'churn round %d: polestar, topology changing every 10 ms: %8.0f qps (%5.2f us CPU/query)\n' \
        "$round" "$c" "$ccpu"
done
churn_mean=$(mean < "$work/churn.qps")
printf 'churn mean: %d qps (%.2f of static polestar, %.2f of knotd)\n' "$churn_mean" \
    "$(echo "$churn_mean / $polestar_mean" | bc -l)" "$(echo "$churn_mean / $knot_mean" | bc -l)"
