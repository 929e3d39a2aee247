# shellcheck shell=bash
# shellcheck disable=SC2034 # its settings are read by bench/run
# Sourced by bench/run, whose settings and functions it uses: the policy and
# algorithm scenarios (pglimit's policies and algorithms, their raw baseline,
# the concurrency curve), the checks during a stream of resets and the build
# of bench/'s workspace, kept apart so that run stays readable.

# --- settings ----------------------------------------------------------------

# The identity spaces of the login and contact scenarios (check.lua's login,
# contact and mixed modes, and bench/pgbench/login.sql), each big enough that
# at 20k checks/s under 1% of checks are denied (Poisson arrivals: a bucket of
# limit L whose key expects m checks in one window denies E[(X - L)+] / m):
# - IPs: all of 198.18.0.0/15 (kept for benchmarks), 131,072 addresses. The
#   ip bucket's window is 1 minute, which at 20k/s holds at most 1.2M checks:
#   9.2 per address against a limit of 20, so 0.01% denied, however long the
#   run.
# - emails: 1,000,000. The email bucket's window is 15 minutes, at most 18M
#   checks: 18 per email against 50, about 1e-11 denied; an email and an
#   address (limit 5 a minute) meet about 1e-5 times a minute.
# - recipients: 4,000,000. Their window is a day, longer than any run, so it
#   is the run's length that counts: a default run has 24 s of allow-contact
#   (2 client counts, warm-up included) and 15% of 24 s of the mix, 552k
#   checks at 20k/s, 0.14 per recipient against a limit of 3: 0.01% denied
#   (0.99% for BENCH_SECONDS=60).
# Those of the login policy also see the mix's 40%, already counted above.
LOGIN_EMAILS=1000000
LOGIN_IPS=131072
CONTACT_RECIPIENTS=4000000
# Requests/s at which the pools of pre-rendered requests stop repeating (see
# load, and BENCH_POOL in check.lua).
POOL_RATE=20000

# deny-resets: the deny path on this many keys, all remembered by
# the deny cache before it starts (as during an attack), while one client
# resets other keys back to back: every reset is forgotten by the instance
# against a cache this full, under the lock its checks take.
RESET_DENY_KEYS=10000

POLICY_SCENARIOS="allow-login allow-contact mixed"
ALGORITHM_SCENARIOS="allow-sliding_window allow-sliding_log allow-token_bucket allow-concurrency"
if [ "$SMOKE" = 1 ]; then
    CURVE=${BENCH_CURVE:-"1 8"}
else
    CURVE=${BENCH_CURVE:-"1 2 4 8 16 32 64"}
fi
for c in $CURVE; do
    [ "$c" -ge 1 ] 2>/dev/null || die "BENCH_CURVE: $c is not a client count"
done

# --- helpers -----------------------------------------------------------------

# wrk threads and pgbench -j for CONC clients: at most one thread per client.
threads_for() {
    if [ "$1" -lt "$THREADS" ]; then echo "$1"; else echo "$THREADS"; fi
}

# The curve's points that the main table's client counts do not measure
# already (those reuse the allow-random measurements).
curve_extra_points() {
    local c
    for c in $CURVE; do
        case " $CONCURRENCY " in *" $c "*) ;; *) echo "$c" ;; esac
    done
}

# Sets the check.lua mode (MODE), algorithm (ALGORITHM) and ad hoc limit
# (LIMIT) of SCENARIO, a policy or algorithm scenario; returns 1 for the others.
policy_scenario_mode() {
    ALGORITHM="" LIMIT=1000000000
    case $1 in
        allow-login) MODE=login ;;
        allow-contact) MODE=contact ;;
        mixed) MODE=mixed ;;
        allow-sliding_window | allow-token_bucket) MODE=random ALGORITHM=${1#allow-} ;;
        # A log keeps one timestamp per admitted check: pglimit caps its limit
        # at 1,000, which a run's 10,000 keys stay far below.
        allow-sliding_log) MODE=random ALGORITHM=sliding_log LIMIT=1000 ;;
        # One lease expiry per slot held, capped at 1,000 too; every admitted
        # check also writes its lease row (never released in the bench).
        allow-concurrency) MODE=random ALGORITHM=concurrency LIMIT=1000 ;;
        curve) MODE=random ;;
        *) return 1 ;;
    esac
}

