#!/usr/bin/env bash
# The Debian package, end to end: build it (from the debug binary the test run already built,
# so CI compiles the crate once), install it with dpkg, check what it installed (binary, config
# as a conffile readable by the polestar user, the user itself, the systemd unit with
# `systemd-analyze verify`, exit 2 for a bad config as ExecStartPre relies on), and purge it.
# Needs root and dpkg; run by tests/run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "package test: FAILED: $*" >&2; exit 1; }
step() { echo "package test: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  echo "package test: skipped: needs root to install the package (CI runs as root)" >&2
  exit 0
fi
if dpkg -s polestar >/dev/null 2>&1 && [ "${CI:-}" != true ]; then
  echo "package test: skipped: a polestar package is installed on this machine; not touching it" >&2
  exit 0
fi
command -v cargo-deb >/dev/null || fail "cargo-deb missing: bash tests/deps.sh installs it"

step "building the .deb"
cargo build --locked --quiet
# The dev profile (stripped by cargo-deb: ~3.5 MB) saves CI a release build of the crate; the
# pinned cargo-deb (tests/deps.sh) accepts it with a warning.
out=target/debian
rm -rf "$out"
cargo deb --no-build --profile dev --quiet -o "$out/" >/dev/null 2>&1 \
  || cargo deb --no-build --profile dev -o "$out/"
deb=$(ls "$out"/polestar_*.deb)

cleanup() { dpkg --purge polestar >/dev/null 2>&1 || true; }
trap cleanup EXIT

step "installing $deb"
DEBIAN_FRONTEND=noninteractive dpkg -i "$deb" >/dev/null
[ -x /usr/bin/polestar ] || fail "/usr/bin/polestar is not installed"
/usr/bin/polestar --help | grep -q "polestar run" || /usr/bin/polestar --help | grep -q "Run the daemon" \
  || fail "polestar --help does not describe run"
grep -qx /etc/polestar/polestar.yaml /var/lib/dpkg/info/polestar.conffiles \
  || fail "/etc/polestar/polestar.yaml is not a conffile"
# The unit's Documentation= names these; the README links the pages under docs/.
for doc in README.md docs/operating.md docs/using.md docs/decisions.md; do
  [ -f "/usr/share/doc/polestar/$doc" ] || fail "/usr/share/doc/polestar/$doc is not installed"
done

# One example configuration per deployment shape (docs/operating.md, "Deployment shapes").
for shape in central dns-only http-only sentinel-endpoint node-sweeper agent-sentinels agent-upstreams; do
  [ -f "/usr/share/doc/polestar/examples/$shape.yaml" ] \
    || fail "/usr/share/doc/polestar/examples/$shape.yaml is not installed"
done

step "checking the user and permissions"
entry=$(getent passwd polestar) || fail "no polestar user"
uid=$(echo "$entry" | cut -d: -f3)
[ "$uid" -lt 1000 ] || fail "polestar is not a system user (uid $uid)"
echo "$entry" | grep -q ":/usr/sbin/nologin$" || fail "polestar can log in: $entry"
[ "$(stat -c '%U:%G %a' /etc/polestar)" = "root:polestar 750" ] \
  || fail "/etc/polestar is $(stat -c '%U:%G %a' /etc/polestar)"
[ "$(stat -c '%U:%G %a' /etc/polestar/polestar.yaml)" = "root:polestar 640" ] \
  || fail "/etc/polestar/polestar.yaml is $(stat -c '%U:%G %a' /etc/polestar/polestar.yaml)"

step "polestar check on the installed config, as the polestar user"
runuser -u polestar -- /usr/bin/polestar check -c /etc/polestar/polestar.yaml \
  || fail "polestar check rejects the installed config"
bad=$(mktemp -d)
printf 'sentinels: {addresses: []}\nbogus: 1\n' >"$bad/polestar.yaml"
set +e
/usr/bin/polestar check -c "$bad/polestar.yaml" 2>"$bad/err"
code=$?
set -e
[ "$code" -eq 2 ] || fail "check of a bad config exited $code, not 2"
grep -q bogus "$bad/err" || fail "check does not name the bad key: $(cat "$bad/err")"
rm -rf "$bad"

step "the systemd unit"
unit=$(dpkg -L polestar | grep '/systemd/system/polestar.service$') || fail "no unit installed"
for line in Type=notify "ExecStartPre=/usr/bin/polestar check -c /etc/polestar/polestar.yaml" \
    "ExecStart=/usr/bin/polestar run -c /etc/polestar/polestar.yaml" \
    'ExecReload=/bin/kill -HUP $MAINPID' Restart=on-failure User=polestar NoNewPrivileges=yes \
    ProtectSystem=strict "CapabilityBoundingSet=CAP_NET_BIND_SERVICE CAP_NET_ADMIN" \
    MemoryMax=512M TasksMax=1024 LimitNOFILE=65536; do
  grep -qxF "$line" "$unit" || fail "$unit lacks $line"
done
grep -q '^WatchdogSec=' "$unit" || fail "$unit has no WatchdogSec"
if command -v systemd-analyze >/dev/null; then
  # Without systemd as PID 1 (containers) verify still loads and checks the unit offline.
  verify=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify "$unit" 2>&1) \
    || fail "systemd-analyze verify: $verify"
  [ -z "$verify" ] || fail "systemd-analyze verify warns: $verify"
else
  fail "systemd-analyze missing: bash tests/deps.sh installs systemd"
fi

step "purging"
trap - EXIT
dpkg --purge polestar >/dev/null
[ ! -e /usr/bin/polestar ] || fail "/usr/bin/polestar left after purge"
[ ! -e "$unit" ] || fail "$unit left after purge"
[ ! -e /etc/polestar ] || fail "/etc/polestar left after purge"
echo "package test: ok" >&2
