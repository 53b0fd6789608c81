"""Which library of redis-py's API a client script imports: `lib=NAME` among its arguments
(taken out of sys.argv before the script reads them).

    lib=redis   redis-py, the current release (tests/clients/venv; the default)
    lib=redis6  redis-py's previous major, from tests/clients/py-previous (requirements-previous.txt)
    lib=valkey  valkey-py, redis-py's fork under the module name `valkey`
"""
import importlib
import os
import sys

NAMES = {"redis": "redis-py", "valkey": "valkey-py"}


def pick():
    """The library's module and its name as the tables show it (`redis-py`, `valkey-py`)."""
    chosen = [a[4:] for a in sys.argv[1:] if a.startswith("lib=")]
    sys.argv[1:] = [a for a in sys.argv[1:] if not a.startswith("lib=")]
    lib = chosen[-1] if chosen else "redis"
    if lib == "redis6":
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(here, "py-previous"))
        lib = "redis"
    if lib not in NAMES:
        sys.exit(f"unknown lib={lib}: one of redis, redis6, valkey")
    return importlib.import_module(lib), NAMES[lib]


def submodule(module, name):
    """`redis.backoff` or `valkey.backoff`, as the chosen library names it."""
    return importlib.import_module(f"{module.__name__}.{name}")
