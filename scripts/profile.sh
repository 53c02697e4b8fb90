#!/usr/bin/env bash
# Instructions per unique send, counted by callgrind (BENCHMARKS.md,
# "Instructions per send"): counts of executed instructions do not depend on
# what else the machine runs, so they compare two builds where timings on a
# shared 2-core machine cannot.
#
#   scripts/profile.sh [N1 N2]     default 1000 3000
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
n1=${1:-1000}
n2=${2:-3000}
command -v valgrind >/dev/null || { echo "profile: valgrind is missing (apt install valgrind)" >&2; exit 1; }

cargo build --profile profiling -p sendonce --bin sendonce -p testkit --bin mock-provider
cargo build --release -p sendonce-bench --bin loadgen

out=$(mktemp -d "${TMPDIR:-/tmp}/sendonce-profile.XXXXXX")
mkdir -p "$out/bin"
real=$PWD/target/profiling/sendonce
ln -s "$PWD/target/profiling/mock-provider" "$out/bin/mock-provider"
# The load generator starts `sendonce` from --bin-dir: this one runs the
# service under callgrind (and `sendonce migrate` as it is).
cat > "$out/bin/sendonce" <<EOF
#!/usr/bin/env bash
if [ "\${1:-}" = migrate ]; then exec "$real" "\$@"; fi
exec valgrind --tool=callgrind --callgrind-out-file="\$PROFILE_OUT" "$real" "\$@"
EOF
chmod +x "$out/bin/sendonce"

total() { awk '/^summary:/ { print $2 }' "$1"; }
for n in "$n1" "$n2"; do
    PROFILE_OUT="$out/callgrind.$n" target/release/loadgen --bin-dir "$out/bin" \
        --mixes unique --requests "$n" --warmup-secs 0 --no-floor --no-simulated \
        --high-concurrency 0 > "$out/loadgen.$n.log" 2>&1 || {
        echo "profile: the load generator failed (see $out/loadgen.$n.log)" >&2
        tail -20 "$out/loadgen.$n.log" >&2
        exit 1
    }
    echo "$n unique sends: $(total "$out/callgrind.$n") instructions in all"
done
i1=$(total "$out/callgrind.$n1")
i2=$(total "$out/callgrind.$n2")
echo "instructions per unique send (service): $(( (i2 - i1) / (n2 - n1) ))"
echo
echo "heaviest functions of the $n2-send run (inclusive):"
callgrind_annotate --inclusive=yes "$out/callgrind.$n2" 2>/dev/null | sed -n '/^Ir/,$p' | head -45
echo
echo "heaviest functions of the $n2-send run (self):"
callgrind_annotate "$out/callgrind.$n2" 2>/dev/null | sed -n '/^Ir/,$p' | head -45
echo
echo "profiles: $out/callgrind.$n1 $out/callgrind.$n2"
