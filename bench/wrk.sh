# shellcheck shell=bash
# Sourced by bench/run, whose settings and functions it uses: one
# measurement (pgbench or wrk/grpc-load, with its CPU, statements and
# probe) and what is read off a server around its measurements.

SEQ=0
# Makes the result directory of the next measurement and leaves it in $DIR.
result_dir() {
    SEQ=$((SEQ + 1))
    DIR=$WORK/results/$(printf '%02d' "$SEQ")
    mkdir -p "$DIR"
    printf 'system=%s\nscenario=%s\nconcurrency=%s\n' "$1" "$2" "$3" >"$DIR/meta"
}

# pgbench SCENARIO NKEYS CONC [SYSTEM]: raw-pg (the default), the reference
# upsert (allow-login: the login policy's three, bench/pgbench/login.sql) in
# database bench; pglimit-sql, pglimit.check (bench/pgbench/check.sql and
# check-login.sql) in database $SQL_DB. The same pgbench settings for both.
run_pgbench() {
    local scenario=$1 nkeys=$2 conc=$3 system=${4:-raw-pg} db=bench dir script
    if [ "$system" = pglimit-sql ]; then db=$SQL_DB; fi
    result_dir "$system" "$scenario" "$conc"
    dir=$DIR
    log "$system $scenario c=$conc"
    read -ra script <<<"$(pgbench_script_args "$scenario" "$nkeys" "$system")"
    local args=(-n -M prepared -c "$conc" -j "$(threads_for "$conc")" "${script[@]}")
    if [ "$WARMUP" -gt 0 ]; then pgbench "${args[@]}" -T "$WARMUP" "$db" >/dev/null 2>&1; fi
    stats_reset
    pgbench "${args[@]}" -T "$SECS" -l --log-prefix="$dir/txlog" "$db" >"$dir/pgbench.out" 2>&1 ||
        { cat "$dir/pgbench.out" >&2; die "pgbench failed"; }
    stats_read >"$dir/statements"
    stats_dump >"$dir/pg_stat_statements.txt"
    echo pgbench >"$dir/kind"
}

# The load of one measurement for SECONDS: wrk with bench/check.lua against
# URL, or for allow-grpc the grpc-load example against GRPC_ADDR (it prints
# the same WRKJSON line, so the rest of a measurement is the same).
load() {
    local scenario=$1 conc=$2 url=$3 seconds=$4 threads
    threads=$(threads_for "$conc")
    # Pre-rendered requests per thread (login, contact, mixed): enough that
    # none repeats below POOL_RATE requests/s.
    export BENCH_POOL=$(((POOL_RATE * seconds + threads - 1) / threads))
    local resets="" status=0
    if [ "$scenario" = deny-resets ]; then # beside it, a stream of resets (scenarios.sh)
        reset_stream "$url" "$seconds" >"$DIR/resets.out" 2>&1 &
        resets=$!
    fi
    if [ "$scenario" = allow-grpc ]; then
        "$GRPC_LOAD_BIN" "$GRPC_ADDR" "$conc" "$seconds" "$threads" || status=$?
    else
        wrk -t "$threads" -c "$conc" -d "${seconds}s" -s bench/check.lua "$url/check" || status=$?
    fi
    if [ -n "$resets" ]; then wait "$resets" || status=$?; fi
    return "$status"
}

