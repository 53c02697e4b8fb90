#!/usr/bin/env bash
# Stoplight Prism as a mock of Twilio's own OpenAPI description: the contract
# test of the Twilio adapter (tests/api/twilio.rs) sends real requests to it,
# so a request Twilio would reject as malformed fails the build.
#
#   scripts/prism.sh install     install @stoplight/prism-cli (pinned) into
#                                target/tools/, project-local, if missing, and
#                                fetch Twilio's description (below) there
#   scripts/prism.sh mock PORT   serve the description on 127.0.0.1:PORT
#                                (installs first; execs prism)
#
# TWILIO_OPENAPI names the description (default: Twilio's twilio-oai
# twilio_api_v2010.yaml, MIT, as shipped in the npm package
# @twilio-alpha/mcp at a pinned version, unpacked into target/tools/).
# Needs Node.js 20 and npm. Exit 3: Node.js is missing; 4: no description.
set -euo pipefail
cd "$(dirname "$0")/.."

version=5.14.2
dir=target/tools/prism-$version
# Twilio's OpenAPI description comes from this npm package, pinned.
oai_package=@twilio-alpha/mcp
oai_version=0.7.0
oai_member=package/twilio-oai/spec/yaml/twilio_api_v2010.yaml
oai_dir=target/tools/twilio-oai-$oai_version
default_spec=$oai_dir/twilio_api_v2010.yaml
spec=${TWILIO_OPENAPI:-$default_spec}

log() { printf 'prism.sh: %s\n' "$*" >&2; }

install() {
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        log "Node.js and npm are needed (Debian/Ubuntu: apt-get install nodejs npm)"
        exit 3
    fi
    mkdir -p "$dir"
    # One install at a time (tests may start several).
    exec 9>"$dir.lock"
    flock 9
    if [ ! -x "$dir/node_modules/.bin/prism" ]; then
        log "installing @stoplight/prism-cli@$version into $dir"
        npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
            "@stoplight/prism-cli@$version" >&2
    fi
    if [ -z "${TWILIO_OPENAPI:-}" ] && [ ! -f "$default_spec" ]; then
        log "fetching Twilio's OpenAPI description from $oai_package@$oai_version into $oai_dir"
        local tmp
        tmp=$(mktemp -d "$dir.oai.XXXXXX")
        (cd "$tmp" && npm pack --silent --loglevel=error "$oai_package@$oai_version" >/dev/null)
        tar xzf "$tmp"/*.tgz -C "$tmp" "$oai_member"
        mkdir -p "$oai_dir"
        mv "$tmp/$oai_member" "$default_spec.part"
        mv "$default_spec.part" "$default_spec"
        rm -rf "$tmp"
    fi
    flock -u 9
}

case "${1:-}" in
    install)
        install
        ;;
    mock)
        port=${2:?usage: scripts/prism.sh mock PORT}
        install
        if [ ! -f "$spec" ]; then
            log "no Twilio OpenAPI description at $spec (set TWILIO_OPENAPI)"
            exit 4
        fi
        exec "$dir/node_modules/.bin/prism" mock "$spec" -h 127.0.0.1 -p "$port"
        ;;
    *)
        echo "usage: scripts/prism.sh install | mock PORT" >&2
        exit 2
        ;;
esac
