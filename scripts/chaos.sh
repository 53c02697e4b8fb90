#!/usr/bin/env bash
# The chaos run: builds sendonce, mock-provider (testkit) and the chaos driver, then
# hits instances under load with SIGKILLs, SIGTERMs and pauses, and with
# --clock-step steps the database's clock (see bench/src/bin/chaos.rs).
# Arguments go to the driver, e.g. scripts/chaos.sh --keys 5000 --restart-postgres,
# scripts/chaos.sh --clock-step, scripts/chaos.sh --provider http,
# scripts/chaos.sh --infobip (Infobip then http, Infobip's logs lagging),
# scripts/chaos.sh --gateway (verifications, telegram then sms),
# scripts/chaos.sh --gateway --channels whatsapp,telegram,sms (WhatsApp first),
# scripts/chaos.sh --provider smpp (the npm smpp SMSC, testkit/smsc/, which
# scripts/smsc.sh installs on first use: needs Node.js and npm).
# CHAOS_PROFILE=debug uses a debug build (CI's smoke run).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${CHAOS_PROFILE:-release}
flag=()
[ "$profile" = release ] && flag=(--release)

# --clock-step runs a Postgres of its own under Debian's libfaketime.
for arg in "$@"; do
    if [ "$arg" = --clock-step ] && ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ]; then
            echo "chaos.sh: installing libfaketime (for --clock-step)"
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime libfaketime >/dev/null
        else
            echo "chaos.sh: --clock-step needs libfaketime: apt-get install faketime libfaketime" >&2
            exit 2
        fi
    fi
done

cargo build "${flag[@]}" -p sendonce --bin sendonce
cargo build "${flag[@]}" -p testkit --bin mock-provider
cargo build "${flag[@]}" -p sendonce-bench --bin chaos
exec "target/$profile/chaos" "$@"
