#!/usr/bin/env bash
# A highly available Postgres for the failover tests: a pg_auto_failover
# monitor and two Postgres 15 nodes in a temporary folder, run as user
# postgres, with synchronous replication (pg_auto_failover's default with
# replication-quorum on: a commit the primary acknowledged is on the standby).
# Needs the Debian packages postgresql-15-auto-failover and pg-auto-failover-cli.
#
#   scripts/ha.sh up DIR            start; prints ADMIN_URL=... and HOSTS=...
#   scripts/ha.sh failover DIR      pg_autoctl perform failover (waits for it)
#   scripts/ha.sh kill-primary DIR  SIGKILL the primary's postmaster
#   scripts/ha.sh primary DIR       host:port of the current primary
#   scripts/ha.sh down DIR          stop everything and delete DIR
#   scripts/ha.sh chaos perform|kill [chaos args...]
#       up, the chaos driver through two sendonce instances on the multi-host
#       URL with the switch done halfway through the load, down.
set -euo pipefail
cd "$(dirname "$0")/.."
PGBIN=$(ls -d /usr/lib/postgresql/15/bin)
export PATH="$PGBIN:$PATH"

as_pg() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- env PATH="$PATH" "$@"
    else
        "$@"
    fi
}

# N free ports, distinct: all held open until each is chosen (ephemeral
# ports, so never the machine's own 5432).
free_ports() {
    python3 -c 'import socket, sys
held = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in held: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in held))' "$1"
}

monitor_uri() { cat "$1/monitor.uri"; }

up() {
    local dir=$1
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    local mport n1 n2
    read -r mport n1 n2 < <(free_ports 3)
    as_pg pg_autoctl create monitor --pgdata "$dir/monitor" --pgport "$mport" \
        --hostname 127.0.0.1 --auth trust --no-ssl >"$dir/monitor.create.log" 2>&1
    (as_pg pg_autoctl run --pgdata "$dir/monitor" >"$dir/monitor.log" 2>&1 &)
    local uri="postgres://autoctl_node@127.0.0.1:$mport/pg_auto_failover?sslmode=disable"
    echo "$uri" >"$dir/monitor.uri"
    wait_for "the monitor" 60 as_pg psql -qAt "$uri" -c 'select 1'
    for p in "$n1" "$n2"; do
        as_pg pg_autoctl create postgres --pgdata "$dir/node$p" --pgport "$p" \
            --hostname 127.0.0.1 --auth trust --no-ssl --monitor "$uri" \
            --name "node$p" >"$dir/node$p.create.log" 2>&1
        (as_pg pg_autoctl run --pgdata "$dir/node$p" >"$dir/node$p.log" 2>&1 &)
        echo "$p" >>"$dir/ports"
        wait_for "node $p" 120 goal_reached "$dir"
    done
    wait_for "a primary and a secondary" 120 two_nodes_ready "$dir"
    echo "ADMIN_URL=postgres://postgres@$(primary "$dir")/postgres"
    echo "HOSTS=127.0.0.1:$n1,127.0.0.1:$n2"
}

states() {
    as_pg psql -qAt "$(monitor_uri "$1")" \
        -c "select nodehost||':'||nodeport, reportedstate, goalstate from pgautofailover.node"
}

goal_reached() {
    local s
    s=$(states "$1") || return 1
    [ -n "$s" ] && ! echo "$s" | awk -F'|' '$2 != $3 {bad=1} END {exit !bad}'
}

two_nodes_ready() {
    local s
    s=$(states "$1") || return 1
    echo "$s" | grep -q '|primary|primary' && echo "$s" | grep -q '|secondary|secondary'
}

primary() {
    states "$1" | awk -F'|' '$2 == "primary" {print $1; exit}'
}

wait_for() {
    local what=$1 secs=$2
    shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $end ]; then
            echo "ha.sh: timed out waiting for $what" >&2
            return 1
        fi
        sleep 0.5
    done
}

failover() {
    as_pg pg_autoctl perform failover --pgdata "$1/monitor" --wait 120
}

kill_primary() {
    local dir=$1 p port
    p=$(primary "$dir")
    port=${p##*:}
    kill -KILL "$(head -1 "$dir/node$port/postmaster.pid")"
    echo "ha.sh: SIGKILLed the postmaster of $p"
}

down() {
    local dir=$1
    for d in "$dir"/node* "$dir/monitor"; do
        [ -d "$d" ] && as_pg pg_autoctl stop --pgdata "$d" --immediate >/dev/null 2>&1 || true
    done
    rm -rf "$dir"
}

chaos() {
    local how=$1
    shift
    HA_DIR=$(mktemp -d /tmp/sendonce-ha.XXXXXX)
    trap 'down "$HA_DIR"' EXIT
    # A signal (CI's timeout) ends the run through the EXIT trap too.
    trap 'exit 130' INT TERM
    local dir=$HA_DIR
    local out admin hosts
    out=$(up "$dir")
    admin=$(echo "$out" | sed -n 's/^ADMIN_URL=//p')
    hosts=$(echo "$out" | sed -n 's/^HOSTS=//p')
    echo "ha.sh: cluster up: primary $(primary "$dir"), hosts $hosts"
    as_pg psql -qAt "$admin" -c 'show synchronous_standby_names'
    local switch
    case "$how" in
        perform) switch="scripts/ha.sh failover $dir" ;;
        kill) switch="scripts/ha.sh kill-primary $dir" ;;
        *) echo "ha.sh chaos perform|kill" >&2; exit 2 ;;
    esac
    profile=${CHAOS_PROFILE:-release}
    flag=()
    [ "$profile" = release ] && flag=(--release)
    cargo build "${flag[@]}" -p sendonce --bin sendonce
    cargo build "${flag[@]}" -p testkit --bin mock-provider
    cargo build "${flag[@]}" -p sendonce-bench --bin chaos
    "target/$profile/chaos" --admin-url "$admin" --hosts "$hosts" \
        --switch-cmd "$switch" --instances 2 --kill-every-ms 0 "$@"
    echo "ha.sh: primary after the run: $(primary "$dir")"
}

cmd=${1:-}
shift || true
case "$cmd" in
    up) up "$1" ;;
    failover) failover "$1" ;;
    kill-primary) kill_primary "$1" ;;
    primary) primary "$1" ;;
    down) down "$1" ;;
    chaos) chaos "$@" ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
esac
