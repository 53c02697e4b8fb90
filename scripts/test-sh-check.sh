#!/usr/bin/env bash
# Checks that scripts/test.sh (the README's test command) is safe on a
# shared machine, with a stand-in `cargo` on PATH (what it would run is not
# the point here; CI runs the real suite through it in its own step):
#  1. by default it runs the tests against a throwaway cluster of its own on
#     a port that is not 5432, hands on their exit status, and stops and
#     removes the cluster after a failure;
#  2. on SIGTERM in the middle of the tests it stops them and the cluster and
#     removes the cluster's directory, promptly;
#  3. with TEST_DATABASE_URL it drops only databases under its own prefix
#     (one of its own per run unless SENDONCE_TEST_DB_PREFIX gives one),
#     never another run's: not a `sendonce_t_*` one whose process is gone,
#     not one of another prefix, not one of a live process under its own.
# Case 3 runs inside the cluster of a test.sh run, so no shared server is
# needed (nor touched).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d /tmp/sendonce-test-sh-check.XXXXXX)
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT

fail() { printf 'test-sh-check: FAIL: %s\n' "$*" >&2; exit 1; }
say() { printf 'test-sh-check: %s\n' "$*"; }
psql=$(command -v psql || ls -d /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -n 1)
[ -n "$psql" ] || fail "no psql"

# The stand-in cargo: does what $STUB says, with what test.sh gave it.
mkdir -p "$work/bin"
cat >"$work/bin/cargo" <<'EOF'
#!/usr/bin/env bash
set -euo pipefail
printf '%s\n%s\n' "$TEST_DATABASE_URL" "$SENDONCE_TEST_DB_PREFIX" >"$STUB_OUT.env"
q() { psql "$TEST_DATABASE_URL" -Atqc "$1"; }
case "$STUB" in
fail)
    q "create database ${SENDONCE_TEST_DB_PREFIX}$$_a"
    exit 3 ;;
hang)
    echo $$ >"$STUB_OUT.pid"
    sleep 600 & wait ;;
own)
    q "create database ${SENDONCE_TEST_DB_PREFIX}$$_a"
    q "create database ${SENDONCE_TEST_DB_PREFIX}$$_b" ;;
shared)
    # Inside a throwaway cluster: databases test.sh did not make, then a
    # run of test.sh against this server as TEST_DATABASE_URL.
    dead=4000000; while kill -0 "$dead" 2>/dev/null; do dead=$((dead + 1)); done
    for db in "sendonce_t_${dead}_old" sendonce_t_rdeadbeef_${dead}_x other_db given_${dead}_left "given_$$_live" givenx_${dead}_y; do
        q "create database $db"
    done
    STUB=own STUB_OUT=$STUB_OUT.inner "$ROOT/scripts/test.sh" || exit 10
    inner_prefix=$(sed -n 2p "$STUB_OUT.inner.env")
    case "$inner_prefix" in sendonce_t_r*_) ;; *) echo "inner prefix $inner_prefix"; exit 11 ;; esac
    q "select datname from pg_database where datname not in ('postgres', 'template0', 'template1') order by 1" >"$STUB_OUT.after-default"
    SENDONCE_TEST_DB_PREFIX=given_ STUB=own STUB_OUT=$STUB_OUT.given "$ROOT/scripts/test.sh" || exit 12
    q "select datname from pg_database where datname not in ('postgres', 'template0', 'template1') order by 1" >"$STUB_OUT.after-given"
    printf '%s\n' "$dead" >"$STUB_OUT.dead" ;;
esac
EOF
chmod 755 "$work/bin/cargo"
export PATH="$work/bin:$PATH" ROOT=$root
unset TEST_DATABASE_URL SENDONCE_TEST_DB_PREFIX

port_of() { sed -n 1p "$1" | sed -n 's#.*@127\.0\.0\.1:\([0-9]*\)/.*#\1#p'; }
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
cluster_dir() { sed -n 's/.*starting a throwaway Postgres on .* in \(.*\)$/\1/p' "$1" | tail -n 1; }

# 1. A failing run: its status, its own cluster, gone afterwards.
status=0
STUB=fail STUB_OUT=$work/fail scripts/test.sh 2>"$work/fail.log" || status=$?
[ "$status" = 3 ] || fail "a failing run exited $status, not the tests' 3: $(cat "$work/fail.log")"
port=$(port_of "$work/fail.env")
[ -n "$port" ] && [ "$port" != 5432 ] || fail "the default run used $(sed -n 1p "$work/fail.env")"
dir=$(cluster_dir "$work/fail.log")
[ -n "$dir" ] && [ ! -e "$dir" ] || fail "the cluster's directory '$dir' is still there"
! listening "$port" || fail "the cluster on $port still listens"
say "ok: a failing run's status is kept, its cluster (port $port) stopped and removed"

# 2. SIGTERM in the middle of the tests.
STUB=hang STUB_OUT=$work/hang scripts/test.sh 2>"$work/hang.log" &
script=$!
deadline=$((SECONDS + 120))
until [ -s "$work/hang.pid" ]; do
    [ $SECONDS -lt $deadline ] || fail "the tests did not start: $(cat "$work/hang.log")"
    sleep 0.2
done
tests=$(cat "$work/hang.pid")
port=$(port_of "$work/hang.env")
dir=$(cluster_dir "$work/hang.log")
listening "$port" || fail "no cluster on $port while the tests run"
kill -TERM "$script"
deadline=$((SECONDS + 30))
while kill -0 "$script" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || fail "test.sh still runs 30 s after SIGTERM"
    sleep 0.2
done
status=0; wait "$script" || status=$?
[ "$status" = 143 ] || fail "after SIGTERM test.sh exited $status"
! kill -0 "$tests" 2>/dev/null || fail "the tests ($tests) still run after SIGTERM"
[ -n "$dir" ] && [ ! -e "$dir" ] || fail "the cluster's directory '$dir' is still there after SIGTERM"
! listening "$port" || fail "the cluster on $port still listens after SIGTERM"
say "ok: SIGTERM stops the tests and the cluster and removes its directory"

# 3. A shared server: only its own prefix.
STUB=shared STUB_OUT=$work/shared scripts/test.sh 2>"$work/shared.log" \
    || fail "the shared-server case failed: $(cat "$work/shared.log")"
dead=$(cat "$work/shared.dead")
after_default=$(cat "$work/shared.after-default")
for db in "sendonce_t_${dead}_old" "sendonce_t_rdeadbeef_${dead}_x" other_db "given_${dead}_left" "givenx_${dead}_y"; do
    grep -qx "$db" <<<"$after_default" || fail "a run with its own prefix dropped $db: $after_default"
done
inner_prefix=$(sed -n 2p "$work/shared.inner.env")
! grep -q "^$inner_prefix" <<<"$after_default" || fail "the run left its own databases: $after_default"
after_given=$(cat "$work/shared.after-given")
for db in "sendonce_t_${dead}_old" "sendonce_t_rdeadbeef_${dead}_x" other_db "givenx_${dead}_y"; do
    grep -qx "$db" <<<"$after_given" || fail "a run with prefix given_ dropped $db: $after_given"
done
grep -q '^given_[0-9]*_live$' <<<"$after_given" || fail "a run with prefix given_ dropped a live process's database: $after_given"
[ "$(grep -c '^given_' <<<"$after_given")" = 1 ] || fail "a run with prefix given_ left its own or a dead process's databases: $after_given"
say "ok: with TEST_DATABASE_URL only the run's own prefix is touched ($inner_prefix, then given_)"
say "all checks passed"