# The probe body of MODE after a measurement numbered SEQ: identities of
# their own, so that no probe is denied for an earlier one (the contact limit
# is 3 a day). Prints nothing for the modes run handles itself.
policy_probe_body() {
    case $1 in
        login | mixed)
            echo "{\"policy\":\"login\",\"identifiers\":{\"email\":\"probe$SEQ@example.org\",\"ip\":\"198.18.0.1\"}}" ;;
        contact)
            echo "{\"policy\":\"contact_confirmation\",\"identifiers\":{\"recipient\":\"probe$SEQ@example.net\"}}" ;;
        random)
            if [ "$ALGORITHM" = concurrency ]; then
                echo "{\"key\":\"k1\",\"limit\":$LIMIT,\"lease\":\"1h\",\"algorithm\":\"concurrency\"}"
            elif [ -n "$ALGORITHM" ]; then
                echo "{\"key\":\"k1\",\"limit\":$LIMIT,\"window\":\"1h\",\"algorithm\":\"$ALGORITHM\"}"
            fi
            ;;
    esac
}

# pgbench's script and variables for SCENARIO with NKEYS random keys, for
# SYSTEM: raw-pg (the default: the reference upserts) or pglimit-sql
# (pglimit.check on the same keys and identities).
pgbench_script_args() {
    local one=upsert.sql login=login.sql
    if [ "${3:-raw-pg}" = pglimit-sql ]; then one=check.sql login=check-login.sql; fi
    if [ "$1" = allow-login ]; then
        echo "-D emails=$LOGIN_EMAILS -D ips=$LOGIN_IPS -f bench/pgbench/$login"
    else
        echo "-D nkeys=$2 -f bench/pgbench/$one"
    fi
}

# --- measurements ------------------------------------------------------------

# pglimit's (or its twins') policy and algorithm scenarios at every client count.
# SCENARIOS: which (default all of them).
run_policy_scenarios() {
    local system=$1 url=$2 scenarios=${3:-"$POLICY_SCENARIOS $ALGORITHM_SCENARIOS"} c s
    for c in $CONCURRENCY; do
        for s in $scenarios; do
            run_wrk "$system" "$s" "$c" "$url" 200
        done
    done
}

# SYSTEM's allow path on random keys at the curve's points not measured yet
# (the server at URL; raw-pg: pgbench).
run_curve() {
    local system=$1 url=${2:-} c
    for c in $(curve_extra_points); do
        if [ "$system" = raw-pg ]; then
            run_pgbench curve "$RANDOM_KEYS" "$c"
        else
            run_wrk "$system" curve "$c" "$url" 200
        fi
    done
}

# Checks during a stream of resets, for SYSTEM (pglimit or the baseline) at
# URL, at every client count: deny1..deny<RESET_DENY_KEYS> are put over their
# limit of 1 and then denied once, so that the deny cache remembers them all.
# Last of the system's runs, so that the cache this fills weighs on no other.
run_deny_resets() {
    local system=$1 url=$2 pass c
    for pass in admitted denied; do
        curl_each_deny_key "$url" "$RESET_DENY_KEYS" "$pass"
    done
    for c in $CONCURRENCY; do
        run_wrk "$system" deny-resets "$c" "$url" 429
    done
}

