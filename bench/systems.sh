# shellcheck shell=bash
# Sourced by bench/run, whose settings and functions it uses: each system
# bench/run measures, started, measured in its scenarios and stopped, in the
# order the run takes them (bench/README.md says what each is).

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

# The HTTP ceiling: JSON in, a fixed body out, no store.
measure_ceiling() {
    local c
    free_port port
    start "$WORK/ceiling.log" "$CEILING_BIN" "127.0.0.1:$port"
    CEILING_PID=$STARTED
    wait_http "http://127.0.0.1:$port/" "$CEILING_PID" "$WORK/ceiling.log"
    for c in $CONCURRENCY; do
        run_wrk ceiling allow-random "$c" "http://127.0.0.1:$port" 200
    done
    stop "$CEILING_PID"
}

# PGLIMIT_METRICS is set either way, so that one in the environment cannot
# turn the metrics off (or on) behind the report's back; PGLIMIT_POLICIES too.
# Only this instance serves gRPC: the proxy scenarios are measured on it, right
# after /check's policy form, against which the report sets them.
measure_pglimit() {
    local grpc_port slow_env scenario c
    free_port port
    free_port grpc_port
    GRPC_ADDR=127.0.0.1:$grpc_port
    slow_env=() # BENCH_SLOW: a log big enough for 0.1% of a measurement
    if [ "$SLOW" = 1 ]; then slow_env=(PGLIMIT_SLOW_CHECKS="$SLOW_CAPACITY"); fi
    start "$WORK/pglimit.log" env DATABASE_URL="$DATABASE_URL" PGLIMIT_KEY_SECRET="$SECRET" \
        PGLIMIT_BIND="127.0.0.1:$port" PGLIMIT_GRPC_BIND="$GRPC_ADDR" PGLIMIT_METRICS=true \
        PGLIMIT_POLICIES="$POLICIES" RUST_LOG="${RUST_LOG:-info,sqlx=warn}" "${slow_env[@]}" "$PGLIMIT_BIN"
    PGLIMIT_PID=$STARTED
    wait_http "http://127.0.0.1:$port/healthz" "$PGLIMIT_PID" "$WORK/pglimit.log"
    prefill_deny "http://127.0.0.1:$port"
    for c in $CONCURRENCY; do
        for scenario in allow-random allow-hot allow-policy allow-auth allow-grpc; do
            run_wrk pglimit "$scenario" "$c" "http://127.0.0.1:$port" 200
        done
        run_wrk pglimit deny "$c" "http://127.0.0.1:$port" 429
    done
    # The curve first, on the state the allow-random points above left; then the
    # policies and algorithms, whose rows would otherwise weigh on it.
    run_curve pglimit "http://127.0.0.1:$port"
    run_policy_scenarios pglimit "http://127.0.0.1:$port"
    run_deny_resets pglimit "http://127.0.0.1:$port"
    PGLIMIT_RSS=$(peak_rss_kib "$PGLIMIT_PID")
    PGLIMIT_READY=$(curl -s "http://127.0.0.1:$port/readyz" || true)
    PGLIMIT_METRICS_STATUS=$(metrics_status "http://127.0.0.1:$port")
    PGLIMIT_BLOCKS=$(active_blocks bench)
    PGLIMIT_OVERRIDE_PROBE=$(override_probe "http://127.0.0.1:$port")
    stop "$PGLIMIT_PID"
    PGLIMIT_WARNINGS=$(log_warnings "$WORK/pglimit.log")
}

