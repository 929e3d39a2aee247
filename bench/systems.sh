# shellcheck shell=bash
# Sourced by bench/run, whose settings and functions it uses: each system
# bench/run measures, started, measured in its scenarios and stopped, in the
# order the run takes them (bench/README.md says what each is).

# Starts the server of NAME (the command after PATH, logging to
# $WORK/NAME.log), which listens on $port, and waits until PATH answers
# there. Its pid goes to SERVER_PID, its address to SERVER_URL.
serve() {
    local name=$1 path=$2
    shift 2
    start "$WORK/$name.log" "$@"
    SERVER_PID=$STARTED SERVER_URL=http://127.0.0.1:$port
    wait_http "$SERVER_URL$path" "$SERVER_PID" "$WORK/$name.log"
}

# SYSTEM on the server just served: its deny keys put over their limit, then
# at each client count the allow SCENARIOS and the deny flood.
measure_http() {
    local system=$1 scenarios=$2 url=$SERVER_URL c s
    prefill_deny "$url"
    for c in $CONCURRENCY; do
        for s in $scenarios; do
            run_wrk "$system" "$s" "$c" "$url" 200
        done
        run_wrk "$system" deny "$c" "$url" 429
    done
}

# raw-pg: the reference upserts under pgbench, and its curve.
measure_raw_pg() {
    local c
    for c in $CONCURRENCY; do
        run_pgbench allow-random "$RANDOM_KEYS" "$c"
        run_pgbench allow-hot 1 "$c"
    done
    run_curve raw-pg
    for c in $CONCURRENCY; do
        run_pgbench allow-login 0 "$c"
    done
}

# pglimit.check from SQL under pgbench, right after raw Postgres and with its
# settings (clients, threads, seconds, -M prepared, random keys): the
# one-bucket policy bench_one on raw's 10,000 keys, then the login policy on
# raw's login identities, in a database of its own ($SQL_DB) into which
# `pglimit policies push` wrote the policies (the pushed file: bench/policies.toml,
# then bench/policies-sql.toml) and the key secret, as a user without the
# service would. Each measurement is followed by a check that must be admitted.
measure_sql() {
    local c scenario pushed
    pushed=$(env DATABASE_URL="$SQL_URL" PGLIMIT_KEY_SECRET="$SECRET" RUST_LOG=warn \
        "$PGLIMIT_BIN" policies push "$SQL_POLICIES" 2>&1) || die "pglimit policies push failed: $pushed"
    log "$pushed"
    STATS_DB=$SQL_DB
    for c in $CONCURRENCY; do
        for scenario in allow-random allow-login; do
            run_pgbench "$scenario" "$RANDOM_KEYS" "$c" pglimit-sql
            sql_probe "$scenario"
        done
    done
    STATS_DB=bench
}

# After a pglimit-sql measurement of SCENARIO: one more check of its shape
# (the login policy's on an identity of its own) must be admitted.
sql_probe() {
    local call="'bench_one', '{\"key\": \"1\"}'" allowed
    if [ "$1" = allow-login ]; then
        call="'login', '{\"email\": \"probe$SEQ@example.org\", \"ip\": \"198.18.0.1\"}'"
    fi
    allowed=$(DB=$SQL_DB sql "SELECT allowed FROM pglimit.check($call)") ||
        die "pglimit-sql $1: the probe failed"
    [ "$allowed" = t ] || die "pglimit-sql $1: the probe was not admitted (allowed: $allowed)"
}

# The HTTP ceiling: JSON in, a fixed body out, no store.
measure_ceiling() {
    local c
    free_port port
    serve ceiling / "$CEILING_BIN" "127.0.0.1:$port"
    for c in $CONCURRENCY; do
        run_wrk ceiling allow-random "$c" "$SERVER_URL" 200
    done
    stop "$SERVER_PID"
}

# pglimit's environment in bench/run: its database URL, $port, the bench's
# key secret and log level; the caller adds the rest.
pglimit_env() {
    PGLIMIT_ENV=(DATABASE_URL="$1" PGLIMIT_KEY_SECRET="$SECRET" PGLIMIT_BIND="127.0.0.1:$port"
        RUST_LOG="${RUST_LOG:-info,sqlx=warn}")
}

