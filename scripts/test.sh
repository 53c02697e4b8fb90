#!/usr/bin/env bash
# Runs the whole test suite against a real Postgres, safe beside anything
# else on the machine.
#
# By default it starts a throwaway cluster of its own with the machine's
# initdb/pg_ctl (as user postgres when run as root; initdb refuses root) on a
# free port (never 5432) in a temporary directory (in memory when there is
# room), and stops and removes it
# on exit, whether the tests passed, failed or the script was interrupted
# (Ctrl-C, SIGTERM, SIGHUP). With TEST_DATABASE_URL set it uses that server
# instead, and touches only databases whose name starts with this run's
# prefix: SENDONCE_TEST_DB_PREFIX if given, else sendonce_t_r<random>_ (one
# of its own per run). Each test makes one database, <prefix><pid>_<random>;
# on exit (and at the start, for a prefix given) the script drops the
# databases under its prefix whose test process is gone, never another's.
# Without any Postgres installed it says which package to install.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'test.sh: %s\n' "$*" >&2; }

find_pg_bin() {
    local name=$1
    if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return; fi
    local found
    found=$(ls -d /usr/lib/postgresql/*/bin/"$name" 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$found" ] && echo "$found"
}

# A TCP port nothing listens on (the kernel's choice), never 5432.
free_port() {
    local port
    for _ in 1 2 3 4 5 6 7 8; do
        if command -v python3 >/dev/null 2>&1; then
            port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
        else
            port=$((20000 + RANDOM % 30000))
        fi
        [ "$port" != 5432 ] || continue
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return; fi
    done
    return 1
}

# Every process below $1, deepest first.
descendants() {
    local c
    for c in $(pgrep -P "$1" 2>/dev/null || true); do
        descendants "$c"
        echo "$c"
    done
}

# Where the throwaway cluster lives: in memory (/dev/shm) when it has room
# for a whole run's databases (about 4 GB) and the machine memory to spare,
# since deleting them from a busy disk took 80 s at the end of a run; else
# /tmp. SENDONCE_TEST_PG_PARENT chooses.
pg_parent() {
    if [ -n "${SENDONCE_TEST_PG_PARENT:-}" ]; then echo "$SENDONCE_TEST_PG_PARENT"; return; fi
    local shm_kb mem_kb
    shm_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
    mem_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo 2>/dev/null)
    if [ "${shm_kb:-0}" -ge $((6 * 1024 * 1024)) ] && [ "${mem_kb:-0}" -ge $((8 * 1024 * 1024)) ]; then
        echo /dev/shm
    else
        echo /tmp
    fi
}

prefix=""
psql=$(find_pg_bin psql) || true
as_pg=()
tmpdir=""
tests_pid=""

# Drops the databases under this run's prefix whose test process (the pid
# in the name) is gone. Never a name outside the prefix.
drop_own_databases() {
    [ -n "$prefix" ] && [ -n "${psql:-}" ] || return 0
    local db rest owner
    for db in $("$psql" "$TEST_DATABASE_URL" -Atqc \
        "select datname from pg_database where left(datname, ${#prefix}) = '$prefix'" 2>/dev/null); do
        [ "${db:0:${#prefix}}" = "$prefix" ] || continue
        rest=${db:${#prefix}}
        owner=${rest%%_*}
        if [[ "$owner" =~ ^[0-9]+$ ]] && kill -0 "$owner" 2>/dev/null; then continue; fi
        "$psql" "$TEST_DATABASE_URL" -qc "drop database if exists \"$db\"" >/dev/null 2>&1 \
            || log "could not drop $db"
    done
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM HUP
    if [ -n "$tests_pid" ] && kill -0 "$tests_pid" 2>/dev/null; then
        log "stopping the tests"
        # shellcheck disable=SC2046
        kill -TERM $(descendants "$tests_pid") "$tests_pid" 2>/dev/null || true
        wait "$tests_pid" 2>/dev/null || true
    fi
    if [ -n "$tmpdir" ] && [ -d "$tmpdir" ]; then
        log "stopping the throwaway Postgres and removing $tmpdir"
        "${as_pg[@]}" "$PG_CTL" -D "$tmpdir/data" -m immediate stop >/dev/null 2>&1 || true
        rm -rf "$tmpdir"
    else
        drop_own_databases
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

if [ -n "${SENDONCE_TEST_DB_PREFIX:-}" ]; then
    prefix=$SENDONCE_TEST_DB_PREFIX
    if ! [[ "$prefix" =~ ^[a-z][a-z0-9_]{0,29}$ ]]; then
        log "SENDONCE_TEST_DB_PREFIX must be 1 to 30 lower-case letters, digits and _, starting with a letter (got '$prefix')"
        exit 2
    fi
else
    prefix="sendonce_t_r$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')_"
fi
export SENDONCE_TEST_DB_PREFIX=$prefix

if [ -n "${TEST_DATABASE_URL:-}" ]; then
    log "using TEST_DATABASE_URL; this run's databases are named $prefix*"
    # Leftovers of an earlier run under a prefix given (its processes gone).
    drop_own_databases
else
    INITDB=$(find_pg_bin initdb) || true
    PG_CTL=$(find_pg_bin pg_ctl) || true
    if [ -z "${INITDB:-}" ] || [ -z "${PG_CTL:-}" ]; then
        log "no Postgres found. Install one (Debian/Ubuntu: apt-get install postgresql) or set TEST_DATABASE_URL."
        exit 1
    fi
    tmpdir=$(mktemp -d "$(pg_parent)/sendonce-pg.XXXXXX")
    chmod 755 "$tmpdir"
    if [ "$(id -u)" = 0 ]; then
        id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
        chown postgres "$tmpdir"
        as_pg=(runuser -u postgres --)
    fi
    "${as_pg[@]}" "$INITDB" -D "$tmpdir/data" -U postgres --auth=trust -E UTF8 >/dev/null
    started=""
    # The port is free when chosen; another process may take it before
    # Postgres binds it: then another one.
    for _ in 1 2 3; do
        port=$(free_port) || { log "no free port found"; exit 1; }
        log "starting a throwaway Postgres on 127.0.0.1:$port in $tmpdir"
        # Room for the conformance suite's situations (an instance each,
        # up to 4 connections, several tests at once); a stopped instance
        # closes its own (tests/api/lifecycle.rs checks it), so nothing is
        # timed out behind a test's back.
        if "${as_pg[@]}" "$PG_CTL" -D "$tmpdir/data" -l "$tmpdir/log" -w -t 120 \
            -o "-p $port -k $tmpdir -c listen_addresses=127.0.0.1 -c max_connections=1000 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
            start >/dev/null; then
            started=1
            break
        fi
    done
    [ -n "$started" ] || { log "the throwaway Postgres did not start:"; cat "$tmpdir/log" >&2; exit 1; }
    export TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
fi

# Most tests wait on the processes, timers and database they start, not on
# the CPU: at least 4 at once (on 2 cores the API suite took 251 and 269 s
# with 4, 450 s with the default of one per core; RUST_TEST_THREADS wins).
if [ -z "${RUST_TEST_THREADS:-}" ]; then
    threads=$(nproc 2>/dev/null || echo 1)
    [ "$threads" -ge 4 ] || threads=4
    export RUST_TEST_THREADS=$threads
fi

# `failpoints`: the test build of the binary can crash or pause itself at
# named points (src/failpoint.rs); no other build has them. In the
# background, so that a signal to this script is handled at once (bash runs
# traps only between commands) and stops the tests before their Postgres.
cargo test --all-targets --features failpoints "$@" &
tests_pid=$!
status=0
wait "$tests_pid" || status=$?
tests_pid=""
exit "$status"
