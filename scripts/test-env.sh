#!/usr/bin/env bash
# What the test suite needs before it starts, made sure of in one place: PostgreSQL on
# :5432, Redis on :6379 and NATS with JetStream on :4222 up (started when down), and the
# tools some tests call (Chromium for the console test, promtool for /metrics and the
# Prometheus rules, openssl for the README's tokens) installed when missing.
# Sourced by scripts/test.sh (so the README's test command needs nothing done by hand) and
# by .ci/run. Set INVENTORY_TEST_ENV=skip to leave services and tools alone (for example
# when INVENTORY_TEST_DATABASE_URL / INVENTORY_TEST_REDIS_URL point elsewhere).

test_env_log() { printf '\n== %s\n' "$*" >&2; }

# Installing needs root (or sudo) and a package manager; without them the missing piece is
# named and the tests that need it fail with their own message saying how to get it.
test_env_install() {
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then sudo=(sudo -n); else
            test_env_log "cannot install $* (not root, no sudo): install them by hand"; return 0
        fi
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        test_env_log "cannot install $* (no apt-get): install them by hand"; return 0
    fi
    test_env_log "installing $* (apt-get; its output only if it fails)"
    local out
    out=$(mktemp)
    if ! { "${sudo[@]}" apt-get update -q && DEBIAN_FRONTEND=noninteractive \
        "${sudo[@]}" apt-get install -y -q "$@"; } >"$out" 2>&1; then
        cat "$out" >&2; rm -f "$out"; return 1
    fi
    rm -f "$out"
}

test_env_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ensure_postgres() {
    if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then return 0; fi
    test_env_log "starting PostgreSQL"
    command -v pg_ctlcluster >/dev/null 2>&1 || test_env_install postgresql
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
    for _ in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p 5432 && return 0; sleep 0.2; done
    echo "PostgreSQL did not come up on 127.0.0.1:5432" >&2; return 1
}

ensure_redis() {
    if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then return 0; fi
    command -v redis-server >/dev/null 2>&1 || test_env_install redis-server
    test_env_log "starting Redis"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/test.log
    for _ in $(seq 1 50); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && return 0; sleep 0.2; done
    echo "Redis did not come up on 127.0.0.1:6379" >&2; return 1
}

# NATS with JetStream: the relay's tests publish to it (those that kill or restart the
# broker start their own on a free port). Debian's package is nats-server.
ensure_nats() {
    command -v nats-server >/dev/null 2>&1 || test_env_install nats-server
    if test_env_port_open 4222; then return 0; fi
    test_env_log "starting NATS (JetStream)"
    mkdir -p /var/lib/nats-server /var/log
    nats-server -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log \
        </dev/null >/dev/null 2>&1 &
    disown
    for _ in $(seq 1 50); do test_env_port_open 4222 && return 0; sleep 0.2; done
    echo "NATS did not come up on 127.0.0.1:4222" >&2; return 1
}

ensure_tools() {
    local missing=()
    [ -x /usr/bin/chromium ] || missing+=(chromium)
    command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
    command -v openssl >/dev/null 2>&1 || missing+=(openssl)
    if [ ${#missing[@]} -gt 0 ]; then test_env_install "${missing[@]}"; fi
}

ensure_test_env() {
    if [ "${INVENTORY_TEST_ENV:-}" = skip ]; then return 0; fi
    ensure_postgres
    ensure_redis
    ensure_nats
    ensure_tools
}