# PGLIMIT_METRICS is set either way, so that one in the environment cannot
# turn the metrics off (or on) behind the report's back; PGLIMIT_POLICIES and
# PGLIMIT_TOP too.
# Only this instance serves gRPC: the proxy scenarios are measured on it, right
# after /check's policy form, against which the report sets them.
measure_pglimit() {
    local grpc_port slow_env
    free_port port
    free_port grpc_port
    GRPC_ADDR=127.0.0.1:$grpc_port
    slow_env=() # BENCH_SLOW: a log big enough for 0.1% of a measurement
    if [ "$SLOW" = 1 ]; then slow_env=(PGLIMIT_SLOW_CHECKS="$SLOW_CAPACITY"); fi
    pglimit_env "$DATABASE_URL"
    serve pglimit /healthz env "${PGLIMIT_ENV[@]}" PGLIMIT_GRPC_BIND="$GRPC_ADDR" PGLIMIT_METRICS=true \
        PGLIMIT_TOP=on PGLIMIT_POLICIES="$POLICIES" "${slow_env[@]}" "$PGLIMIT_BIN"
    measure_http pglimit "allow-random allow-hot allow-policy allow-auth allow-grpc"
    # The curve first, on the state the allow-random points above left; then the
    # policies and algorithms, whose rows would otherwise weigh on it.
    run_curve pglimit "$SERVER_URL"
    run_policy_scenarios pglimit "$SERVER_URL"
    run_deny_resets pglimit "$SERVER_URL"
    PGLIMIT_RSS=$(peak_rss_kib "$SERVER_PID")
    PGLIMIT_READY=$(curl -s "$SERVER_URL/readyz" || true)
    PGLIMIT_METRICS_STATUS=$(metrics_status "$SERVER_URL")
    PGLIMIT_BLOCKS=$(active_blocks bench)
    PGLIMIT_OVERRIDE_PROBE=$(override_probe "$SERVER_URL")
    stop "$SERVER_PID"
    PGLIMIT_WARNINGS=$(log_warnings "$WORK/pglimit.log")
}

# The same binary with the metrics recorder off, right after pglimit (and
# before the baseline), so "× metrics off" is what the metrics cost in this
# run. Its database (nometrics) is as fresh as bench was for pglimit.
measure_nometrics() {
    free_port port
    pglimit_env "$NOMETRICS_URL"
    serve nometrics /healthz env "${PGLIMIT_ENV[@]}" PGLIMIT_METRICS=false PGLIMIT_POLICIES="$POLICIES" \
        "$PGLIMIT_BIN"
    STATS_DB=nometrics
    measure_http pglimit-nometrics "allow-random allow-hot allow-policy"
    # Of the policy and algorithm scenarios, only the login policy: a full set
    # would add as much again to the run for a figure (the metrics' cost) the
    # others show.
    run_policy_scenarios pglimit-nometrics "$SERVER_URL" allow-login
    STATS_DB=bench
    NOMETRICS_RSS=$(peak_rss_kib "$SERVER_PID")
    NOMETRICS_METRICS_STATUS=$(metrics_status "$SERVER_URL")
    stop "$SERVER_PID"
    NOMETRICS_WARNINGS=$(log_warnings "$WORK/nometrics.log")
}

# The same binary with PGLIMIT_TOP=off (no denial counted for GET /admin/top),
# right after pglimit's metrics-off run, on the deny flood only: its row beside
# pglimit's (PGLIMIT_TOP=on, set explicitly there) is what counting denials
# costs on the deny path (its budget: 5%). Its database (notop) is as fresh as
# bench was for pglimit.
measure_notop() {
    free_port port
    pglimit_env "$NOTOP_URL"
    serve notop /healthz env "${PGLIMIT_ENV[@]}" PGLIMIT_TOP=off PGLIMIT_METRICS=true \
        PGLIMIT_POLICIES="$POLICIES" "$PGLIMIT_BIN"
    STATS_DB=notop
    measure_http pglimit-notop ""
    STATS_DB=bench
    stop "$SERVER_PID"
    NOTOP_WARNINGS=$(log_warnings "$WORK/notop.log")
}

# pglimit with blocks and overrides configured (their budget: the allow path
# may cost no more than 5% for them), right after pglimit and its metrics-off run:
# the same binary and settings but bench/policies-actions.toml (the same
# `bench` policy plus three overrides that never match the bench's
# identifiers) and ACTION_BLOCKS active admin blocks on random 32-byte keys
# (the bench's keys are HMACs, so none of them), inserted once the instance
# has migrated its database. Every check then looks blocks up and (policy
# form) tries the overrides, and none changes a decision.
measure_actions() {
    free_port port
    pglimit_env "$ACTIONS_URL"
    serve actions /healthz env "${PGLIMIT_ENV[@]}" PGLIMIT_METRICS=true PGLIMIT_POLICIES="$ACTIONS_POLICIES" \
        "$PGLIMIT_BIN"
    bench_blocks actions "$ACTION_BLOCKS"
    STATS_DB=actions
    measure_http pglimit-actions "allow-random allow-policy"
    STATS_DB=bench
    ACTIONS_RSS=$(peak_rss_kib "$SERVER_PID")
    ACTIONS_METRICS_STATUS=$(metrics_status "$SERVER_URL")
    ACTIONS_BLOCKS=$(active_blocks actions)
    ACTIONS_OVERRIDE_PROBE=$(override_probe "$SERVER_URL")
    stop "$SERVER_PID"
    ACTIONS_WARNINGS=$(log_warnings "$WORK/actions.log")
}

