#!/usr/bin/env bash
# Routes that follow quality (issue 43), measured (see BENCHMARKS.md,
# "Routes that follow quality"): one sendonce instance (release build,
# Postgres) routing +966=http,twilio to two mock providers that report every
# delivery at once, with the quality settings shrunk so that a run takes
# about a minute.
#
#   1. a provider degrading under load: 200 unique sends a second offered for 70 s;
#      at 20 s http's mock is restarted reporting nothing; the time to the
#      shift, the share of new messages on http before and after it (the
#      5% floor), errors, and every (To, Body) created once; then the
#      evaluator's aggregate timed on that database (also over ~15 minutes
#      of messages with the default window); then the same degradation
#      with the http mock in the driver's process, its receipts turned off
#      in place (no restart; QUALITY_BENCH_IN_PLACE=0 skips it);
#   2. the cost of computing quality: sendonce's CPU per send (and its
#      database's Postgres backends') with SENDONCE_ROUTE_QUALITY=on (a beat
#      every second) and off, interleaved, 3 runs of each of 20 s, each on a
#      fresh database.
#
# About 5 minutes after the build. Arguments go to the driver
# (`target/release/quality_bench --help`), e.g. --rounds 2 --no-shift.
# Postgres: $TEST_DATABASE_URL or postgres://postgres@127.0.0.1:5432/postgres
# (it creates and drops databases there).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -p sendonce --bin sendonce -p testkit --bin mock-provider \
    -p sendonce-bench --bin quality_bench

machine() {
    echo "--- $1: $(uptime)"
    ps -eo pid,pcpu,etime,comm --sort=-pcpu | head -8
}
machine "before"
status=0
target/release/quality_bench "$@" || status=$?
if [ "${QUALITY_BENCH_IN_PLACE:-1}" = 1 ]; then
    machine "between"
    target/release/quality_bench --degrade-in-place --no-cost --no-query-timing "$@" || status=$?
fi
machine "after"
exit "$status"
