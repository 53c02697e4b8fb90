#!/usr/bin/env bash
# Checks the Promela model of the exactly-once send protocol
# (model/sendonce.pml, described in docs/model.md) with spin.
#
# Every run is an exhaustive search (no bitstate hashing; only the --deep
# runs use lossless state compression). Runs are independent and go as many
# at once as there are cores (MODEL_CHECK_JOBS=N to choose; each is bounded
# by MEMLIM_MB), the table printed in order at the end. The default model must hold every
# property; each bug or flaw put back with a compile-time switch must give
# spin a counterexample of the property it breaks. Prints one line per run
# and a final "N passed, M failed"; exits non-zero if any run did not come
# out as expected (a property violated, a bug not caught, a search cut
# short).
#
# Usage: scripts/model-check.sh [--deep] [--keep] [--only NAME]... [--trail NAME]
#   --deep        also the longer runs: all four kinds of fault in one run,
#                 progress with two faults, a crash among two sibling keys
#                 (about 2 minutes more, up to 1.2 GB per run)
#   --keep        keep the build directory (pan sources, outputs, trails)
#   --only NAME   run only the named run(s) (see --list)
#   --trail NAME  run NAME and print its counterexample as a list of events
#   --list        list the runs
#
# Needs spin and a C compiler. If spin is missing it is installed with
# apt-get when running as root; otherwise the script says what to install.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'model-check.sh: %s\n' "$*" >&2; }

MODEL=model/sendonce.pml
FALLBACK_MODEL=$PWD/model/fallback.pml
MEMLIM_MB=${MODEL_CHECK_MEMLIM_MB:-3500}   # per run; pan stops (and the run fails) above it
RUN_TIMEOUT=${MODEL_CHECK_TIMEOUT:-600}     # seconds per run
# pan.c is large: -O0 compiles in about a second, -O2 in about eight, for a
# search about 1.6 times slower; -O0 makes the whole script faster.
PAN_CFLAGS=${MODEL_CHECK_CFLAGS:--O0}

# name | property | expect | spin -D flags
#   property: once, final, nofail, attrib: that property's assertions only
#             (the fallback-* runs: channel, end, once, phone); safety: all of
#             them; progress: non-progress cycles (pan -l)
#   expect:   pass (no error) or fail (a counterexample of that property)
RUNS=$(cat <<'EOF'
default-once        | once     | pass |
default-final       | final    | pass |
default-nofail      | nofail   | pass |
default-progress    | progress | pass | -DMAXFAULTS=1
twilio-only         | safety   | pass | -DONE_PROVIDER
three-instances     | safety   | pass | -DNI=3 -DMAXFAULTS=1
connect-2           | safety   | pass | -DCONNECT=2 -DMAXFAULTS=1
sibling-attrib      | attrib   | pass | -DSIBLING -DMAXFAULTS=0
sibling-progress    | progress | pass | -DSIBLING -DMAXFAULTS=0
bug-release-at-once | once     | fail | -DBUG_RELEASE_AT_ONCE
bug-no-takeover-wait| once     | fail | -DBUG_NO_TAKEOVER_WAIT
bug-slot-after-check| once     | fail | -DBUG_SLOT_AFTER_CHECK
bug-cancel-maybe    | nofail   | fail | -DBUG_CANCEL_MAYBE_SENT
bug-409-rejected    | nofail   | fail | -DBUG_409_REJECTED
bug-reconcile-early | once     | fail | -DBUG_RECONCILE_EARLY
bug-release-inherit | once     | fail | -DBUG_RELEASE_INHERITED
bug-dedup-no-wait   | nofail   | fail | -DBUG_DEDUP_NO_WAIT
bug-defer-unbounded | progress | fail | -DSIBLING -DMAXFAULTS=0 -DBUG_DEFER_UNBOUNDED
flaw-wait-t         | once     | fail | -DFLAW_TAKEOVER_WAIT_T
flaw-remaining      | once     | fail | -DFLAW_REMAINING_CHECK
flaw-as-written     | once     | fail | -DFLAW_TAKEOVER_WAIT_T -DFLAW_REMAINING_CHECK
flaw-connect        | once     | fail | -DCONNECT=2 -DFLAW_CONNECT_UNCOUNTED
flaw-sibling        | attrib   | fail | -DSIBLING -DMAXFAULTS=0 -DFLAW_SIBLING_INFLIGHT
flaw-wait-vs-lease  | progress | fail | -DTWAIT=6 -DMAXFAULTS=1
suspend-stops-clock | once     | fail | -DSUSPEND_STOPS_CLOCK
pause-in-window     | once     | fail | -DPAUSE_IN_WINDOW
fallback-default    | safety   | pass |
fallback-three-steps| safety   | pass | -DNCH=3
fallback-two-passes | safety   | pass | -DNW=2 -DMAXPASS=1
fallback-hole-1     | channel  | fail | -DBUG_CANCEL_NO_TOKEN
fallback-hole-1-end | end      | fail | -DBUG_CANCEL_NO_TOKEN
fallback-hole-2     | channel  | fail | -DBUG_STALE_READ
fallback-hole-3     | once     | fail | -DBUG_RESEND
fallback-no-guard   | end      | fail | -DBUG_NO_GUARD
fallback-ask-first  | phone    | fail | -DBUG_ASK_FIRST
fallback-unfenced   | phone    | fail | -DBUG_UNFENCED_MOVE
EOF
)
# --deep: state compression (-DCOLLAPSE) keeps the deep-* runs under 2 GB.
RUNS_DEEP=$(cat <<'EOF'
deep-safety         | safety   | pass | -DMAXFAULTS=4
sibling-crash       | safety   | pass | -DSIBLING -DMAXFAULTS=1 -DMAXPAUSE=0 -DMAXJUMP=0 -DMAXTERM=0
deep-progress       | progress | pass | -DMAXFAULTS=2
deep-fallback-passes| safety   | pass | -DNW=2
deep-fallback-three | safety   | pass | -DNCH=3 -DNW=2 -DMAXPASS=1
deep-fallback-long  | safety   | pass | -DMAXRUN=2 -DMAXPASS=3
EOF
)

