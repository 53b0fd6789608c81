#!/usr/bin/env bash
# The whole test suite, as CI runs it: dependencies, formatting, lints, every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh
cargo fmt --check
# The workspace: polestar and the lab crate (crates/lab) its tests, benches and demo use.
cargo clippy --workspace --all-targets --locked -- -D warnings
# The binary without its default `demo` feature (no lab in it) must build cleanly too.
cargo clippy --locked --no-default-features --bin polestar -- -D warnings
# Builds the debug binary the tests use too, packages it, installs, checks and purges it.
bash tests/package.sh
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast
else
  echo "cargo-nextest not found: running with cargo test (cargo install cargo-nextest for the grouped runner)" >&2
  cargo test --workspace --locked --no-fail-fast -- --test-threads=2
fi
