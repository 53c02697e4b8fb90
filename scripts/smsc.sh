#!/usr/bin/env bash
# The test SMSC of the SMPP adapter's tests (tests/api/npm_smsc.rs): the npm
# `smpp` package's server (pinned in testkit/smsc/package.json and its
# package-lock.json), run by testkit/smsc/smsc.js and scripted by the tests
# over stdin/stdout (JSON lines; the protocol is at the top of smsc.js).
#
#   scripts/smsc.sh install      npm ci the pinned package into
#                                target/tools/smsc-<version>/, project-local,
#                                if missing (idempotent, one at a time)
#   scripts/smsc.sh run ARGS...  installs first, then execs node smsc.js ARGS
#
# Needs Node.js 20 and npm. Exit 3: Node.js is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.5.1
src=testkit/smsc
dir=target/tools/smsc-$version

log() { printf 'smsc.sh: %s\n' "$*" >&2; }

install() {
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        log "Node.js and npm are needed (Debian/Ubuntu: apt-get install nodejs npm)"
        exit 3
    fi
    mkdir -p "$dir"
    # One install at a time (tests may start several).
    exec 9>"$dir.lock"
    flock 9
    if [ ! -f "$dir/node_modules/smpp/package.json" ] \
        || ! cmp -s "$src/package-lock.json" "$dir/package-lock.json"; then
        log "installing smpp@$version (testkit/smsc/package-lock.json) into $dir"
        cp "$src/package.json" "$src/package-lock.json" "$dir/"
        npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error >&2
    fi
    flock -u 9
}

case "${1:-}" in
    install)
        install
        ;;
    run)
        shift
        install
        NODE_PATH="$PWD/$dir/node_modules" exec node "$src/smsc.js" "$@"
        ;;
    *)
        echo "usage: scripts/smsc.sh install | run [--port N] [--tls-key F --tls-cert F]" >&2
        exit 2
        ;;
esac
