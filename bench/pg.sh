# shellcheck shell=bash
# Sourced by bench/run, bench/limitador and bench/ab, after scripts/lib.sh: the
# throwaway PostgreSQL cluster they measure pglimit on, and where the CPU of
# a measurement went (from /proc), so that they all measure alike.
#
#   bench_pg_start DIR [SETTING...]
#                           pg_start (scripts/postgres.sh) into DIR/data,
#                           durable as shipped (fsync, synchronous_commit on),
#                           with pg_stat_statements and the SETTINGs; DIR is
#                           handed to the server's account (PgBouncer writes
#                           its logs there); sets PGDATA, and exports PGHOST,
#                           PGPORT and PGUSER for psql. Stopped at exit by
#                           stop_started.
#   bench_pg_stop           stops it (immediate), e.g. before measuring another
#                           store without it
#   proc_ticks VAR PID [children]
#                           CPU ticks of PID into VAR (see below)
#   cpu_sample PID [STORE]  "<service> <store> <busy> <idle>" ticks so far
#   other_work              names of builds or load generators running here
#   wait_quiet              waits until other_work finds nothing (for a time)
#   bench_blocks DB N       N active admin blocks in pglimit's database DB,
#                           on keys no check uses, analysed: every batch's
#                           blocks probe then reads a populated index
# (as_pg, which runs PgBouncer too, is scripts/postgres.sh's.)

# shellcheck disable=SC2153 # PG_PORT: set by pg_start (scripts/postgres.sh)
bench_pg_start() {
    local dir=$1
    shift
    mkdir -p "$dir"
    if [ "${#AS_PG[@]}" -gt 0 ]; then chown postgres: "$dir"; fi
    PGDATA=$dir/data
    # Durability as shipped (fsync on, synchronous_commit on, logged tables).
    pg_start --log "$dir/postgres.log" "$PGDATA" "max_connections = 200" \
        "shared_preload_libraries = 'pg_stat_statements'" "pg_stat_statements.track = top" \
        "fsync = on" "synchronous_commit = on" "$@"
    PGPORT=$PG_PORT # set by pg_start
    log "PostgreSQL started on 127.0.0.1:$PGPORT"
    export PGHOST=127.0.0.1 PGPORT PGUSER=postgres
}

bench_pg_stop() {
    [ -z "${PGDATA:-}" ] || pg_stop "$PGDATA" immediate
}

# CPU ticks of process PID into the variable VAR: utime + stime, and with
# "children", also cutime + cstime (children it has reaped); 0 when it is gone.
proc_ticks() {
    local var=$1 pid=$2 stat f
    if ! { read -r stat <"/proc/$pid/stat"; } 2>/dev/null; then
        printf -v "$var" 0
        return 0
    fi
    # Fields from the third on (the name, in parentheses, may hold spaces):
    # f[11] to f[14] are fields 14 to 17, utime, stime, cutime, cstime.
    read -ra f <<<"${stat##*) }"
    if [ "${3:-}" = children ]; then
        printf -v "$var" '%d' $((f[11] + f[12] + f[13] + f[14]))
    else
        printf -v "$var" '%d' $((f[11] + f[12]))
    fi
}

# CPU time used so far, in clock ticks: "<service> <store> <busy> <idle>".
# service: the process PID (all its threads). store: with STORE a PostgreSQL
# data directory, its postmaster, the postmaster's live children, and
# (cutime + cstime) the children it has reaped, so backends that come and go
# during a run still count; with STORE a pid (redis-server), that process;
# without, 0. busy/idle: the whole machine, all CPUs, from /proc/stat.
cpu_sample() {
    local pid=$1 store=${2:-} postmaster=0 server pg=0 child ticks _ user nice system idle iowait irq softirq
    proc_ticks server "$pid"
    if [ -d "$store" ]; then
        { read -r postmaster <"$store/postmaster.pid"; } 2>/dev/null || postmaster=0
        if [ "${postmaster:-0}" -gt 0 ] 2>/dev/null; then
            proc_ticks pg "$postmaster" children
            for child in $(pgrep -P "$postmaster" 2>/dev/null); do
                proc_ticks ticks "$child"
                pg=$((pg + ticks))
            done
        fi
    elif [ -n "$store" ]; then
        proc_ticks pg "$store"
    fi
    read -r _ user nice system idle iowait irq softirq _ </proc/stat
    echo "$server $pg $((user + nice + system + irq + softirq)) $((idle + iowait))"
}

# Work of others that would weigh on a measurement (the machine may be
# shared): a build (cargo, rustc, clippy, a C or C++ compiler) or a load
# generator (wrk, pgbench). Prints their names, comma-separated; empty when
# none runs. Called between measurements, when this script's own wrk is done.
other_work() {
    { pgrep -l -x 'cargo|rustc|clippy-driver|cc1|cc1plus|pgbench|wrk' 2>/dev/null || true; } |
        cut -d' ' -f2 | sort -u | paste -sd, -
}

# Waits until other_work finds nothing, for at most BENCH_QUIET_WAIT seconds
# (default 900; then the caller measures anyway and says so).
wait_quiet() {
    local waited=0 other
    while other=$(other_work) && [ -n "$other" ] && [ "$waited" -lt "${BENCH_QUIET_WAIT:-900}" ]; do
        if [ "$waited" = 0 ]; then log "waiting for $other to finish: a measurement beside it would not compare"; fi
        sleep 10
        waited=$((waited + 10))
    done
}

# The keys are 32 bytes like pglimit's, but not HMACs of any key the bench
# checks, so no block changes a decision. The VACUUM ANALYZE is what
# autovacuum would soon do anyway, done before measuring rather than during.
bench_blocks() {
    psql -X -q -v ON_ERROR_STOP=1 -d "$1" \
        -c "INSERT INTO pglimit_blocks (key, until, kind, policy, bucket)
            SELECT decode(md5(i::text) || md5((i + 1)::text), 'hex'), now() + interval '1 day',
                   'admin', 'bench', 'email'
            FROM generate_series(1, $2) i" \
        -c "VACUUM ANALYZE pglimit_blocks" >/dev/null
}
