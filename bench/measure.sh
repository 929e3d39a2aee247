# shellcheck shell=bash
# bench/limitador's measurements, sourced by it: the load of one
# measurement, its figures as one JSON line in $WORK/rows (requests/s,
# latency, CPU per check of the service, its store and the rest), and the
# exactness rounds. Reads bench/limitador's settings (THREADS, WARMUP, SECS,
# RANDOM_KEYS, DENY_KEYS, LIMIT, CONCURRENCY, EXACT_N, EXACT_ROUNDS) and
# $HTTP, $GRPC and $FORM of the system under load.

# The load of one measurement: PROTO CONC SECONDS, against $HTTP or $GRPC.
load() {
    local threads=$((THREADS < $2 ? THREADS : $2))
    if [ "$1" = grpc ]; then
        "$WORK/bin/grpc-load" "$GRPC" "$2" "$3" "$threads"
    else
        wrk -t "$threads" -c "$2" -d "${3}s" -s bench/check.lua "$HTTP/"
    fi
}

# measure SYSTEM PROTO SCENARIO CONC PID [STORE]: one JSON line in $WORK/rows.
measure() {
    local system=$1 proto=$2 scenario=$3 conc=$4 pid=$5 store=${6:-} mode=random keys=$RANDOM_KEYS domain=allow
    case $scenario in
        allow-hot) mode=hot keys=1 ;;
        deny) mode=deny keys=$DENY_KEYS domain=deny ;;
    esac
    local limit=$LIMIT
    if [ "$mode" = deny ]; then limit=1; fi
    export BENCH_MODE=$mode BENCH_KEYS=$keys BENCH_LIMIT=$limit BENCH_WINDOW=1h BENCH_POLICY=$domain \
        BENCH_GRPC_SHAPE=key BENCH_FORM=$FORM
    log "$system $proto $scenario c=$conc"
    local before after out json other attempt
    # Once more when someone else's build or load ran beside it; the row says so if it still did.
    for attempt in 1 2; do
        wait_quiet
        if [ "$WARMUP" -gt 0 ]; then load "$proto" "$conc" "$WARMUP" >/dev/null 2>&1 || true; fi
        before=$(cpu_sample "$pid" "$store")
        out=$(load "$proto" "$conc" "$SECS" 2>&1) || die "$system $proto $scenario c=$conc: the load failed: $out"
        after=$(cpu_sample "$pid" "$store")
        other=$(other_work)
        if [ -z "$other" ]; then break; fi
        log "$other ran beside it (attempt $attempt)"
    done
    json=$(sed -n 's/^WRKJSON //p' <<<"$out")
    [ -n "$json" ] || die "$system $proto $scenario c=$conc: no figures from the load generator: $out"
    jq -c --arg system "$system" --arg proto "$proto" --arg scenario "$scenario" --argjson conc "$conc" \
        --arg before "$before" --arg after "$after" --argjson hz "$(getconf CLK_TCK)" --arg other "$other" '
        ([$after, $before] | map(split(" ") | map(tonumber))) as [$a, $b]
        | (1e6 / $hz / .requests) as $us
        | {system: $system, proto: $proto, scenario: $scenario, conc: $conc, other: $other,
           rps: (.requests * 1e6 / .duration_us), p50_us: .lat_p50_us, p99_us: .lat_p99_us,
           non_ok: .status_errors, failed: (.connect_errors + .read_errors + .write_errors + .timeouts),
           requests, svc_us: (($a[0] - $b[0]) * $us), store_us: (($a[1] - $b[1]) * $us),
           rest_us: ((($a[2] - $b[2]) - ($a[0] - $b[0]) - ($a[1] - $b[1])) * $us)}' <<<"$json" >>"$WORK/rows"
}

run_system() {
    local conc proto scenario
    for conc in $CONCURRENCY; do
        for proto in http grpc; do
            for scenario in allow-random allow-hot deny; do
                measure "$1" "$proto" "$scenario" "$conc" "$2" "${3:-}"
            done
        done
    done
}

# SYSTEM URL BODY: EXACT_ROUNDS times, EXACT_N checks of BODY at once on URL
# over HTTP, one connection each (curl --parallel), each round on a fresh key
# (KEY in BODY becomes exact<round>); one line in $WORK/exact: SYSTEM and how
# many each round admitted (200). Rounds, since a race need not show in one.
exactness() {
    local round i line=$1
    for i in $(seq "$EXACT_N"); do printf 'url = "%s"\noutput = "/dev/null"\n' "$2"; done >"$WORK/exact.curl"
    for round in $(seq "$EXACT_ROUNDS"); do
        line+=" $(curl --no-progress-meter --parallel --parallel-immediate --parallel-max "$EXACT_N" \
            -H 'content-type: application/json' -d "${3/KEY/exact$round}" -w '%{http_code}\n' -K "$WORK/exact.curl" |
            grep -c '^200$' || true)"
    done
    echo "$line" >>"$WORK/exact"
}

post() { curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' -d "$2" "$1"; }
