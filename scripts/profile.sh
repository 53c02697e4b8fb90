#!/usr/bin/env bash
# Instructions per unique send, counted by callgrind (BENCHMARKS.md,
# "Instructions per send"): counts of executed instructions do not depend on
# what else the machine runs, so they compare two builds where timings on a
# shared 2-core machine cannot.
#
#   scripts/profile.sh [N1 N2]     default 1000 3000
#   scripts/profile.sh --sqlite    sendonce on SQLite instead (its own
#                                  database in-process, so its counts take in
#                                  SQLite's work): sqlite_bench drives unique
#                                  sends for 60 s at concurrency 32 and
#                                  zeroes and dumps the counts around them
#
# Builds sendonce with the `profiling` profile (release with line tables)
# and runs the load generator twice (its unique mix, concurrency 32, mock
# provider over HTTP, N1 then N2 requests after 200 warm-up sends) against
# a sendonce running under `valgrind --tool=callgrind`. The service's
# instructions per send are the difference of the two runs' totals over the
# difference of their requests, so start-up, shutdown and the warm-up
# cancel out. Prints that, the second run's heaviest functions (inclusive and
# self) and where the profiles are (callgrind_annotate reads them).
# Postgres as for scripts/bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
sqlite=0
if [ "${1:-}" = --sqlite ]; then sqlite=1; shift; fi
n1=${1:-1000}
n2=${2:-3000}
command -v valgrind >/dev/null || { echo "profile: valgrind is missing (apt install valgrind)" >&2; exit 1; }

# PROFILE_BIN_DIR: profile the sendonce and mock-provider found there
# instead (another build, for a before/after comparison).
bins=${PROFILE_BIN_DIR:-$PWD/target/profiling}
if [ -z "${PROFILE_BIN_DIR:-}" ]; then
    cargo build --profile profiling -p sendonce --bin sendonce -p testkit --bin mock-provider
fi
cargo build --release -p sendonce-bench --bin loadgen --bin sqlite_bench

out=$(mktemp -d "${TMPDIR:-/tmp}/sendonce-profile.XXXXXX")
mkdir -p "$out/bin"
real=$bins/sendonce
ln -s "$bins/mock-provider" "$out/bin/mock-provider"
# The load generator starts `sendonce` from --bin-dir: this one runs the
# service under callgrind (and `sendonce migrate` as it is).
cat > "$out/bin/sendonce" <<EOF
#!/usr/bin/env bash
if [ "\${1:-}" = migrate ]; then exec "$real" "\$@"; fi
exec valgrind --tool=callgrind --callgrind-out-file="\$PROFILE_OUT" "$real" "\$@"
EOF
chmod +x "$out/bin/sendonce"

# Under callgrind a send takes 50 to 100 times as long: the service waits up
# to 30 s for its final answer before it would answer 202.
wait=(--service-env SENDONCE_SYNC_WAIT=30s --service-env SENDONCE_MAX_WAIT=30s)
total() { awk '/^(summary|totals):/ { print $2; exit }' "$1"; }
top() {
    echo
    echo "heaviest functions (inclusive):"
    callgrind_annotate --inclusive=yes "$1" 2>/dev/null | sed -n '/^Ir/,$p' | head -45 || true
    echo
    echo "heaviest functions (self):"
    callgrind_annotate "$1" 2>/dev/null | sed -n '/^Ir/,$p' | head -45 || true
}
if [ "$sqlite" = 1 ]; then
    PROFILE_OUT="$out/callgrind.sqlite" target/release/sqlite_bench --bin-dir "$out/bin" \
        --callgrind --seconds 60 "${wait[@]}" > "$out/sqlite_bench.log" 2>&1 || {
        echo "profile: sqlite_bench failed (see $out/sqlite_bench.log)" >&2
        tail -20 "$out/sqlite_bench.log" >&2
        exit 1
    }
    n=$(awk '/unique sends under callgrind:/ { print $NF }' "$out/sqlite_bench.log")
    # callgrind_control -d writes callgrind.sqlite.1 (the unique sends alone).
    dump="$out/callgrind.sqlite.1"
    echo "$n unique sends on SQLite: $(total "$dump") instructions"
    echo "instructions per unique send (service with SQLite): $(( $(total "$dump") / n ))"
    top "$dump"
    echo "profile: $dump"
    exit 0
fi
for n in "$n1" "$n2"; do
    PROFILE_OUT="$out/callgrind.$n" target/release/loadgen --bin-dir "$out/bin" \
        --mixes unique --requests "$n" --warmup-secs 0 --no-floor --no-simulated \
        --high-concurrency 0 "${wait[@]}" > "$out/loadgen.$n.log" 2>&1 || {
        echo "profile: the load generator failed (see $out/loadgen.$n.log)" >&2
        tail -20 "$out/loadgen.$n.log" >&2
        exit 1
    }
    echo "$n unique sends: $(total "$out/callgrind.$n") instructions in all"
done
i1=$(total "$out/callgrind.$n1")
i2=$(total "$out/callgrind.$n2")
echo "instructions per unique send (service): $(( (i2 - i1) / (n2 - n1) ))"
top "$out/callgrind.$n2"
echo
echo "profiles: $out/callgrind.$n1 $out/callgrind.$n2"
