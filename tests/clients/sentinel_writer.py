"""A redis-py `Sentinel` application that writes every 15 ms (driven by tests/sentinel_api.rs).

usage: sentinel_writer.py SENTINELS NAME KEY SECONDS [SETTINGS] [lib=redis|redis6]
  SENTINELS  comma-separated host:port of the Sentinels (or of polestar's Sentinel endpoint)
  SETTINGS   `tuned` (the default here: 0.5 s socket timeouts, no retry inside redis-py, the
             loop retries), `default` (`master_for(name)` with redis-py's own settings) or
             `advised` (docs/operating.md's: `retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 10)`),
             `redial` (that retry with a connection class that asks the Sentinels on every
             reconnect) or `single` (`Redis(connection_pool=master_for(name).connection_pool,
             single_connection_client=True)`)
  lib=       redis-py's current release (the default) or its previous major (pick_lib.py)

With PY_TRACE=1 it also prints `trace <unix-ms> ...` lines: each address a pooled connection
is sent to by the Sentinels (`dial`), each socket it opens (`socket-connect`), each error reply
or failed read (`reply`), and each sleep of redis-py's retry (`retry-sleep`).

Each value is RPUSHed to KEY until a node acknowledges it, then the next one. Prints, flushed:
  ack <seq> <unix-ms> <port of the node that acknowledged>
  err <seq> <unix-ms> <error>
"""
import os
import platform
import sys
import time

import pick_lib

if pick_lib.pick()[1] != "redis-py":  # `lib=redis6` puts the previous major first on the path
    sys.exit("sentinel_writer.py drives redis-py: lib=redis or lib=redis6")
import redis  # noqa: E402
import redis.retry  # noqa: E402
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

TIMEOUT = 0.5
INTERVAL = 0.015


def now_ms():
    return int(time.time() * 1000)


def trace(*words):
    print("trace", now_ms(), *words, flush=True)


def traced():
    """Wraps what a pooled connection does between two writes, to print it."""
    connect_to = SentinelManagedConnection.connect_to

    def dial(self, address):
        trace("dial", f"{address[0]}:{address[1]}")
        try:
            connect_to(self, address)
        except Exception as e:
            trace("dial-failed", type(e).__name__, str(e).replace("\n", " "))
            raise

    SentinelManagedConnection.connect_to = dial
    socket_connect = SentinelManagedConnection._connect

    def connect(self):
        trace("socket-connect", f"{self.host}:{self.port}")
        return socket_connect(self)

    SentinelManagedConnection._connect = connect
    read_response = SentinelManagedConnection.read_response

    def read(self, *args, **kwargs):
        try:
            return read_response(self, *args, **kwargs)
        except Exception as e:
            trace("reply", f"{self.host}:{self.port}", type(e).__name__, str(e).replace("\n", " "))
            raise

    SentinelManagedConnection.read_response = read
    sleep = redis.retry.sleep

    def backoff(seconds):
        trace("retry-sleep", f"{seconds:.3f}")
        sleep(seconds)

    redis.retry.sleep = backoff


class SentinelRedialingConnection(SentinelManagedConnection):
    """Asks the Sentinels for the primary on every reconnect, the retries' ones too (redis-py
    6.4's own connection redials the address it had on a retry: redis-py issue 3874)."""

    def _connect(self):
        if self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        return super()._connect()


def sentinel_and_master(sentinels, name, settings):
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 10)
    if settings in ("default", "single"):
        return Sentinel(sentinels), {}
    if settings == "advised":
        return Sentinel(sentinels), dict(retry=retry)
    if settings == "redial":
        return Sentinel(sentinels), dict(retry=retry, connection_class=SentinelRedialingConnection)
    fast = dict(socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT, retry=Retry(NoBackoff(), 0))
    return Sentinel(sentinels, sentinel_kwargs=dict(fast)), fast


def main():
    sentinels = [(h, int(p)) for h, p in (a.rsplit(":", 1) for a in sys.argv[1].split(","))]
    name, key, seconds = sys.argv[2], sys.argv[3], float(sys.argv[4])
    settings = sys.argv[5] if len(sys.argv) > 5 else "tuned"
    if os.environ.get("PY_TRACE"):
        traced()
    print(f"version redis-py {redis.__version__}", flush=True)
    print(f"runtime Python {platform.python_version()}", flush=True)
    sentinel, options = sentinel_and_master(sentinels, name, settings)
    # The usual application pattern. (A client holding one connection, such as
    # `single_connection_client=True`, reconnects to the address it had in redis-py 6.4: only a
    # connection taken from the pool asks the Sentinels again.)
    master = sentinel.master_for(name, **options)
    if settings == "single":
        # master_for passes its keyword arguments to the connections: a single-connection
        # client is made on the pool master_for built.
        master = redis.Redis(connection_pool=master.connection_pool, single_connection_client=True)
    pool = master.connection_pool
    end = time.time() + seconds
    seq = 0
    while time.time() < end:
        try:
            master.rpush(key, seq)
            # Single-threaded: the held connection, or the one just released, carried the write.
            conn = master.connection or pool._available_connections[-1]
            port = conn.port
            print(f"ack {seq} {now_ms()} {port}", flush=True)
            seq += 1
        except Exception as e:  # every failure is retried with the same value
            print(f"err {seq} {now_ms()} {type(e).__name__}: {e}".replace("\n", " "), flush=True)
        time.sleep(INTERVAL)


if __name__ == "__main__":
    main()
