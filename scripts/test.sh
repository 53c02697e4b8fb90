#!/usr/bin/env bash
# Runs the whole test suite against a real Postgres.
#
# Finds one: $TEST_DATABASE_URL if set, else a server on 127.0.0.1:5432 that
# trusts user postgres, else starts a throwaway cluster with the machine's own
# initdb/pg_ctl (as user postgres when run as root; initdb refuses root) and
# stops it afterwards. Without any Postgres installed it says which package to
# install. Each test makes its own database (sendonce_t_<pid>_*); leftovers from
# earlier runs are dropped first.
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

can_connect() {
    local url=$1 psql
    psql=$(find_pg_bin psql) || true
    if [ -n "${psql:-}" ]; then
        "$psql" "$url" -Atqc 'select 1' >/dev/null 2>&1
    else
        (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null
    fi
}

tmpdir=""
cleanup() {
    if [ -n "$tmpdir" ] && [ -d "$tmpdir" ]; then
        log "stopping the throwaway Postgres"
        if [ "$(id -u)" = 0 ]; then
            runuser -u postgres -- "$PG_CTL" -D "$tmpdir/data" -m fast stop >/dev/null 2>&1 || true
        else
            "$PG_CTL" -D "$tmpdir/data" -m fast stop >/dev/null 2>&1 || true
        fi
        rm -rf "$tmpdir"
    fi
}
trap cleanup EXIT

if [ -z "${TEST_DATABASE_URL:-}" ]; then
    default_url="postgres://postgres@127.0.0.1:5432/postgres"
    if can_connect "$default_url"; then
        export TEST_DATABASE_URL=$default_url
        log "using the Postgres on 127.0.0.1:5432"
    else
        INITDB=$(find_pg_bin initdb) || true
        PG_CTL=$(find_pg_bin pg_ctl) || true
        if [ -z "${INITDB:-}" ] || [ -z "${PG_CTL:-}" ]; then
            log "no Postgres found. Install one (Debian/Ubuntu: apt-get install postgresql) or set TEST_DATABASE_URL."
            exit 1
        fi
        port=${SENDONCE_TEST_PG_PORT:-54329}
        tmpdir=$(mktemp -d /tmp/sendonce-pg.XXXXXX)
        chmod 755 "$tmpdir"
        log "starting a throwaway Postgres on 127.0.0.1:$port in $tmpdir"
        as_pg=()
        if [ "$(id -u)" = 0 ]; then
            id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
            chown postgres "$tmpdir"
            as_pg=(runuser -u postgres --)
        fi
        "${as_pg[@]}" "$INITDB" -D "$tmpdir/data" -U postgres --auth=trust -E UTF8 >/dev/null
        "${as_pg[@]}" "$PG_CTL" -D "$tmpdir/data" -l "$tmpdir/log" -w \
            -o "-p $port -k $tmpdir -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off" start >/dev/null
        export TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
    fi
fi

psql=$(find_pg_bin psql) || true
if [ -n "${psql:-}" ]; then
    for db in $("$psql" "$TEST_DATABASE_URL" -Atqc "select datname from pg_database where datname like 'sendonce\_t\_%'" 2>/dev/null); do
        # sendonce_t_<pid>_<uuid>: a run still going on beside this one
        # (its test process alive) keeps its databases.
        owner=$(printf '%s' "$db" | sed -n 's/^sendonce_t_\([0-9][0-9]*\)_.*/\1/p')
        if [ -n "$owner" ] && kill -0 "$owner" 2>/dev/null; then continue; fi
        "$psql" "$TEST_DATABASE_URL" -qc "drop database if exists \"$db\"" >/dev/null 2>&1 || true
    done
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
# named points (src/failpoint.rs); no other build has them.
cargo test --all-targets --features failpoints "$@"
