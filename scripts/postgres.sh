# shellcheck shell=bash
# Throwaway PostgreSQL clusters for the scripts: the one way a script makes
# and starts one (bench/run, bench/limitador, bench/ab through bench/pg.sh;
# scripts/citus for each Citus node). Sourced by scripts/lib.sh, whose
# helpers it uses (die, log, free_port); source lib.sh, not this file.
# (The Rust side, the binary's private cluster and the tests' clusters, is
# src/pg_cluster/; the container's PostgreSQL has an entrypoint of its own,
# scripts/container-postgres-entrypoint, which says why.)
#
#   as_pg CMD...       CMD as the account that runs the server: `postgres`
#                      when root (PostgreSQL refuses to run as root), else
#                      this one. AS_PG is that prefix as an array (empty
#                      unless root), for `start` (lib.sh), whose pid must be
#                      the command's and not a function's subshell.
#   pg_start [OPTION...] DATADIR [SETTING...]
#                      pg_init, then pg_run: a new cluster in DATADIR (made;
#                      must be empty), on 127.0.0.1 at a free port, started;
#                      sets PG_PORT. Stopped (immediate) by stop_started, so
#                      by the EXIT trap of every script that calls that,
#                      unless --keep.
#   pg_init [OPTION...] DATADIR [SETTING...]
#                      initdb (UTF8, C.UTF-8) into DATADIR, owned by the
#                      server's account, with listen_addresses = 127.0.0.1,
#                      port = a free port (into PG_PORT), its Unix socket in
#                      DATADIR, then each SETTING, a postgresql.conf line
#                      ("fsync = off", "shared_preload_libraries = 'citus'")
#   pg_run [OPTION...] DATADIR
#                      pg_ctl start -w (60 s) of a cluster pg_init made, again
#                      after pg_stop too (same port and settings); on failure
#                      shows the server log and dies
#   pg_stop DATADIR [fast|immediate]
#                      stops it (default fast) and waits; nothing when it is
#                      not running. Returns 1, saying so, if it outlives 60 s.
#   pg_stop_started    pg_stop immediate of every cluster pg_run started
#                      without --keep (stop_started calls it)
#
# Options (each ignored where it does not apply):
#   --bin DIR              the server binaries (default: initdb's on PATH,
#                          else scripts/lib.sh's pg_server_bin)
#   --superuser NAME       initdb -U (default postgres)
#   --password-file FILE   the superuser's password: scram-sha-256 over TCP,
#                          trust on the socket (default: trust on both); FILE
#                          must be readable by the server's account
#   --log FILE             the server log (default DATADIR/server.log)
#   --env VAR=VALUE        in the server's environment (repeatable)
#   --keep                 not stopped by pg_stop_started: the cluster outlives
#                          the script (scripts/citus start)

if [ "$(id -u)" -eq 0 ]; then AS_PG=(runuser -u postgres --); else AS_PG=(); fi

as_pg() {
    if [ "${#AS_PG[@]}" -gt 0 ] && ! id postgres >/dev/null 2>&1; then
        die "running as root needs a 'postgres' account to run PostgreSQL (and PgBouncer) as"
    fi
    "${AS_PG[@]}" "$@"
}

# Parses the options above into the caller's locals (bin superuser pwfile
# log keep envs rest), which it must declare; rest gets the arguments after.
lib_pg_options() {
    local initdb
    bin="" superuser=postgres pwfile="" log="" keep=0 envs=() rest=()
    while [ $# -gt 0 ]; do
        case $1 in
            --bin | --superuser | --password-file | --log | --env)
                [ $# -ge 2 ] || die "pg_start: $1 needs a value"
                case $1 in
                    --bin) bin=$2 ;;
                    --superuser) superuser=$2 ;;
                    --password-file) pwfile=$2 ;;
                    --log) log=$2 ;;
                    --env) envs+=("$2") ;;
                esac
                shift 2
                ;;
            --keep) keep=1 && shift ;;
            --) shift && break ;;
            -*) die "pg_start: unknown option $1" ;;
            *) break ;;
        esac
    done
    rest=("$@")
    if [ -z "$bin" ]; then
        if initdb=$(command -v initdb 2>/dev/null); then
            bin=$(dirname "$initdb")
        else
            # shellcheck disable=SC2119 # never installs: a caller that may install says so itself
            bin=$(pg_server_bin) || die "PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql"
        fi
    fi
    if [ ! -x "$bin/initdb" ] || [ ! -x "$bin/pg_ctl" ]; then die "no initdb and pg_ctl in $bin"; fi
}