keep=0
deep=0
only=" "
trail=""
while [ $# -gt 0 ]; do
    case "$1" in
        --deep) deep=1 ;;
        --keep) keep=1 ;;
        --only) shift; only="$only${1:?--only needs a run name} " ;;
        --trail) shift; trail="${1:?--trail needs a run name}"; only=" $trail " ;;
        --list) printf '%s\n%s\n' "$RUNS" "$RUNS_DEEP"; exit 0 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) log "unknown argument: $1"; exit 2 ;;
    esac
    shift
done

if ! command -v spin >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "spin is missing: installing it (apt-get install spin)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq spin >/dev/null
    else
        log "spin is missing: install it (Debian/Ubuntu: sudo apt-get install spin), then run this again"
        exit 1
    fi
fi
CC=${CC:-$(command -v gcc || command -v cc || true)}
if [ -z "$CC" ]; then
    log "no C compiler found (gcc or cc): install one (Debian/Ubuntu: apt-get install gcc)"
    exit 1
fi

build=$(mktemp -d -t sendonce-model.XXXXXX)
if [ "$keep" = 1 ]; then
    log "build directory: $build"
else
    trap 'rm -rf "$build"' EXIT
fi
cp "$MODEL" "$build/sendonce.pml"
limit=""
command -v timeout >/dev/null 2>&1 && limit="timeout $RUN_TIMEOUT"

# Prints a counterexample trail as a list of events, with the tick they
# happen in.
show_trail() {
    local dir=$1 flags=$2
    (cd "$dir" && spin -t $flags sendonce.pml 2>&1) |
        grep -E 'MSC:|START OF CYCLE|assertion violated|text of failed' |
        sed 's/^ *//; s/^MSC: //' |
        awk '/^---- tick/ { t++; next } { printf "  t=%-3d %s\n", t, $0 }'
}

if [ "$deep" = 1 ] || [ "$only" != " " ]; then
    RUNS=$(printf '%s\n%s\n' "$RUNS" "$RUNS_DEEP")
fi

