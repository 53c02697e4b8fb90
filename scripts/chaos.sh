#!/usr/bin/env bash
# The chaos run: builds sendonce, mock-provider (testkit) and the chaos driver, then
# kills instances under load (see bench/src/bin/chaos.rs). Arguments go to
# the driver, e.g. scripts/chaos.sh --keys 5000 --restart-postgres.
# CHAOS_PROFILE=debug uses a debug build (CI's smoke run).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${CHAOS_PROFILE:-release}
flag=()
[ "$profile" = release ] && flag=(--release)
cargo build "${flag[@]}" -p sendonce --bin sendonce
cargo build "${flag[@]}" -p testkit --bin mock-provider
cargo build "${flag[@]}" -p sendonce-bench --bin chaos
exec "target/$profile/chaos" "$@"
