#!/usr/bin/env bash
# The benchmark, in one command (see BENCHMARKS.md for what it measures):
#
#   scripts/bench.sh                 release build; one sendonce instance on a
#                                    fresh database with the mock provider
#                                    answering at once; the unique, 90%-replay,
#                                    burst and GET mixes at concurrency 32 for
#                                    10 s each and a unique mix at concurrency
#                                    256; a unique mix on an instance with the
#                                    simulated provider; the FastAPI + Redis
#                                    SET NX peer (bench/peer/, uvicorn with 2
#                                    workers, in a venv under target/ with the
#                                    pinned bench/peer/requirements.txt; skipped
#                                    without python3 and redis-server, or with
#                                    BENCH_PEER=0); then the two pgbench floors;
#                                    prints the tables and the targets (about
#                                    2 min after the build); before all that,
#                                    sendonce on SQLite against its naive
#                                    SQLite floor (sqlite_bench; BENCH_SQLITE=0
#                                    skips it), whose figures join the opening
#                                    table
#   scripts/bench.sh --smoke         a few seconds on a debug build: checks
#                                    correctness only (no errors, replays
#                                    byte-identical, one send per burst, no
#                                    duplicate delivery, nothing stuck); CI
#   scripts/bench.sh --chaos         then also the chaos run (scripts/chaos.sh:
#                                    3000 keys with duplicates, provider faults,
#                                    SIGKILLs; CHAOS_ARGS adds arguments, e.g.
#                                    CHAOS_ARGS=--restart-postgres, which
#                                    runs on a throwaway Postgres cluster of
#                                    its own and restarts that one)
#
# Other arguments go to the load generator (`target/release/loadgen --help`),
# e.g. --concurrency 64 --duration-secs 30 --mixes unique,replay.
# Postgres: $TEST_DATABASE_URL or postgres://postgres@127.0.0.1:5432/postgres
# (it creates and drops databases there). BENCH_PROFILE=debug|release
# overrides the build profile.
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=0
chaos=0
args=()
for a in "$@"; do
    case "$a" in
        --smoke) smoke=1; args+=(--smoke) ;;
        --chaos) chaos=1 ;;
        *) args+=("$a") ;;
    esac
done
if [ "$smoke" = 1 ]; then
    profile=${BENCH_PROFILE:-debug}
else
    profile=${BENCH_PROFILE:-release}
fi
flag=()
[ "$profile" = release ] && flag=(--release)

cargo build "${flag[@]}" -p sendonce --bin sendonce
cargo build "${flag[@]}" -p testkit --bin mock-provider
cargo build "${flag[@]}" -p sendonce-bench --bin loadgen --bin sqlite_bench

peer=()
if [ "$smoke" = 0 ] && [ "${BENCH_PEER:-1}" = 1 ]; then
    if command -v python3 >/dev/null && command -v redis-server >/dev/null; then
        venv=target/bench-peer-venv
        if [ ! -x "$venv/bin/python" ] || ! cmp -s bench/peer/requirements.txt "$venv/requirements.txt"; then
            python3 -m venv "$venv"
            "$venv/bin/pip" install --quiet --disable-pip-version-check -r bench/peer/requirements.txt
            cp bench/peer/requirements.txt "$venv/requirements.txt"
        fi
        peer=(--peer-python "$venv/bin/python")
    else
        echo "bench: python3 or redis-server missing: the FastAPI + Redis peer is skipped" >&2
    fi
fi
# sendonce on SQLite against its own naive floor first: its figures join
# the opening table the load generator prints (BENCH_SQLITE=0 skips it).
sqlite=()
if [ "$smoke" = 0 ] && [ "${BENCH_SQLITE:-1}" = 1 ]; then
    report=target/bench-sqlite.json
    rm -f "$report"
    "target/$profile/sqlite_bench" --report "$report"
    sqlite=(--sqlite-report "$report")
fi
"target/$profile/loadgen" ${peer[@]+"${peer[@]}"} ${sqlite[@]+"${sqlite[@]}"} ${args[@]+"${args[@]}"}

if [ "$chaos" = 1 ]; then
    # shellcheck disable=SC2086
    if [ "$smoke" = 1 ]; then
        CHAOS_PROFILE=$profile scripts/chaos.sh --keys 300 --duplicates 2 --kill-every-ms 600 ${CHAOS_ARGS:-}
    else
        CHAOS_PROFILE=$profile scripts/chaos.sh ${CHAOS_ARGS:-}
    fi
fi