pg_init() {
    local bin superuser pwfile log keep envs rest data out auth setting
    lib_pg_options "$@"
    [ "${#rest[@]}" -ge 1 ] || die "usage: pg_init [OPTION...] DATADIR [SETTING...]"
    data=${rest[0]}
    mkdir -p "$data" || die "cannot make $data"
    data=$(cd "$data" && pwd)
    [ -z "$(ls -A "$data")" ] || die "pg_init: $data is not empty (a throwaway cluster goes into a new directory)"
    # The socket's path must fit in sun_path (107 bytes).
    [ "${#data}" -le 90 ] || die "pg_init: $data is too long a path for the cluster's Unix socket (at most 90 characters)"
    if [ "${#AS_PG[@]}" -gt 0 ]; then chown postgres: "$data" || die "cannot hand $data to postgres"; fi
    chmod 700 "$data"
    auth=(-A trust)
    if [ -n "$pwfile" ]; then auth=(--pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256); fi
    free_port PG_PORT
    out=$(as_pg "$bin/initdb" -D "$data" -U "$superuser" "${auth[@]}" -E UTF8 --locale=C.UTF-8 2>&1) ||
        { printf '%s\n' "$out" >&2; die "initdb into $data failed (its output above)"; }
    {
        printf '\n# A throwaway cluster (scripts/postgres.sh): loopback only, a free port.\n'
        printf "listen_addresses = '127.0.0.1'\nport = %s\nunix_socket_directories = '%s'\n" "$PG_PORT" "$data"
        for setting in "${rest[@]:1}"; do printf '%s\n' "$setting"; done
    } >>"$data/postgresql.conf" || die "cannot write $data/postgresql.conf"
}

PG_RUNNING=()
pg_run() {
    local bin superuser pwfile log keep envs rest data
    lib_pg_options "$@"
    [ "${#rest[@]}" -eq 1 ] || die "usage: pg_run [OPTION...] DATADIR"
    data=${rest[0]}
    [ -f "$data/PG_VERSION" ] || die "pg_run: no cluster in $data (pg_init makes one)"
    data=$(cd "$data" && pwd)
    : "${log:=$data/server.log}"
    # pg_ctl opens the log as the server's account.
    touch "$log" || die "cannot create $log"
    if [ "${#AS_PG[@]}" -gt 0 ]; then chown postgres: "$log"; fi
    if ! as_pg env "${envs[@]}" "$bin/pg_ctl" start -w -t 60 -D "$data" -l "$log" >/dev/null; then
        tail -n 30 "$log" >&2
        die "PostgreSQL in $data did not start (the end of $log above)"
    fi
    if [ "$keep" = 0 ]; then PG_RUNNING+=("$data"); fi
}

pg_start() {
    pg_init "$@"
    lib_pg_run_of "$@"
}

# Calls pg_run with pg_start's options and its DATADIR, without the settings.
lib_pg_run_of() {
    local opts=()
    while [ $# -gt 0 ]; do
        case $1 in
            --bin | --superuser | --password-file | --log | --env) opts+=("$1" "$2") && shift 2 ;;
            --keep) opts+=("$1") && shift ;;
            --) shift && break ;;
            *) break ;;
        esac
    done
    pg_run "${opts[@]}" "$1"
}

pg_stop() {
    local data=$1 mode=${2:-fast} pid signal _
    case $mode in
        fast) signal=INT ;;
        immediate) signal=QUIT ;;
        *) die "pg_stop: fast or immediate, not $mode" ;;
    esac
    # The postmaster's pid is the first line of postmaster.pid; a signal is
    # what pg_ctl stop sends, and root may send it to `postgres`'s process.
    { read -r pid <"$data/postmaster.pid"; } 2>/dev/null || return 0
    [[ $pid =~ ^[0-9]+$ ]] || return 0
    kill -"$signal" "$pid" 2>/dev/null || return 0
    for _ in $(seq 600); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    say "PostgreSQL in $data (pid $pid) still runs 60 s after a $mode stop"
    return 1
}

pg_stop_started() {
    local data status=0
    for data in "${PG_RUNNING[@]}"; do
        pg_stop "$data" immediate || status=1
    done
    PG_RUNNING=()
    return "$status"
}