# The same binary with the metrics recorder off, right after pglimit (and
# before the baseline), so "× metrics off" is what the metrics cost in this
# run. Its database (nometrics) is as fresh as bench was for pglimit.
measure_nometrics() {
    local scenario c
    free_port port
    start "$WORK/nometrics.log" env DATABASE_URL="$NOMETRICS_URL" PGLIMIT_KEY_SECRET="$SECRET" \
        PGLIMIT_BIND="127.0.0.1:$port" PGLIMIT_METRICS=false PGLIMIT_POLICIES="$POLICIES" \
        RUST_LOG="${RUST_LOG:-info,sqlx=warn}" "$PGLIMIT_BIN"
    NOMETRICS_PID=$STARTED
    wait_http "http://127.0.0.1:$port/healthz" "$NOMETRICS_PID" "$WORK/nometrics.log"
    prefill_deny "http://127.0.0.1:$port"
    STATS_DB=nometrics
    for c in $CONCURRENCY; do
        for scenario in allow-random allow-hot allow-policy; do
            run_wrk pglimit-nometrics "$scenario" "$c" "http://127.0.0.1:$port" 200
        done
        run_wrk pglimit-nometrics deny "$c" "http://127.0.0.1:$port" 429
    done
    # Of the policy and algorithm scenarios, only the login policy: a full set
    # would add as much again to the run for a figure (the metrics' cost) the
    # others show.
    run_policy_scenarios pglimit-nometrics "http://127.0.0.1:$port" allow-login
    STATS_DB=bench
    NOMETRICS_RSS=$(peak_rss_kib "$NOMETRICS_PID")
    NOMETRICS_METRICS_STATUS=$(metrics_status "http://127.0.0.1:$port")
    stop "$NOMETRICS_PID"
    NOMETRICS_WARNINGS=$(log_warnings "$WORK/nometrics.log")
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
    local scenario c
    free_port port
    start "$WORK/actions.log" env DATABASE_URL="$ACTIONS_URL" PGLIMIT_KEY_SECRET="$SECRET" \
        PGLIMIT_BIND="127.0.0.1:$port" PGLIMIT_METRICS=true PGLIMIT_POLICIES="$ACTIONS_POLICIES" \
        RUST_LOG="${RUST_LOG:-info,sqlx=warn}" "$PGLIMIT_BIN"
    ACTIONS_PID=$STARTED
    wait_http "http://127.0.0.1:$port/healthz" "$ACTIONS_PID" "$WORK/actions.log"
    bench_blocks actions "$ACTION_BLOCKS"
    prefill_deny "http://127.0.0.1:$port"
    STATS_DB=actions
    for c in $CONCURRENCY; do
        for scenario in allow-random allow-policy; do
            run_wrk pglimit-actions "$scenario" "$c" "http://127.0.0.1:$port" 200
        done
        run_wrk pglimit-actions deny "$c" "http://127.0.0.1:$port" 429
    done
    STATS_DB=bench
    ACTIONS_RSS=$(peak_rss_kib "$ACTIONS_PID")
    ACTIONS_METRICS_STATUS=$(metrics_status "http://127.0.0.1:$port")
    ACTIONS_BLOCKS=$(active_blocks actions)
    ACTIONS_OVERRIDE_PROBE=$(override_probe "http://127.0.0.1:$port")
    stop "$ACTIONS_PID"
    ACTIONS_WARNINGS=$(log_warnings "$WORK/actions.log")
}

# pglimit behind Debian's PgBouncer, in session and in transaction mode
# (PGLIMIT_DB_POOLER), after its other runs: the same binary and settings as
# pglimit, each mode in a database of its own prefilled the same way, in
# POOLER_SCENARIOS; the report sets them against pglimit's direct figures.
# PgBouncer's own CPU is not in the CPU columns (the server under
# measurement is pglimit).
measure_poolers() {
    local pool_mode bouncer_port ini c
    for pool_mode in session transaction; do
        DB=postgres sql "CREATE DATABASE pooled_$pool_mode"
        free_port bouncer_port
        ini=$PGDIR/pgbouncer-$pool_mode.ini
        printf '%s\n' "[databases]" "* = host=127.0.0.1 port=$PGPORT user=postgres" "[pgbouncer]" \
            "listen_addr = 127.0.0.1" "listen_port = $bouncer_port" "unix_socket_dir =" "auth_type = any" \
            "pool_mode = $pool_mode" "default_pool_size = 20" "max_client_conn = 200" \
            "ignore_startup_parameters = extra_float_digits" "logfile = $PGDIR/pgbouncer-$pool_mode.log" >"$ini"
        # PgBouncer refuses to run as root, as PostgreSQL does (runuser passes on the TERM of `stop`).
        if [ "$(id -u)" -eq 0 ]; then
            start "$WORK/pgbouncer-$pool_mode.out" runuser -u postgres -- "$PGBOUNCER" "$ini"
        else
            start "$WORK/pgbouncer-$pool_mode.out" "$PGBOUNCER" "$ini"
        fi
        BOUNCER_PID=$STARTED
        wait_tcp "$bouncer_port" "$BOUNCER_PID" "$PGDIR/pgbouncer-$pool_mode.log"
        free_port port
        start "$WORK/pooled-$pool_mode.log" env \
            DATABASE_URL="postgres://postgres@127.0.0.1:$bouncer_port/pooled_$pool_mode" PGLIMIT_DB_POOLER=$pool_mode \
            PGLIMIT_KEY_SECRET="$SECRET" PGLIMIT_BIND="127.0.0.1:$port" PGLIMIT_POLICIES="$POLICIES" \
            RUST_LOG="${RUST_LOG:-info,sqlx=warn}" "$PGLIMIT_BIN"
        POOLED_PID=$STARTED
        wait_http "http://127.0.0.1:$port/healthz" "$POOLED_PID" "$WORK/pooled-$pool_mode.log"
        prefill_deny "http://127.0.0.1:$port"
        STATS_DB=pooled_$pool_mode
        for c in $CONCURRENCY; do
            run_wrk "pglimit-$pool_mode" allow-random "$c" "http://127.0.0.1:$port" 200
            run_wrk "pglimit-$pool_mode" deny "$c" "http://127.0.0.1:$port" 429
        done
        run_policy_scenarios "pglimit-$pool_mode" "http://127.0.0.1:$port" allow-login
        STATS_DB=bench
        stop "$POOLED_PID"
        stop "$BOUNCER_PID"
    done
}

