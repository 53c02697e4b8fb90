#!/usr/bin/env bash
# Contract check: runs Schemathesis against a live server with openapi.yaml:
# every operation, every check (no 5xx, status codes, headers, content types
# and bodies conform to the spec, auth enforced, ...).
# SENDONCE_BIN picks the binary (default: the debug build, built if missing).
# Abuse limits are off and the segment limit is raised for this run: they are
# deployment settings the schema cannot know, and with them on most generated
# requests would stop at 429 or 400 before reaching what is under test (the
# limits have tests of their own in tests/api/hardening.rs). The verification
# resend cooldown is off for the same reason (tests/api/verify.rs tests it),
# so the stateful phase reaches a resend's 201.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip show schemathesis 2>/dev/null | grep -q '^Version: 4.32.5$' \
    || python3 -m pip install --quiet 'schemathesis==4.32.5'
bin=${SENDONCE_BIN:-target/debug/sendonce}
[ -x "$bin" ] || cargo build --bin sendonce
work=$(mktemp -d /tmp/sendonce-st.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
key=so_schemathesis-key-00000000000000
# http provider receipts are authenticated with this; Twilio's signed
# callbacks cannot be generated (schemathesis.toml expects their 403).
# A Gateway token turns on "channels": ["telegram", ...] (its URL answers
# nothing: the Telegram sends are retried and the SMS follows, in the
# background); its signed reports cannot be generated either.
receipt_secret=schemathesis-receipt-secret
DATABASE_URL="sqlite://$work/st.db" SENDONCE_LISTEN="127.0.0.1:$port" \
SENDONCE_BOOTSTRAP_API_KEY=$key SENDONCE_SYNC_WAIT_MS=2000 SENDONCE_MAX_WAIT_MS=2000 RUST_LOG=warn \
SENDONCE_RATE_TENANT_RPS=0 SENDONCE_RATE_NUMBER_PER_HOUR=0 SENDONCE_RATE_PREFIX_PER_HOUR=0 \
SENDONCE_VERIFY_STARTS_PER_PREFIX_PER_HOUR=0 \
SENDONCE_MAX_SEGMENTS=100 SENDONCE_VERIFY_RESEND_COOLDOWN=0s \
SENDONCE_RECEIPT_SECRET=$receipt_secret TWILIO_AUTH_TOKEN=schemathesis-twilio-token \
TELEGRAM_GATEWAY_TOKEN=schemathesis-gateway-token TELEGRAM_GATEWAY_URL=http://127.0.0.1:9 \
    "$bin" >"$work/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
schemathesis --config-file schemathesis.toml run openapi.yaml \
    --url "http://127.0.0.1:$port" \
    --header "Authorization: Bearer $key" \
    --header "X-Receipt-Secret: $receipt_secret" \
    --checks all \
    --max-examples "${SCHEMATHESIS_EXAMPLES:-60}" \
    --seed 1 \
    "$@"
