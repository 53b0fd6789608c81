"""An application client as people write it: redis-py with its defaults, connecting by name
through the system resolver (getaddrinfo), one write every 10-20 ms. Driven by
tests/clients_netns.rs; every line on stdout is one JSON event.

    python failover_redis_py.py HOST PORT NAME [fast] [pool] [lib=redis|redis6|valkey]
                                        RPUSH acked:NAME <seq>, logs each reply

redis-py's default retry (3 retries, ExponentialWithJitterBackoff(base=1, cap=10)) sleeps up to
2 s, then up to 4 s, between reconnects; `fast` retries the way docs/operating.md recommends for
failover (ExponentialBackoff(cap=0.5, base=0.05), 10 retries). The client holds one connection
(`single_connection_client=True`) unless `pool` is given: then it takes one from redis-py's
connection pool for each command, as `redis.Redis(host=...)` does by default. `lib=` picks
redis-py's current release, its previous major or valkey-py (tests/clients/pick_lib.py).
"""
import json
import platform
import random
import signal
import sys
import time

import pick_lib

redis, LIB = pick_lib.pick()
ExponentialBackoff = pick_lib.submodule(redis, "backoff").ExponentialBackoff
Retry = pick_lib.submodule(redis, "retry").Retry


def log(**event):
    event["t"] = int(time.time() * 1000)
    print(json.dumps(event), flush=True)


def peer(client):
    # Single-threaded: the held connection, or the pool's one just released, carried the write.
    conn = client.connection or (client.connection_pool._available_connections or [None])[-1]
    sock = getattr(conn, "_sock", None) if conn else None
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except (AttributeError, OSError):
        return None


def main():
    host, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    flags = sys.argv[4:]
    log(ev="start", lib=LIB, version=redis.__version__,
        runtime=f"Python {platform.python_version()}")
    options = {}
    if "fast" in flags:
        options["retry"] = Retry(ExponentialBackoff(cap=0.5, base=0.05), 10)
    single = "pool" not in flags
    client = redis.Redis(host=host, port=port, single_connection_client=single, **options)
    seq = 0
    while True:
        seq += 1
        try:
            client.rpush(f"acked:{name}", seq)
            log(ev="ok", seq=seq, peer=peer(client))
        except Exception as e:  # every failure is a data point, the loop goes on
            log(ev="fail", seq=seq, err=str(e)[:200])
        time.sleep(random.uniform(0.010, 0.020))


if __name__ == "__main__":
    main()
