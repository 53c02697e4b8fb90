#!/usr/bin/env bash
# Generated-client check: what an integrator gets from openapi.yaml.
#  1. installs the pinned generators (clients/python/requirements.txt) into a
#     venv under target/client-check/;
#  2. generates a client with openapi-python-client and pydantic models with
#     datamodel-code-generator from openapi.yaml; ANY generator warning fails;
#  3. starts sendonce (SQLite) with the mock provider from testkit, and runs
#     clients/python/check.py against it with the generated client: send,
#     replay, 202 with `Prefer: respond-async`, 409, 422, 400s parsed into
#     typed models, 401, opt-outs.
# SENDONCE_BIN / MOCK_BIN pick the binaries (default: the debug builds,
# built here). Everything it starts listens on free loopback ports and is
# stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=$root/target/client-check
venv=$out/venv
gen=$out/gen
req=clients/python/requirements.txt

say() { printf 'client-check: %s\n' "$*"; }
fail() { printf 'client-check: FAIL: %s\n' "$*" >&2; exit 1; }

# 1. The pinned generators, reinstalled when the pins change.
stamp=$venv/.requirements
if ! [ -x "$venv/bin/python" ] || ! cmp -s "$req" "$stamp"; then
    say "installing the pinned generators into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req"
    cp "$req" "$stamp"
fi
# ruff (a pinned dependency) formats the generated client; it must be found.
export PATH=$venv/bin:$PATH

# The check script itself is linted and formatted (clients/python/ruff.toml).
ruff check --quiet clients/python || fail "ruff check clients/python"
ruff format --quiet --check clients/python || fail "ruff format --check clients/python (run ruff format)"

# 2. Generate, failing on any warning.
rm -rf "$gen"
mkdir -p "$gen"
say "openapi-python-client $(openapi-python-client --version 2>&1 | awk '{print $NF}')"
if ! COLUMNS=200 openapi-python-client generate --path openapi.yaml --meta none \
    --output-path "$gen/sendonce_client" --fail-on-warning >"$out/opc.log" 2>&1; then
    cat "$out/opc.log" >&2
    fail "openapi-python-client did not generate the client cleanly"
fi
# --fail-on-warning covers the parser's warnings; a post-generation hook
# (ruff) that is missing or fails only prints, so any other line fails too.
if grep -v -e '^Generating ' -e '^$' "$out/opc.log" >/dev/null; then
    cat "$out/opc.log" >&2
    fail "openapi-python-client printed warnings"
fi
[ -f "$gen/sendonce_client/client.py" ] || fail "no client generated"

# datamodel-code-generator reports through Python warnings: make them errors.
# `phone` is a custom format (Schemathesis generates real numbers for it);
# it is a plain string to generators, and datamodel-code-generator is told so
# instead of warning that it does not know it.
say "datamodel-code-generator $(datamodel-codegen --version 2>&1 | awk '{print $NF}')"
if ! PYTHONWARNINGS=error datamodel-codegen --input openapi.yaml --input-file-type openapi \
    --output "$gen/sendonce_models.py" --output-model-type pydantic_v2.BaseModel \
    --target-python-version 3.11 --formatters builtin --use-annotated \
    --type-mappings string+phone=string >"$out/dmcg.log" 2>&1; then
    cat "$out/dmcg.log" >&2
    fail "datamodel-code-generator did not generate the models cleanly"
fi
if [ -s "$out/dmcg.log" ]; then
    cat "$out/dmcg.log" >&2
    fail "datamodel-code-generator printed warnings"
fi

# 3. The live server, with the mock provider.
if [ -z "${SENDONCE_BIN:-}" ]; then
    cargo build --quiet --bin sendonce
    SENDONCE_BIN=target/debug/sendonce
fi
if [ -z "${MOCK_BIN:-}" ]; then
    cargo build --quiet -p testkit --bin mock-provider
    MOCK_BIN=target/debug/mock-provider
fi
work=$(mktemp -d /tmp/sendonce-client.XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
mock_port=$(free_port)
key=so_client-check-key-000000000000000
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# Every send takes the mock 2 s: long enough for a `respond-async` send to be
# still `processing` when its retry comes (the 409), short enough to finish
# well within the default 10 s wait of a plain send.
MOCK_LISTEN="127.0.0.1:$mock_port" MOCK_LATENCY_MS=2000 RUST_LOG=warn \
    "$MOCK_BIN" >"$work/mock.log" 2>&1 &
pids+=($!)
DATABASE_URL="sqlite://$work/client.db" SENDONCE_LISTEN="127.0.0.1:$port" \
SENDONCE_BOOTSTRAP_API_KEY=$key SENDONCE_PROVIDER=http \
SENDONCE_HTTP_PROVIDER_URL="http://127.0.0.1:$mock_port/messages" RUST_LOG=warn \
    "$SENDONCE_BIN" >"$work/server.log" 2>&1 &
pids+=($!)

ready=""
for _ in $(seq 300); do
    if curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && curl -fs "http://127.0.0.1:$mock_port/stats" >/dev/null; then
        ready=1
        break
    fi
    sleep 0.1
done
if [ -z "$ready" ]; then
    cat "$work/server.log" "$work/mock.log" >&2
    fail "the server or the mock provider did not come up"
fi

if ! SENDONCE_URL="http://127.0.0.1:$port" SENDONCE_KEY=$key MOCK_URL="http://127.0.0.1:$mock_port" \
    CLIENT_GEN_DIR="$gen" "$venv/bin/python" clients/python/check.py; then
    say "server log:" >&2
    tail -n 50 "$work/server.log" >&2
    exit 1
fi