# One run, in a folder of its own: writes its line of the table to
# $dir/line, PASS or not to $dir/class and its spin flags to $dir/flags.
run_one() { # name, property, expect, flags
    local name=$1 prop=$2 expect=$3 flags=$4
    local dir ccflags panflags result start end rc out elapsed states trans errors mem want
    dir="$build/$name"
    mkdir -p "$dir"
    # The `*fallback-*` runs check model/fallback.pml (a verification's
    # channels, one at a time), the others model/sendonce.pml; each run's
    # copy is called sendonce.pml so the rest is the same for both.
    case "$name" in
        *fallback-*) cp "$FALLBACK_MODEL" "$dir/sendonce.pml" ;;
        *) cp "$build/sendonce.pml" "$dir/" ;;
    esac
    case "$prop" in
        channel) flags="$flags -DCHECK_CHANNEL" ;;
        end) flags="$flags -DCHECK_END" ;;
        phone) flags="$flags -DCHECK_PHONE" ;;
        once) flags="$flags -DCHECK_ONCE" ;;
        final) flags="$flags -DCHECK_FINAL" ;;
        nofail) flags="$flags -DCHECK_NOFAIL" ;;
        attrib) flags="$flags -DCHECK_ATTRIB" ;;
        safety) ;;
        progress) flags="$flags -DPROGRESS" ;;
    esac
    # Counterexamples are searched breadth-first (the shortest one);
    # passing runs depth-first (less memory).
    ccflags="$PAN_CFLAGS -w -DMEMLIM=$MEMLIM_MB"
    case "$name" in deep-*) ccflags="$ccflags -DCOLLAPSE" ;; esac
    panflags="-m200000 -w25"
    if [ "$prop" = progress ]; then
        ccflags="$ccflags -DNP"
        panflags="$panflags -l"
    else
        ccflags="$ccflags -DSAFETY"
        [ "$expect" = fail ] && ccflags="$ccflags -DBFS"
    fi

    result=""
    if ! (cd "$dir" && spin -a $flags sendonce.pml >spin.out 2>&1); then
        result="ERROR (spin -a: $(head -n 1 "$dir/spin.out"))"
    elif ! (cd "$dir" && $CC $ccflags -o pan pan.c >cc.out 2>&1); then
        result="ERROR (cc: $(head -n 1 "$dir/cc.out"))"
    else
        start=$(date +%s.%N)
        set +e
        (cd "$dir" && $limit ./pan $panflags >pan.out 2>&1)
        rc=$?
        set -e
        end=$(date +%s.%N)
        out="$dir/pan.out"
        elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1fs", b - a }')
        states=$(awk '/states, stored/ { print $1; exit }' "$out")
        trans=$(awk '/transitions \(=/ { print $1; exit }' "$out")
        errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$out" | head -n 1)
        mem=$(awk '/total actual memory usage/ { printf "%dM", $1; exit }' "$out")
        if [ "$rc" = 124 ]; then
            result="ERROR (timeout after ${RUN_TIMEOUT}s)"
        elif grep -q 'reached -DMEMLIM bound\|out of memory' "$out"; then
            result="ERROR (memory limit reached: search incomplete)"
        elif grep -q 'max search depth too small' "$out"; then
            result="ERROR (search depth limit reached: search incomplete)"
        elif [ -z "$errors" ]; then
            result="ERROR (no result from pan, see $out)"
        elif grep -q 'assertion violated.*rq\[ti\]\.mk' "$out"; then
            result="ERROR (model sanity assertion failed)"
        elif [ "$expect" = pass ]; then
            if [ "$errors" = 0 ]; then
                result="PASS"
            else
                result="FAIL ($(grep -m1 -oE 'assertion violated|non-progress cycle|invalid end state' "$out" || echo error))"
            fi
        else
            if [ "$prop" = progress ]; then
                want='non-progress cycle'
            else
                want='assertion violated'
            fi
            if [ "$errors" != 0 ] && grep -q "$want" "$out"; then
                result="PASS (counterexample: $want)"
            else
                result="FAIL (no counterexample)"
            fi
        fi
    fi
    printf '%-21s %-9s %-6s %10s %12s %7s %7s  %s\n' "$name" "$prop" "$expect" \
        "${states:--}" "${trans:--}" "${mem:--}" "${elapsed:--}" "$result" >"$dir/line"
    printf '%s\n' "${result%% *}" >"$dir/class"
    printf '%s\n' "$flags" >"$dir/flags"
}

# The runs are independent: as many at once as there are cores
# (MODEL_CHECK_JOBS to choose; each run's memory is bounded by MEMLIM_MB).
jobs_max=${MODEL_CHECK_JOBS:-$(nproc 2>/dev/null || echo 1)}
names=()
while IFS='|' read -r name prop expect flags; do
    name=$(echo "$name" | xargs)
    prop=$(echo "$prop" | xargs)
    expect=$(echo "$expect" | xargs)
    flags=$(echo "$flags" | xargs)
    [ -n "$name" ] || continue
    if [ "$only" != " " ]; then
        case "$only" in *" $name "*) ;; *) continue ;; esac
    fi
    names+=("$name")
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
    run_one "$name" "$prop" "$expect" "$flags" &
done <<<"$RUNS"
wait

passed=0
failed=0
printf '%-21s %-9s %-6s %10s %12s %7s %7s  %s\n' run property expect states transitions memory time result
for name in "${names[@]}"; do
    dir="$build/$name"
    if [ -f "$dir/line" ]; then
        cat "$dir/line"
    else
        printf '%-21s ERROR (the run ended without a result)\n' "$name"
    fi
    case "$(cat "$dir/class" 2>/dev/null)" in
        PASS) passed=$((passed + 1)) ;;
        *) failed=$((failed + 1)) ;;
    esac
    if [ -n "$trail" ] && [ -f "$dir/sendonce.pml.trail" ]; then
        echo
        echo "counterexample of $name (spin -t $(cat "$dir/flags")):"
        show_trail "$dir" "$(cat "$dir/flags")"
    fi
done

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
