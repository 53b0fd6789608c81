"""A redis-py `Sentinel` application that writes every 15 ms (driven by tests/sentinel_api.rs).

usage: sentinel_writer.py SENTINELS NAME KEY SECONDS
  SENTINELS  comma-separated host:port of the Sentinels (or of polestar's Sentinel endpoint)

Each value is RPUSHed to KEY until a node acknowledges it, then the next one. Prints, flushed:
  ack <seq> <unix-ms> <port of the node that acknowledged>
  err <seq> <unix-ms> <error>
"""
import sys
import time

from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

TIMEOUT = 0.5
INTERVAL = 0.015


def now_ms():
    return int(time.time() * 1000)


def main():
    sentinels = [(h, int(p)) for h, p in (a.rsplit(":", 1) for a in sys.argv[1].split(","))]
    name, key, seconds = sys.argv[2], sys.argv[3], float(sys.argv[4])
    fast = dict(socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT, retry=Retry(NoBackoff(), 0))
    sentinel = Sentinel(sentinels, sentinel_kwargs=dict(fast))
    # The usual application pattern. (A client holding one connection, such as
    # `single_connection_client=True`, reconnects to the address it had in redis-py 6.4: only a
    # connection taken from the pool asks the Sentinels again.)
    master = sentinel.master_for(name, **fast)
    pool = master.connection_pool
    end = time.time() + seconds
    seq = 0
    while time.time() < end:
        try:
            master.rpush(key, seq)
            # Single-threaded: the connection just released is the one that carried the write.
            port = pool._available_connections[-1].port
            print(f"ack {seq} {now_ms()} {port}", flush=True)
            seq += 1
        except Exception as e:  # every failure is retried with the same value
            print(f"err {seq} {now_ms()} {type(e).__name__}: {e}".replace("\n", " "), flush=True)
        time.sleep(INTERVAL)


if __name__ == "__main__":
    main()