# One check of each of deny1..deny<N> at URL, 16 at a time through one curl.
curl_each_deny_key() {
    local url=$1 n=$2 pass=$3 config=$WORK/deny-keys.curl i
    for ((i = 1; i <= n; i++)); do
        if [ "$i" -gt 1 ]; then echo next; fi # options after it are the next request's
        printf 'url = "%s/check"\nheader = "content-type: application/json"\noutput = "/dev/null"\n' "$url"
        printf 'data = "{\\"key\\":\\"deny%d\\",\\"limit\\":1,\\"window\\":\\"1h\\"}"\n' "$i"
    done >"$config"
    curl --no-progress-meter --parallel --parallel-max 16 -K "$config" ||
        die "checking the $n deny keys ($pass) failed"
}

# The stream of resets beside a deny-resets measurement: one client, one
# request at a time, resetting keys of its own (reset1..reset<RANDOM_KEYS>,
# never a deny key, so every check stays denied) for SECONDS. Its wrk output
# goes to the measurement's resets.out, which the report reads.
reset_stream() {
    local url=$1 seconds=$2
    BENCH_MODE=reset BENCH_KEYS=$RANDOM_KEYS BENCH_LIMIT=1000000000 \
        wrk -t 1 -c 1 -d "${seconds}s" -s bench/check.lua "$url/reset"
}

# --- builds and checks -------------------------------------------------------

# bench/'s own Cargo workspace (bench/Cargo.toml, one Cargo.lock): the
# report, the chart and the two Rust peers, in one build into a target
# directory of their own, so that none of it touches pglimit's build (a first
# build takes a few minutes on 2 cores; later ones are incremental). The
# binaries are copied to REPORT_BIN, CHART_BIN, RUNLIMIT_BIN and SEED_BIN.
build_bench_workspace() {
    # The profile of pglimit's build (build_for_bench): dev for a smoke run.
    local dir=$TARGET_DIR/bench profile=${BENCH_BUILD_DIR##*/} bin
    log "building the report, the chart and the Rust peers (bench/Cargo.toml, $BENCH_PROFILE profile)"
    cargo build --locked --quiet --profile "$BENCH_PROFILE" --manifest-path bench/Cargo.toml --target-dir "$dir"
    for bin in bench-report bench-chart peer-runlimit peer-seed; do
        [ -x "$dir/$profile/$bin" ] || die "$bin was not found in $dir/$profile after the build"
        cp "$dir/$profile/$bin" "$WORK/bin/$bin"
    done
    REPORT_BIN=$WORK/bin/bench-report
    CHART_BIN=$WORK/bin/bench-chart
    RUNLIMIT_BIN=$WORK/bin/peer-runlimit
    SEED_BIN=$WORK/bin/peer-seed
    # The chart's font (ab_glyph reads a TTF; no fontconfig, no X).
    CHART_FONT=/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
    [ -f "$CHART_FONT" ] || apt_install fonts-dejavu-core
    [ -f "$CHART_FONT" ] || die "$CHART_FONT still missing after installing fonts-dejavu-core"
}

# bench/policies.toml must hold the login and contact_confirmation policies
# of policies.default.toml byte for byte (from the login's comment to the
# end of that file), so that those scenarios measure the shipped policies.
check_policy_copies() {
    local shipped mine
    shipped=$(sed -n '/^# Login: three buckets/,$p' policies.default.toml)
    mine=$(cat bench/policies.toml)
    [ -n "$shipped" ] || die "policies.default.toml: no '# Login: three buckets' line to copy from"
    [[ $mine == *"$shipped"* ]] ||
        die "bench/policies.toml must hold policies.default.toml's login and contact_confirmation policies byte for byte"
}

# Draws the curve the report wrote to DATA into PNG.
draw_curve() {
    local data=$1 png=$2
    [ -s "$data" ] || die "the report wrote no curve data"
    BENCH_CHART_FONT=$CHART_FONT "$CHART_BIN" "$data" "$png" \
        "pglimit and its peers: allow path, random keys (bench/run, $(date -u +%Y-%m-%d))" ||
        die "the chart was not drawn"
}