# Right after the current pglimit (and its metrics-off and actions runs), so
# both see the machine in the same state.
measure_baseline() {
    local scenario c
    BASELINE_RSS=0
    if [ -n "$BASELINE_REV" ]; then
        free_port port
        start "$WORK/baseline.log" env DATABASE_URL="$BASELINE_URL" PGLIMIT_KEY_SECRET="$SECRET" \
            PGLIMIT_BIND="127.0.0.1:$port" PGLIMIT_POLICIES="$BASELINE_POLICIES" \
            RUST_LOG="${RUST_LOG:-info,sqlx=warn}" "$BASELINE_BIN"
        BASELINE_PID=$STARTED
        wait_http "http://127.0.0.1:$port/healthz" "$BASELINE_PID" "$WORK/baseline.log"
        prefill_deny "http://127.0.0.1:$port"
        STATS_DB=baseline
        for c in $CONCURRENCY; do
            for scenario in allow-random allow-hot allow-policy; do
                run_wrk baseline "$scenario" "$c" "http://127.0.0.1:$port" 200
            done
            run_wrk baseline deny "$c" "http://127.0.0.1:$port" 429
        done
        run_policy_scenarios baseline "http://127.0.0.1:$port"
        run_deny_resets baseline "http://127.0.0.1:$port"
        STATS_DB=bench
        BASELINE_RSS=$(peak_rss_kib "$BASELINE_PID")
        stop "$BASELINE_PID"
    fi
}

# rate-limiter-flexible, as shipped and with inMemoryBlockOnConsumed.
measure_rlflex() {
    local scenario c
    free_port port
    start "$WORK/rlflex.log" env DATABASE_URL="$DATABASE_URL" PEER_BIND="127.0.0.1:$port" \
        node bench/peer-rlflex/server.js
    RLFLEX_PID=$STARTED
    wait_http "http://127.0.0.1:$port/healthz" "$RLFLEX_PID" "$WORK/rlflex.log"
    prefill_deny "http://127.0.0.1:$port"
    for c in $CONCURRENCY; do
        for scenario in allow-random allow-hot; do
            run_wrk rlflex "$scenario" "$c" "http://127.0.0.1:$port" 200
        done
        run_wrk rlflex deny "$c" "http://127.0.0.1:$port" 429
    done
    run_curve rlflex "http://127.0.0.1:$port"
    RLFLEX_RSS=$(peak_rss_kib "$RLFLEX_PID")
    stop "$RLFLEX_PID"


    free_port port
    start "$WORK/rlflex-block.log" env DATABASE_URL="$DATABASE_URL" PEER_BIND="127.0.0.1:$port" \
        PEER_INMEMORY_BLOCK=1 node bench/peer-rlflex/server.js
    RLFLEX_BLOCK_PID=$STARTED
    wait_http "http://127.0.0.1:$port/healthz" "$RLFLEX_BLOCK_PID" "$WORK/rlflex-block.log"
    prefill_deny "http://127.0.0.1:$port"
    for c in $CONCURRENCY; do
        run_wrk rlflex deny-inmemory-block "$c" "http://127.0.0.1:$port" 429
    done
    stop "$RLFLEX_BLOCK_PID"
}

# runlimit-postgres, in a database of its own.
measure_runlimit() {
    local scenario c
    free_port port
    start "$WORK/runlimit.log" env DATABASE_URL="$RUNLIMIT_URL" PEER_BIND="127.0.0.1:$port" \
        PEER_KEY_SECRET="$SECRET" "$RUNLIMIT_BIN"
    RUNLIMIT_PID=$STARTED
    wait_http "http://127.0.0.1:$port/healthz" "$RUNLIMIT_PID" "$WORK/runlimit.log"
    prefill_deny "http://127.0.0.1:$port"
    STATS_DB=runlimit
    for c in $CONCURRENCY; do
        for scenario in allow-random allow-hot; do
            run_wrk runlimit "$scenario" "$c" "http://127.0.0.1:$port" 200
        done
        run_wrk runlimit deny "$c" "http://127.0.0.1:$port" 429
    done
    STATS_DB=bench
    RUNLIMIT_RSS=$(peak_rss_kib "$RUNLIMIT_PID")
    stop "$RUNLIMIT_PID"
}