# pglimit behind Debian's PgBouncer, in session and in transaction mode
# (PGLIMIT_DB_POOLER), after its other runs: the same binary and settings as
# pglimit, each mode in a database of its own prefilled the same way; the
# report sets them against pglimit's direct figures. PgBouncer's own CPU is
# not in the CPU columns (the server under measurement is pglimit).
measure_poolers() {
    local pool_mode bouncer_port bouncer_pid
    for pool_mode in session transaction; do
        DB=postgres sql "CREATE DATABASE pooled_$pool_mode"
        free_port bouncer_port
        start_pgbouncer "$pool_mode" "$bouncer_port"
        bouncer_pid=$STARTED
        free_port port
        pglimit_env "postgres://postgres@127.0.0.1:$bouncer_port/pooled_$pool_mode"
        serve "pooled-$pool_mode" /healthz env "${PGLIMIT_ENV[@]}" PGLIMIT_DB_POOLER=$pool_mode \
            PGLIMIT_POLICIES="$POLICIES" "$PGLIMIT_BIN"
        STATS_DB=pooled_$pool_mode
        measure_http "pglimit-$pool_mode" allow-random
        run_policy_scenarios "pglimit-$pool_mode" "$SERVER_URL" allow-login
        STATS_DB=bench
        stop "$SERVER_PID"
        stop "$bouncer_pid"
    done
}

# Starts Debian's PgBouncer in POOL_MODE on PORT, in front of the bench's
# PostgreSQL, and waits until it listens; its pid is in STARTED.
start_pgbouncer() {
    local pool_mode=$1 bouncer_port=$2 ini=$PGDIR/pgbouncer-$1.ini
    printf '%s\n' "[databases]" "* = host=127.0.0.1 port=$PGPORT user=postgres" "[pgbouncer]" \
        "listen_addr = 127.0.0.1" "listen_port = $bouncer_port" "unix_socket_dir =" "auth_type = any" \
        "pool_mode = $pool_mode" "default_pool_size = 20" "max_client_conn = 200" \
        "ignore_startup_parameters = extra_float_digits" "logfile = $PGDIR/pgbouncer-$pool_mode.log" >"$ini"
    # PgBouncer refuses to run as root, as PostgreSQL does: AS_PG (scripts/postgres.sh) is
    # `runuser -u postgres --` then, which passes on the TERM of `stop`.
    start "$WORK/pgbouncer-$pool_mode.out" "${AS_PG[@]}" "$PGBOUNCER" "$ini"
    wait_tcp "$bouncer_port" "$STARTED" "$PGDIR/pgbouncer-$pool_mode.log"
}

# Right after the current pglimit (and its metrics-off and actions runs), so
# both see the machine in the same state.
measure_baseline() {
    BASELINE_RSS=0
    [ -n "$BASELINE_REV" ] || return 0
    free_port port
    pglimit_env "$BASELINE_URL"
    serve baseline /healthz env "${PGLIMIT_ENV[@]}" PGLIMIT_POLICIES="$BASELINE_POLICIES" "$BASELINE_BIN"
    STATS_DB=baseline
    measure_http baseline "allow-random allow-hot allow-policy"
    run_policy_scenarios baseline "$SERVER_URL"
    run_deny_resets baseline "$SERVER_URL"
    STATS_DB=bench
    BASELINE_RSS=$(peak_rss_kib "$SERVER_PID")
    stop "$SERVER_PID"
}

# rate-limiter-flexible, as shipped and with inMemoryBlockOnConsumed.
measure_rlflex() {
    local c
    free_port port
    serve rlflex /healthz env DATABASE_URL="$DATABASE_URL" PEER_BIND="127.0.0.1:$port" \
        node bench/peer-rlflex/server.js
    measure_http rlflex "allow-random allow-hot"
    run_curve rlflex "$SERVER_URL"
    RLFLEX_RSS=$(peak_rss_kib "$SERVER_PID")
    stop "$SERVER_PID"

    free_port port
    serve rlflex-block /healthz env DATABASE_URL="$DATABASE_URL" PEER_BIND="127.0.0.1:$port" \
        PEER_INMEMORY_BLOCK=1 node bench/peer-rlflex/server.js
    prefill_deny "$SERVER_URL"
    for c in $CONCURRENCY; do
        run_wrk rlflex deny-inmemory-block "$c" "$SERVER_URL" 429
    done
    stop "$SERVER_PID"
}

# runlimit-postgres, in a database of its own.
measure_runlimit() {
    free_port port
    serve runlimit /healthz env DATABASE_URL="$RUNLIMIT_URL" PEER_BIND="127.0.0.1:$port" \
        PEER_KEY_SECRET="$SECRET" "$RUNLIMIT_BIN"
    STATS_DB=runlimit
    measure_http runlimit "allow-random allow-hot"
    STATS_DB=bench
    RUNLIMIT_RSS=$(peak_rss_kib "$SERVER_PID")
    stop "$SERVER_PID"
}

# The seed service (bench/peer-seed/) in its database: the main table's
# scenarios, then the curve.
measure_seed() {
    free_port port
    serve seed /healthz env DATABASE_URL="$SEED_URL" PEER_BIND="127.0.0.1:$port" "$SEED_BIN"
    STATS_DB=seed
    measure_http seed "allow-random allow-hot"
    run_curve seed "$SERVER_URL"
    STATS_DB=bench
    SEED_RSS=$(peak_rss_kib "$SERVER_PID")
    stop "$SERVER_PID"
}