# wrk with bench/check.lua against URL (allow-grpc: grpc-load, see load).
# EXPECT: the status every answer should have (200 or 429); checked with one
# request after the run.
run_wrk() {
    local system=$1 scenario=$2 conc=$3 url=$4 expect=$5 dir mode=random keys=$RANDOM_KEYS limit=1000000000
    ALGORITHM=""
    case $scenario in
        allow-hot) mode=hot keys=1 ;;
        allow-policy | allow-grpc) mode=policy ;;
        allow-auth) mode=auth ;;
        deny-resets) mode=deny keys=$RESET_DENY_KEYS limit=1 ;;
        deny*) mode=deny keys=$DENY_KEYS limit=1 ;;
        *) if policy_scenario_mode "$scenario"; then mode=$MODE limit=$LIMIT; fi ;;
    esac
    result_dir "$system" "$scenario" "$conc"
    dir=$DIR
    log "$system $scenario c=$conc"
    export BENCH_MODE=$mode BENCH_KEYS=$keys BENCH_LIMIT=$limit BENCH_WINDOW=1h BENCH_ALGORITHM=$ALGORITHM \
        BENCH_EMAILS=$LOGIN_EMAILS BENCH_IPS=$LOGIN_IPS BENCH_RECIPIENTS=$CONTACT_RECIPIENTS
    if [ "$WARMUP" -gt 0 ]; then
        load "$scenario" "$conc" "$url" "$WARMUP" >/dev/null 2>&1
    fi
    stats_reset
    # pglimit's phase histograms (the report's "where a check's time goes").
    if [ "$system" = pglimit ]; then curl -s "$url/metrics" >"$dir/metrics.before" || true; fi
    # BENCH_SLOW: its slow-check log, emptied so that it holds this run's alone.
    if [ "$system" = pglimit ] && [ "$SLOW" = 1 ]; then
        curl -s -o /dev/null -X DELETE "$url/admin/slow-checks" || true
    fi
    local before
    before=$(cpu_sample "$STARTED" "$PGDATA") # the server under measurement was started last
    load "$scenario" "$conc" "$url" "$SECS" >"$dir/wrk.out" 2>&1 ||
        { cat "$dir/wrk.out" >&2; die "$scenario load failed"; }
    if [ "$system" = pglimit ]; then curl -s "$url/metrics" >"$dir/metrics.after" || true; fi
    if [ "$system" = pglimit ] && [ "$SLOW" = 1 ]; then
        curl -s "$url/admin/slow-checks" >"$dir/slow.json" || true
    fi
    # Where the CPU went during the run (the report turns it into µs per request).
    local b after
    read -ra b <<<"$before"
    read -ra after <<<"$(cpu_sample "$STARTED" "$PGDATA")"
    echo "$((after[0] - b[0])) $((after[1] - b[1])) $((after[2] - b[2])) $((after[3] - b[3]))" >"$dir/cpu"
    sleep 0.2 # let checks still in flight when wrk stopped finish
    stats_read >"$dir/statements"
    stats_dump >"$dir/pg_stat_statements.txt"
    echo wrk >"$dir/kind"
    # One more check of the same shape: its status, and (pglimit) its store.
    # A gRPC answer does not say which store decided, so allow-grpc's probe
    # is /check's policy form on the same instance (grpc-load counted every
    # answer other than OK as a status error).
    local key=hot body
    case $mode in random) key=k1 ;; deny) key=deny1 ;; esac
    body="{\"key\":\"$key\",\"limit\":$limit,\"window\":\"1h\"}"
    if [ "$mode" = policy ]; then # check.lua's first key
        body='{"policy":"bench","identifiers":{"email":"u1@example.com","ip":"198.51.100.1"}}'
    fi
    local policy_body
    policy_body=$(policy_probe_body "$mode")
    if [ -n "$policy_body" ]; then body=$policy_body; fi
    if [ "$mode" = auth ]; then # the same key, as forward-auth reads it
        curl -s -o "$dir/probe.body" -w '%{http_code}' -H 'x-user-email: u1@example.com' \
            -H 'x-forwarded-for: 198.51.100.1' "$url/auth/bench" >"$dir/probe.status" || true
    else
        curl -s -o "$dir/probe.body" -w '%{http_code}' -H 'content-type: application/json' \
            -d "$body" "$url/check" >"$dir/probe.status" || true
    fi
    echo "$expect" >"$dir/expect"
}

# Puts every deny key over its limit of 1 (the first check of each is admitted).
prefill_deny() {
    local url=$1 i
    for i in $(seq "$DENY_KEYS"); do
        curl -s -o /dev/null -H 'content-type: application/json' \
            -d "{\"key\":\"deny$i\",\"limit\":1,\"window\":\"1h\"}" "$url/check"
    done
}

# Peak RSS (VmHWM) of PID in KiB, 0 when it is gone.
peak_rss_kib() {
    local key value _
    while read -r key value _; do
        if [ "$key" = VmHWM: ]; then
            echo "$value"
            return 0
        fi
    done 2>/dev/null <"/proc/$1/status" || true
    echo 0
}

metrics_status() {
    curl -s -o /dev/null -w '%{http_code}' "$1/metrics" || true
}

# Warning and error lines in a pglimit log, the expected one excluded.
log_warnings() {
    grep -E 'WARN|ERROR' "$1" | grep -vc 'PGLIMIT_API_TOKENS is not set' || true
}

# Active blocks in database DB (pglimit's: none; pglimit-actions': ACTION_BLOCKS).
active_blocks() {
    DB=$1 sql "SELECT count(*) FROM pglimit_blocks WHERE until > now()" || echo unknown
}

# What pglimit at URL answers a check that the deny-list override of
# bench/policies-actions.toml matches: "<status> <override action or none>",
# so "429 deny" with the overrides loaded and "200 none" without them.
override_probe() {
    local status body="" action=none re='"action":"([a-z_]+)"'
    status=$(curl -s -o "$WORK/override-probe.body" -w '%{http_code}' -H 'content-type: application/json' \
        -d '{"policy":"bench","identifiers":{"email":"probe@example.com","ip":"203.0.113.66"}}' \
        "$1/check") || true
    { read -r body <"$WORK/override-probe.body"; } 2>/dev/null || true
    if [[ $body =~ $re ]]; then action=${BASH_REMATCH[1]}; fi
    echo "${status:-000} $action"
}
