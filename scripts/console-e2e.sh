#!/usr/bin/env bash
# The console in a real browser (issue 16): Debian's chromium driven by
# playwright-core (pinned in tests/console/package.json), axe-core on every
# page. Starts sendonce (SQLite unless E2E_DATABASE_URL names another
# database) and the mock provider (testkit) failing half its calls with 500
# and sending delivery receipts back, so some messages are retried then
# delivered. An Arabic message of a tenant with a home country (SA) is
# checked at 390 px and 1280 px: its body right to left, no table wider than
# the page, times in the tenant's zone with UTC on hover. Screenshots go to
# target/console-screenshots/.
# Needs: chromium (apt `chromium`, or CHROMIUM=/path), node and npm.
set -euo pipefail
cd "$(dirname "$0")/.."
chromium=${CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] || { echo "console-e2e: no chromium at $chromium (apt-get install chromium chromium-driver)" >&2; exit 2; }
cargo build --bin sendonce -p sendonce
cargo build -p testkit --bin mock-provider
(cd tests/console && npm ci --no-audit --no-fund --silent)

work=$(mktemp -d /tmp/sendonce-console-e2e.XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
mock_port=$(free_port)
key=so_console-e2e-key-000000000000000
secret=console-e2e-receipt-secret
db=${E2E_DATABASE_URL:-sqlite://$work/e2e.db}
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

MOCK_LISTEN=127.0.0.1:$mock_port MOCK_FAIL_500=0.5 MOCK_RECEIPTS=in-order \
MOCK_HTTP_RECEIPT_URL=http://127.0.0.1:$port/providers/http/status MOCK_RECEIPT_SECRET=$secret \
RUST_LOG=warn target/debug/mock-provider >"$work/mock.log" 2>&1 &
pids+=($!)
DATABASE_URL=$db SENDONCE_LISTEN=127.0.0.1:$port SENDONCE_BOOTSTRAP_API_KEY=$key \
SENDONCE_ROUTES='+966=http,simulated; *=http' SENDONCE_HTTP_PROVIDER_URL=http://127.0.0.1:$mock_port/messages \
SENDONCE_RECEIPT_SECRET=$secret SENDONCE_RETRY_BASE_MS=50 SENDONCE_RETRY_CAP_MS=200 \
SENDONCE_RETRY_MAX_ATTEMPTS=10 SENDONCE_RATE_NUMBER_PER_HOUR=0 SENDONCE_RATE_PREFIX_PER_HOUR=0 \
SENDONCE_VERIFY_STARTS_PER_PREFIX_PER_HOUR=0 SENDONCE_WEBHOOK_ALLOW_PRIVATE=true \
RUST_LOG=warn target/debug/sendonce >"$work/server.log" 2>&1 &
pids+=($!)
base=http://127.0.0.1:$port
for _ in $(seq 200); do curl -fs "$base/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fs "$base/readyz" >/dev/null || { cat "$work/server.log" >&2; exit 1; }
# A webhook endpoint with a long URL (the timeline's webhook table must fit
# a phone): a receiver that answers 204 to every event.
hook_port=$(free_port)
python3 -c '
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(204); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
' "$hook_port" &
pids+=($!)
curl -fs -o /dev/null "$base/webhook-endpoints" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d "{\"url\":\"http://127.0.0.1:$hook_port/hooks/sendonce/order-confirmations/events-for-the-support-team\"}"
# A second tenant, for the isolation check.
key2=$(DATABASE_URL=$db target/debug/sendonce tenant create "e2e-second-$RANDOM")

# Send until one message was retried (a 500 first) and then delivered.
retried=""
for i in $(seq 1 40); do
    k="E2E-ORDER-$i-SMS"
    curl -fs -o /dev/null "$base/messages" -H "Authorization: Bearer $key" \
        -H "Idempotency-Key: $k" -H 'Content-Type: application/json' -H 'Prefer: wait=10' \
        -d "{\"to\":\"+14155550100\",\"body\":\"Your code is 4815$((10 + i % 90)). Order $i confirmed.\"}"
    attempts=$(curl -fs "$base/messages/$k" -H "Authorization: Bearer $key" \
        | python3 -c 'import json,sys; m=json.load(sys.stdin); print(m["attempts"] if m["status"] in ("sent","delivered") else 0)')
    if [ "$attempts" -ge 2 ]; then retried=$k; break; fi
done
[ -n "$retried" ] || { echo "console-e2e: no message was retried then sent" >&2; exit 1; }
for _ in $(seq 100); do
    status=$(curl -fs "$base/messages/$retried" -H "Authorization: Bearer $key" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')
    [ "$status" = delivered ] && break
    sleep 0.1
done
[ "$status" = delivered ] || { echo "console-e2e: $retried is $status, not delivered" >&2; exit 1; }

# A verification, for its page.
ver=$(curl -fs "$base/verifications" -H "Authorization: Bearer $key" -H 'Idempotency-Key: E2E-LOGIN-1' \
    -H 'Content-Type: application/json' -d '{"to":"+14155550101","code_length":6}' \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')

# Issue 42, item 5: a Gulf shop's account (home country SA: its times in
# Asia/Riyadh, UTC+3, all year) and a message with an Arabic body, for the
# checks at 390 px and 1280 px.
DATABASE_URL=$db target/debug/sendonce tenant home-country default SA >/dev/null
arabic=E2E-ARABIC-1
curl -fs -o /dev/null "$base/messages" -H "Authorization: Bearer $key" \
    -H "Idempotency-Key: $arabic" -H 'Content-Type: application/json' -H 'Prefer: wait=10' \
    -d '{"to":"+966501234567","body":"رمزك هو ١٢٣٤٥٦. شكراً"}'
for _ in $(seq 100); do
    status=$(curl -fs "$base/messages/$arabic" -H "Authorization: Bearer $key" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')
    case "$status" in sent|delivered) break ;; esac
    sleep 0.1
done
case "$status" in sent|delivered) ;; *) echo "console-e2e: $arabic is $status, not sent" >&2; exit 1 ;; esac

mkdir -p target/console-screenshots
BASE=$base KEY=$key KEY2=$key2 RETRIED=$retried VER=$ver ARABIC=$arabic ZONE_OFFSET_HOURS=3 \
CHROMIUM=$chromium SHOTS=$PWD/target/console-screenshots node tests/console/e2e.mjs
