#!/usr/bin/env bash
# Installs what the test suite needs on Debian, when it is missing. Idempotent.
# `tests/deps.sh demo` installs only what the demo needs.
set -euo pipefail
need=()
command -v redis-server   >/dev/null || need+=(redis-server)
command -v redis-sentinel >/dev/null || need+=(redis-sentinel)
command -v redis-cli      >/dev/null || need+=(redis-tools)
command -v dig            >/dev/null || need+=(dnsutils)
command -v openssl        >/dev/null || need+=(openssl)      # TLS labs make their certificates
[ -e /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)   # the system roots
if [ "${1:-}" != demo ]; then
command -v knotd          >/dev/null || need+=(knot)
command -v ip             >/dev/null || need+=(iproute2)
command -v iptables       >/dev/null || need+=(iptables)     # tests/chaos_netns.rs: partitions
command -v pgrep          >/dev/null || need+=(procps)
command -v systemd-analyze >/dev/null || need+=(systemd)      # the unit: systemd-analyze verify
command -v chromium       >/dev/null || need+=(chromium)     # the status page, headless
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
command -v runuser        >/dev/null || need+=(util-linux)   # tests/package.sh
command -v unbound        >/dev/null || need+=(unbound)      # a caching resolver on app hosts
command -v npm            >/dev/null || need+=(npm)
command -v promtool       >/dev/null || need+=(prometheus)   # contrib/prometheus: rules, a real scrape
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing: ${need[*]}; run as root or: sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  echo "installing: ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi
# The Debian package is built with cargo-deb from crates.io (pinned: tests/package.sh builds
# from the dev profile, which this version accepts).
CARGO_DEB_VERSION=3.8.0
if [ "${1:-}" != demo ] && ! cargo deb --version 2>/dev/null | grep -q "$CARGO_DEB_VERSION"; then
  echo "installing cargo-deb $CARGO_DEB_VERSION" >&2
  cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked --quiet
fi
# Real client libraries (ioredis, node-redis, iovalkey, redis-py, valkey-py, GLIDE; the current
# releases and the previous majors) and Valkey's server, in tests/clients/ (not in git).
if [ "${1:-}" != demo ]; then
  clients="$(cd "$(dirname "$0")" && pwd)/clients"
  if [ ! -x "$clients/venv/bin/python" ] || ! cmp -s "$clients/requirements.txt" "$clients/venv/.installed"; then
    echo "installing the Python test clients" >&2
    python3 -m venv "$clients/venv"
    "$clients/venv/bin/pip" install -q --disable-pip-version-check -r "$clients/requirements.txt"
    cp "$clients/requirements.txt" "$clients/venv/.installed"
  fi
  if ! cmp -s "$clients/requirements-previous.txt" "$clients/py-previous/.installed"; then
    echo "installing the previous major of redis-py" >&2
    rm -rf "$clients/py-previous"
    "$clients/venv/bin/pip" install -q --disable-pip-version-check --target "$clients/py-previous" -r "$clients/requirements-previous.txt"
    cp "$clients/requirements-previous.txt" "$clients/py-previous/.installed"
  fi
  if [ ! -d "$clients/node_modules/ioredis" ] || ! cmp -s "$clients/package.json" "$clients/node_modules/.installed"; then
    echo "installing the Node.js test clients" >&2
    (cd "$clients" && npm install --silent --no-audit --no-fund >/dev/null)
    cp "$clients/package.json" "$clients/node_modules/.installed"
  fi
fi
# The packaged services are not used (every test starts its own processes on free ports);
# stop them where they were started so they do not hold memory or ports.
for svc in redis-server redis-sentinel knot unbound prometheus; do
  if command -v systemctl >/dev/null && systemctl is-active --quiet "$svc" 2>/dev/null; then
    systemctl stop "$svc" || true
  fi
done
