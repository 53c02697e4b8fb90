#!/usr/bin/env bash
# Contract check: runs Schemathesis against a live server with openapi.yaml:
# every operation, every check (no 5xx, status codes, headers, content types
# and bodies conform to the spec, auth enforced, ...).
# SENDONCE_BIN picks the binary (default: the debug build, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip show schemathesis 2>/dev/null | grep -q '^Version: 4.32.5$' \
    || python3 -m pip install --quiet 'schemathesis==4.32.5'
bin=${SENDONCE_BIN:-target/debug/sendonce}
[ -x "$bin" ] || cargo build --bin sendonce
work=$(mktemp -d /tmp/sendonce-st.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
key=so_schemathesis-key-00000000000000
DATABASE_URL="sqlite://$work/st.db" SENDONCE_LISTEN="127.0.0.1:$port" \
SENDONCE_BOOTSTRAP_API_KEY=$key SENDONCE_SYNC_WAIT_MS=2000 SENDONCE_MAX_WAIT_MS=2000 RUST_LOG=warn \
    "$bin" >"$work/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
schemathesis --config-file schemathesis.toml run openapi.yaml \
    --url "http://127.0.0.1:$port" \
    --header "Authorization: Bearer $key" \
    --checks all \
    --max-examples "${SCHEMATHESIS_EXAMPLES:-60}" \
    --seed 1 \
    "$@"
