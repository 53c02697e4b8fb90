#!/usr/bin/env bash
# PgBouncer for the pooler test (tests/api/pooler.rs): the contract suite
# runs through it in transaction mode.
#
#   scripts/pgbouncer.sh install   build PgBouncer (pinned, below) into
#                                  target/tools/, project-local, if missing
#   scripts/pgbouncer.sh path      print the binary's path (installs first)
#
# Why not Debian bookworm's `pgbouncer` (1.18): sqlx sends a statement's
# Parse/Describe/Sync and its Bind/Execute/Sync as two separate exchanges,
# and in transaction mode PgBouncer hands the server connection back to the
# pool between them (the first Sync ends an idle "transaction"), so the Bind
# can reach a server where the statement does not exist, or where another
# client's statement of the same name does. PgBouncer 1.21 and later track
# protocol-level prepared statements per client (`max_prepared_statements`)
# and prepare them on whichever server the Bind lands on; 1.18 cannot.
# So this builds 1.24.1 from Debian trixie's source package (the upstream
# tarball plus Debian's patches, both checked against pinned SHA-256 sums
# from deb.debian.org). Needs gcc, make, pkg-config, libevent-dev and
# libssl-dev (Debian: apt-get install build-essential pkg-config
# libevent-dev libssl-dev). Exit 3: a build dependency is missing, or the
# source cannot be downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."

version=1.24.1
debian_revision=1+deb13u2
pool=https://deb.debian.org/debian/pool/main/p/pgbouncer
orig=pgbouncer_$version.orig.tar.gz
orig_sha256=da72a3aba13072876d055a3e58dd4aba4a5de4ed6148e73033185245598fd3e0
debian=pgbouncer_$version-$debian_revision.debian.tar.xz
debian_sha256=2325bcaa2e71919d399b9e5aef5b94ff988fc1f1d296908c3937b682b7be5cbb
dir=$PWD/target/tools/pgbouncer-$version-$debian_revision
bin=$dir/bin/pgbouncer

log() { printf 'pgbouncer.sh: %s\n' "$*" >&2; }

fetch() {
    local name=$1 sha=$2 dest=$3
    curl -fsSL --retry 3 -o "$dest/$name" "$pool/$name" || {
        log "cannot download $pool/$name"
        rm -rf "$dest"
        exit 3
    }
    echo "$sha  $dest/$name" | sha256sum -c --quiet - || {
        log "$name does not match its pinned SHA-256"
        rm -rf "$dest"
        exit 1
    }
}

install() {
    [ -x "$bin" ] && return
    for tool in gcc make pkg-config curl patch; do
        command -v "$tool" >/dev/null 2>&1 || { log "$tool is needed"; exit 3; }
    done
    for lib in libevent openssl; do
        pkg-config --exists "$lib" || {
            log "$lib development files are needed (Debian: apt-get install libevent-dev libssl-dev)"
            exit 3
        }
    done
    mkdir -p "$(dirname "$dir")"
    # One build at a time (tests may ask at once).
    exec 9>"$dir.lock"
    flock 9
    if [ ! -x "$bin" ]; then
        log "building PgBouncer $version ($debian_revision) into $dir"
        local tmp
        tmp=$(mktemp -d "$dir.build.XXXXXX")
        fetch "$orig" "$orig_sha256" "$tmp"
        fetch "$debian" "$debian_sha256" "$tmp"
        tar xzf "$tmp/$orig" -C "$tmp"
        tar xJf "$tmp/$debian" -C "$tmp/pgbouncer-$version"
        (
            cd "$tmp/pgbouncer-$version"
            if [ -f debian/patches/series ]; then
                grep -v '^\s*#' debian/patches/series | while read -r p _; do
                    [ -n "$p" ] && patch -p1 -s <"debian/patches/$p"
                done
            fi
            ./configure --prefix="$dir" --without-cares --without-pam --without-systemd \
                >"$tmp/configure.log" 2>&1 || { tail -20 "$tmp/configure.log" >&2; exit 1; }
            make -j"$(nproc)" >"$tmp/make.log" 2>&1 || { tail -40 "$tmp/make.log" >&2; exit 1; }
            mkdir -p "$dir/bin"
            cp pgbouncer "$dir/bin/pgbouncer.part"
            mv "$dir/bin/pgbouncer.part" "$bin"
        )
        rm -rf "$tmp"
    fi
    flock -u 9
}

case "${1:-}" in
    install) install ;;
    path) install; echo "$bin" ;;
    *)
        echo "usage: scripts/pgbouncer.sh install|path" >&2
        exit 2
        ;;
esac
