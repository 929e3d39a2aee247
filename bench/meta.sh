# shellcheck shell=bash
# Sourced by bench/run, whose settings it reads: the run's metadata for the
# report (the machine, the versions, what each system left), and the
# report's file name.

# The CPU model (cpu_model), memory in tenths of a GiB (memory_tenths) and
# the machine's name in file names (machine): "<nproc>cpu-<model>".
machine_facts() {
    local line key value memory_kib=0
    cpu_model=""
    while IFS= read -r line; do
        case $line in "model name"*)
            cpu_model=${line#*:}
            cpu_model=${cpu_model#"${cpu_model%%[! ]*}"}
            break
            ;;
        esac
    done </proc/cpuinfo
    [ -n "$cpu_model" ] || cpu_model=$(uname -m)
    while read -r key value _; do
        if [ "$key" = MemTotal: ]; then memory_kib=$value; fi
    done </proc/meminfo
    memory_tenths=$(((memory_kib * 10 + 524288) / 1048576)) # GiB, to one decimal
    machine="$(nproc)cpu-$(printf '%s' "$cpu_model" | tr '[:upper:]' '[:lower:]' |
        sed -E 's/\((r|tm)\)//g; s/ (cpu|processor)\b//g; s/ @.*//; s/[^a-z0-9]+/-/g; s/^-+|-+$//g' | cut -c1-40)"
}

# A package's version in a lock file (default: bench/'s workspace's, which
# the runlimit peer and the seed service share).
lock_version() {
    local line found=0
    while IFS= read -r line; do
        if [ "$found" = 1 ]; then
            line=${line#version = \"}
            echo "${line%\"}"
            return 0
        fi
        [ "$line" != "name = \"$1\"" ] || found=1
    done <"${2:-bench/Cargo.lock}"
}
# The version of an installed npm package of the rate-limiter-flexible peer:
# the first "version" key of its package.json.
npm_version() {
    local line re='^[[:space:]]*"version"[[:space:]]*:[[:space:]]*"([^"]*)"'
    while IFS= read -r line; do
        if [[ $line =~ $re ]]; then
            echo "${BASH_REMATCH[1]}"
            return 0
        fi
    done <"bench/peer-rlflex/node_modules/$1/package.json"
}

# Writes $WORK/meta, which the report reads, and sets OUT, its file.
write_meta() {
    local suffix="" wrk_version
    machine_facts
    read -r _ wrk_version _ < <(wrk -v 2>&1 || true) || true
    [ "$SMOKE" = 1 ] && suffix="-smoke"
    mkdir -p "$RESULTS_DIR"
    OUT=$RESULTS_DIR/$(date -u +%Y-%m-%d-%H%M)-$machine$suffix.md
    {
        echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "command=$COMMAND"
        echo "smoke=$SMOKE"
        echo "seconds=$SECS"
        echo "warmup=$WARMUP"
        echo "threads=$THREADS"
        echo "nproc=$(nproc)"
        echo "clk_tck=$(getconf CLK_TCK)"
        echo "cpu=$cpu_model"
        echo "memory=$((memory_tenths / 10)).$((memory_tenths % 10)) GiB"
        echo "kernel=$(uname -sr)"
        # shellcheck disable=SC1091 # the machine's, not ours
        echo "os=$(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown}")"
        echo "postgres=$PG_VERSION"
        echo "rustc=$(rustc --version)"
        echo "node=$(node --version)"
        echo "wrk=$wrk_version"
        echo "rlflex=$(npm_version rate-limiter-flexible)"
        echo "pg_npm=$(npm_version pg)"
        echo "runlimit=$(lock_version runlimit-postgres)"
        echo "runlimit_sqlx=$(lock_version sqlx)"
        echo "seed_sqlx=$(lock_version sqlx)"
        echo "seed_axum=$(lock_version axum)"
        echo "commit=$BUILT_FROM"
        echo "build=$BENCH_PROFILE"
        echo "pglimit_rss_kib=$PGLIMIT_RSS"
        echo "rlflex_rss_kib=$RLFLEX_RSS"
        echo "runlimit_rss_kib=$RUNLIMIT_RSS"
        echo "seed_rss_kib=$SEED_RSS"
        echo "curve=$CURVE"
        echo "curve_tsv=$WORK/curve.tsv"
        echo "curve_png=$(basename "${OUT%.md}")-curve.png"
        echo "login_emails=$LOGIN_EMAILS"
        echo "login_ips=$LOGIN_IPS"
        echo "contact_recipients=$CONTACT_RECIPIENTS"
        echo "pglimit_warnings=$PGLIMIT_WARNINGS"
        echo "pglimit_readyz=$PGLIMIT_READY"
        echo "pglimit_metrics_status=$PGLIMIT_METRICS_STATUS"
        echo "nometrics_rss_kib=$NOMETRICS_RSS"
        echo "nometrics_warnings=$NOMETRICS_WARNINGS"
        echo "nometrics_metrics_status=$NOMETRICS_METRICS_STATUS"
        echo "notop_warnings=$NOTOP_WARNINGS"
        echo "pglimit_blocks=$PGLIMIT_BLOCKS"
        echo "pglimit_override_probe=$PGLIMIT_OVERRIDE_PROBE"
        echo "actions_rss_kib=$ACTIONS_RSS"
        echo "actions_warnings=$ACTIONS_WARNINGS"
        echo "actions_metrics_status=$ACTIONS_METRICS_STATUS"
        echo "actions_blocks=$ACTIONS_BLOCKS"
        echo "actions_blocks_expected=$ACTION_BLOCKS"
        echo "actions_override_probe=$ACTIONS_OVERRIDE_PROBE"
        if [ -n "$BASELINE_REV" ]; then
            echo "baseline=$BASELINE_SHORT"
            echo "baseline_rev=$BASELINE_REV"
            echo "baseline_rss_kib=$BASELINE_RSS"
        fi
    } >"$WORK/meta"
}
