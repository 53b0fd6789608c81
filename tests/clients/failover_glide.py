"""An application client as people write it: Valkey GLIDE (Python binding of its Rust core),
connecting by name through the system resolver, one write every 10-20 ms. GLIDE has no
Sentinel support, so a DNS name that follows the primary is its way to it. Driven by
tests/clients_netns.rs; every line on stdout is one JSON event.

    python failover_glide.py writer HOST PORT NAME [SETTINGS]   RPUSH acked:NAME <seq>
    python failover_glide.py blpop  HOST PORT NAME [SETTINGS]   one client pushes jobs:NAME
                                                                every 10-20 ms, another BLPOPs
                                                                them (timeout 0)

SETTINGS: `default` (GLIDE's own: request timeout 250 ms, its reconnect backoff) or `advised`
(docs/operating.md's: request timeout 500 ms, connection timeout 500 ms, reconnect after 10 ms, 20 ms,
40 ms ... capped at 160 ms). Each write is one atomic batch `RPUSH` + `CLIENT INFO`, so the log
names the node that acknowledged it (`laddr=`); the batch is refused as a whole by a node that
is paused (it waits) or read-only, as a plain `RPUSH` would be.
"""
import asyncio
import json
import platform
import random
import signal
import sys
import time
from importlib.metadata import version

from glide import (
    AdvancedGlideClientConfiguration,
    BackoffStrategy,
    Batch,
    GlideClient,
    GlideClientConfiguration,
    NodeAddress,
)


def log(**event):
    event["t"] = int(time.time() * 1000)
    print(json.dumps(event), flush=True)


def settings(name):
    if name == "advised":
        return dict(
            request_timeout=500,
            reconnect_strategy=BackoffStrategy(num_of_retries=4, factor=10, exponent_base=2),
            advanced_config=AdvancedGlideClientConfiguration(connection_timeout=500),
        )
    return {}


async def connect(host, port, options, role):
    config = GlideClientConfiguration([NodeAddress(host, port)], client_name=role, **options)
    while True:
        try:
            return await GlideClient.create(config)
        except Exception as e:  # the first connection too can meet a failover
            log(ev="fail", role=role, err=str(e)[:200])
            await asyncio.sleep(0.1)


def laddr(info):
    text = info.decode() if isinstance(info, bytes) else str(info)
    for field in text.split():
        if field.startswith("laddr="):
            return field[len("laddr="):]
    return None


async def writer(client, name):
    seq = 0
    while True:
        seq += 1
        batch = Batch(is_atomic=True)
        batch.rpush(f"acked:{name}", [str(seq)])
        batch.custom_command(["CLIENT", "INFO"])
        try:
            result = await client.exec(batch, raise_on_error=True)
            log(ev="ok", seq=seq, peer=laddr(result[1]))
        except Exception as e:  # every failure is a data point, the loop goes on
            log(ev="fail", seq=seq, err=str(e)[:200])
        await asyncio.sleep(random.uniform(0.010, 0.020))


async def pusher(client, name):
    seq = 0
    while True:
        seq += 1
        try:
            await client.rpush(f"jobs:{name}", [str(seq)])
        except Exception:
            pass
        await asyncio.sleep(random.uniform(0.010, 0.020))


async def blocker(client, name):
    while True:
        try:
            popped = await client.blpop([f"jobs:{name}"], 0)
            info = await client.custom_command(["CLIENT", "INFO"])
            log(ev="ok", seq=int(popped[1]) if popped else None, peer=laddr(info))
        except Exception as e:
            log(ev="fail", err=str(e)[:200])
            await asyncio.sleep(random.uniform(0.010, 0.020))


async def main():
    mode, host, port, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    options = settings(sys.argv[5] if len(sys.argv) > 5 else "default")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log(ev="start", mode=mode, lib="valkey-glide", version=version("valkey-glide"),
        runtime=f"Python {platform.python_version()}")
    if mode == "blpop":
        push = await connect(host, port, options, "pusher")
        block = await connect(host, port, options, "blocker")
        await asyncio.gather(pusher(push, name), blocker(block, name))
    else:
        await writer(await connect(host, port, options, "writer"), name)


if __name__ == "__main__":
    asyncio.run(main())
