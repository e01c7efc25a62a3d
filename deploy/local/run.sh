#!/usr/bin/env bash
# The whole stack as local processes, for a demo or a soak: PostgreSQL, Redis, the center,
# three agents (app, web, partner; pools in Redis) and Prometheus when it is installed.
#
#   deploy/local/run.sh start       build, start everything, print the URLs
#   deploy/local/run.sh sale        one flash sale through the three agents with invctl
#   deploy/local/run.sh bench       a short inventory-bench acquire on the three agents, with
#                                   the backends' token (and, without it, every call refused)
#   deploy/local/run.sh reconcile   wait for the ledger to settle, check the invariants
#   deploy/local/run.sh status      what runs where
#   deploy/local/run.sh stop        drain the agents, stop everything, remove the state
#   deploy/local/run.sh all         start, sale, bench, reconcile, stop (what CI runs)
#
# Options (environment):
#   INVENTORY_LOCAL_DIR        state directory (default: $TMPDIR/inventory-local)
#   INVENTORY_LOCAL_PORT_BASE  first of 11 consecutive ports on 127.0.0.1 (default 27300,
#                              below the ephemeral range, so no outgoing connection holds one)
#   INVENTORY_LOCAL_PROFILE    debug (default) or release
#   CARGO_TARGET_DIR           where cargo builds (honoured, like a build.target-dir setting)
#   INVENTORY_LOCAL_PG         private (own initdb data dir; the default when initdb exists)
#                              or system (a fresh database on INVENTORY_LOCAL_PG_URL,
#                              default postgres://postgres@127.0.0.1:5432/postgres)
#   INVENTORY_LOCAL_KEEP=1     `stop` keeps the state directory (logs, data)
#   SALE_TOTAL, SALE_BUYERS    size of `sale` (default 300 units, 450 buyers)
#   BENCH_TOTAL                units of `bench`'s item (default 2000)
#
# Every process gets its bearer tokens through INVENTORY_* variables pointing at files in
# $INVENTORY_LOCAL_DIR/secrets (fresh random tokens per start): the operator's and one per
# channel at the center, each agent's own plus the backends' at the agents, and invctl
# uses the operator's (center) or the backends' (agent) token.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
state="${INVENTORY_LOCAL_DIR:-${TMPDIR:-/tmp}/inventory-local}"
envfile="$state/stack.env"
channels=(app web partner)

log() { printf '== %s\n' "$*"; }
die() { printf 'run.sh: %s\n' "$*" >&2; exit 1; }

# --- helpers -------------------------------------------------------------------------

# True when something accepts connections on 127.0.0.1:$1.
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# GET http://127.0.0.1:$1$2 without curl; prints the body, fails unless 200.
http_get() {
    local port=$1 path=$2 response
    response=$( (exec 3<>"/dev/tcp/127.0.0.1/$port" &&
        printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$path" >&3 && timeout 5 cat <&3) 2>/dev/null) || return 1
    [[ "$response" == "HTTP/1."?" 200"* ]] || return 1
    printf '%s\n' "${response#*$'\r\n\r\n'}"
}

# wait_for SECONDS DESCRIPTION PID LOG COMMAND...: polls COMMAND every 0.2 s; fails at
# once, with the end of LOG, when process PID (the server waited for) has exited. PID and
# LOG may be empty.
wait_for() {
    local seconds=$1 what=$2 pid=$3 logfile=$4
    shift 4
    local deadline=$((SECONDS + seconds))
    # Each probe bounded (http_get bounds itself): a port held by something else may
    # accept and never answer.
    local bound=(timeout 5)
    [[ $(type -t "$1") == function ]] && bound=()
    until "${bound[@]}" "$@" >/dev/null 2>&1; do
        if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
            [[ -n "$logfile" ]] && tail -n 5 "$logfile" >&2
            die "$what exited at start-up (logs in $state)"
        fi
        ((SECONDS < deadline)) || die "$what did not come up within ${seconds}s (logs in $state)"
        sleep 0.2
    done
}

alive() { [[ -n "${1:-}" ]] && kill -0 "$1" 2>/dev/null; }

# Runs a command as the postgres user when we are root (PostgreSQL refuses to run as root).
as_pg() {
    if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_bin() {
    local tool=$1 found
    if found=$(command -v "$tool"); then echo "$found"; return; fi
    found=$(printf '%s\n' /usr/lib/postgresql/*/bin/"$tool" | grep -v '\*' | sort -V | tail -n1)
    [[ -n "$found" ]] && echo "$found"
}

load_env() {
    [[ -f "$envfile" ]] || die "no stack running from $state (run: $0 start)"
    # shellcheck disable=SC1090
    source "$envfile"
    export INVENTORY_CENTER="http://127.0.0.1:$CENTER_GRPC"
    export INVENTORY_TOKEN_FILE="$state/secrets/operator.token"
    invctl="$BIN/invctl"
}

# invctl as a channel backend: the backends' token instead of the operator's.
invctl_agent() { INVENTORY_TOKEN_FILE="$state/secrets/backend.token" "$invctl" "$@"; }

random_token() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

make_secrets() {
    local ch t
    mkdir -p "$state/secrets"
    chmod 700 "$state/secrets"
    random_token >"$state/secrets/operator.token"
    random_token >"$state/secrets/backend.token"
    : >"$state/secrets/agent-tokens"
    for ch in "${channels[@]}"; do
        t=$(random_token)
        printf '%s\n' "$t" >"$state/secrets/agent-$ch.token"
        printf '%s:%s\n' "$ch" "$t" >>"$state/secrets/agent-tokens"
    done
    # The servers refuse token files that group or others may read (files kept from an
    # earlier start keep their mode when rewritten).
    chmod 600 "$state"/secrets/*
}

agent_url() { local var="AGENT_GRPC_$1"; echo "http://127.0.0.1:${!var}"; }

# --- start ---------------------------------------------------------------------------

start_postgres() {
    local mode=${INVENTORY_LOCAL_PG:-}
    local initdb pg_ctl
    initdb=$(pg_bin initdb || true)
    pg_ctl=$(pg_bin pg_ctl || true)
    if [[ -z "$mode" ]]; then
        if [[ -n "$initdb" && -n "$pg_ctl" ]]; then mode=private; else mode=system; fi
    fi
    case "$mode" in
        private)
            [[ -n "$initdb" && -n "$pg_ctl" ]] || die "initdb/pg_ctl not found (apt-get install postgresql, or INVENTORY_LOCAL_PG=system)"
            log "PostgreSQL: private cluster in $state/pg on 127.0.0.1:$PG_PORT"
            mkdir -p "$state/pg/run"
            [[ $(id -u) -eq 0 ]] && chown -R postgres: "$state/pg"
            as_pg "$initdb" -D "$state/pg/data" -U postgres --auth=trust --no-sync >"$state/pg/initdb.log" 2>&1 ||
                die "initdb failed: $(tail -n5 "$state/pg/initdb.log")"
            as_pg "$pg_ctl" -D "$state/pg/data" -l "$state/pg/postgres.log" -w -t 30 \
                -o "-p $PG_PORT -k $state/pg/run -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null ||
                die "PostgreSQL did not start: $(tail -n5 "$state/pg/postgres.log")"
            PG_MODE=private
            PG_SERVER_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
            PG_DB=inventory
            ;;
        system)
            PG_MODE=system
            PG_SERVER_URL=${INVENTORY_LOCAL_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
            PG_DB="inventory_local_$(date +%s)_$$"
            log "PostgreSQL: database $PG_DB on ${PG_SERVER_URL%/*}"
            ;;
        *) die "INVENTORY_LOCAL_PG must be private or system, not $mode" ;;
    esac
    command -v psql >/dev/null || die "psql not found (apt-get install postgresql-client)"
    psql -q -v ON_ERROR_STOP=1 "$PG_SERVER_URL" -c "CREATE DATABASE $PG_DB" >/dev/null ||
        die "cannot create database $PG_DB on $PG_SERVER_URL"
    DATABASE_URL="${PG_SERVER_URL%/*}/$PG_DB"
}

start_redis() {
    command -v redis-server >/dev/null || die "redis-server not found (apt-get install redis-server)"
    log "Redis on 127.0.0.1:$REDIS_PORT (no persistence: a demo)"
    mkdir -p "$state/redis"
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no --daemonize yes \
        --dir "$state/redis" --pidfile "$state/redis/redis.pid" --logfile "$state/redis/redis.log"
    wait_for 10 "Redis" "" "" redis-cli -p "$REDIS_PORT" ping
    REDIS_PID=$(cat "$state/redis/redis.pid")
}

start_prometheus() {
    PROM_PID=""
    if ! command -v prometheus >/dev/null; then
        log "Prometheus: not installed, skipped (apt-get install prometheus)"
        return
    fi
    log "Prometheus on http://127.0.0.1:$PROM_PORT (rules from deploy/prometheus/rules)"
    mkdir -p "$state/prometheus/data"
    local agents="" ch var
    for ch in "${channels[@]}"; do
        var="AGENT_HTTP_$ch"
        agents+="\"127.0.0.1:${!var}\", "
    done
    cat >"$state/prometheus/prometheus.yml" <<EOF
# Written by deploy/local/run.sh: deploy/prometheus/prometheus.yml with local targets.
global:
  scrape_interval: 2s
  scrape_timeout: 2s
  evaluation_interval: 2s
rule_files:
  - $root/deploy/prometheus/rules/*.yml
scrape_configs:
  - job_name: inventory-center
    static_configs:
      - targets: ["127.0.0.1:$CENTER_HTTP"]
  - job_name: inventory-agent
    static_configs:
      - targets: [${agents%, }]
EOF
    if command -v promtool >/dev/null; then
        promtool check config "$state/prometheus/prometheus.yml" >/dev/null || die "generated Prometheus config is invalid"
    fi
    nohup prometheus --config.file="$state/prometheus/prometheus.yml" \
        --storage.tsdb.path="$state/prometheus/data" --web.listen-address="127.0.0.1:$PROM_PORT" \
        >"$state/prometheus/prometheus.log" 2>&1 </dev/null &
    PROM_PID=$!
    wait_for 30 "Prometheus" "$PROM_PID" "$state/prometheus/prometheus.log" http_get "$PROM_PORT" /-/ready
}

cmd_start() {
    if [[ -f "$envfile" ]]; then
        # shellcheck disable=SC1090
        source "$envfile"
        alive "${CENTER_PID:-}" && die "a stack already runs from $state (run: $0 stop)"
        rm -rf "$state"
    fi
    local base=${INVENTORY_LOCAL_PORT_BASE:-27300} profile=${INVENTORY_LOCAL_PROFILE:-debug} p
    for p in $(seq "$base" $((base + 10))); do
        port_busy "$p" && die "port $p is in use; set INVENTORY_LOCAL_PORT_BASE to a free range of 11 ports"
    done
    PG_PORT=$base REDIS_PORT=$((base + 1)) CENTER_GRPC=$((base + 2)) CENTER_HTTP=$((base + 3))
    PROM_PORT=$((base + 10))
    local i=0 ch
    for ch in "${channels[@]}"; do
        printf -v "AGENT_GRPC_$ch" '%s' $((base + 4 + 2 * i))
        printf -v "AGENT_HTTP_$ch" '%s' $((base + 5 + 2 * i))
        i=$((i + 1))
    done

    mkdir -p "$state"
    chmod 755 "$state"
    log "building the binaries ($profile)"
    if [[ "$profile" == release ]]; then
        (cd "$root" && cargo build --quiet --release --bin inventory-center --bin inventory-agent --bin invctl --bin inventory-bench)
    else
        (cd "$root" && cargo build --quiet --bin inventory-center --bin inventory-agent --bin invctl --bin inventory-bench)
    fi
    # Cargo's own answer, so CARGO_TARGET_DIR and build.target-dir in a config file both count.
    local target
    target=$(cd "$root" && cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    BIN="${target:-$root/target}/$profile"
    local b
    for b in inventory-center inventory-agent invctl inventory-bench; do
        [[ -x "$BIN/$b" ]] || die "$BIN/$b is missing after the build"
    done
    make_secrets
    export INVENTORY_TOKEN_FILE="$state/secrets/operator.token"

    # Written as we go, so `stop` can clean up whatever did start.
    write_env() {
        {
            local ch
            for v in BIN PG_MODE PG_PORT PG_SERVER_URL PG_DB DATABASE_URL REDIS_PORT REDIS_PID CENTER_GRPC \
                CENTER_HTTP CENTER_PID PROM_PORT PROM_PID; do
                printf '%s=%q\n' "$v" "${!v:-}"
            done
            for ch in "${channels[@]}"; do
                for v in "AGENT_GRPC_$ch" "AGENT_HTTP_$ch" "AGENT_PID_$ch"; do printf '%s=%q\n' "$v" "${!v:-}"; done
            done
        } >"$envfile"
    }
    PG_MODE="" CENTER_PID="" REDIS_PID="" PROM_PID=""
    write_env
    start_postgres
    write_env
    start_redis
    write_env

    export RUST_LOG="${RUST_LOG:-info}"
    date +%s >"$state/center-started"
    log "center on 127.0.0.1:$CENTER_GRPC (console and metrics on http://127.0.0.1:$CENTER_HTTP/; the console signs in with $state/secrets/operator.token)"
    INVENTORY_OPERATOR_TOKEN_FILE="$state/secrets/operator.token" \
        INVENTORY_AGENT_TOKENS_FILE="$state/secrets/agent-tokens" \
        nohup "$BIN/inventory-center" --listen "127.0.0.1:$CENTER_GRPC" --http-listen "127.0.0.1:$CENTER_HTTP" \
        --database-url "$DATABASE_URL" >"$state/center.log" 2>&1 </dev/null &
    CENTER_PID=$!
    write_env
    export INVENTORY_CENTER="http://127.0.0.1:$CENTER_GRPC"
    wait_for 30 "the center" "$CENTER_PID" "$state/center.log" "$BIN/invctl" item list

    for ch in "${channels[@]}"; do
        local g="AGENT_GRPC_$ch" h="AGENT_HTTP_$ch"
        log "agent $ch on 127.0.0.1:${!g} (metrics http://127.0.0.1:${!h}/metrics), pools in Redis"
        INVENTORY_CENTER_TOKEN_FILE="$state/secrets/agent-$ch.token" \
            INVENTORY_BACKEND_TOKENS_FILE="$state/secrets/backend.token" \
            nohup "$BIN/inventory-agent" --channel "$ch" --agent-id "$ch-local" --center "$INVENTORY_CENTER" \
            --listen "127.0.0.1:${!g}" --http-listen "127.0.0.1:${!h}" \
            --store redis --redis-url "redis://127.0.0.1:$REDIS_PORT" --redis-prefix "local:" \
            >"$state/agent-$ch.log" 2>&1 </dev/null &
        printf -v "AGENT_PID_$ch" '%s' $!
        write_env
    done
    for ch in "${channels[@]}"; do
        local h="AGENT_HTTP_$ch" p="AGENT_PID_$ch"
        wait_for 40 "agent $ch" "${!p}" "$state/agent-$ch.log" http_get "${!h}" /healthz
    done
    start_prometheus
    write_env
    log "stack up; state and logs in $state"
    cmd_status
}

# --- sale ----------------------------------------------------------------------------

# One buyer per line of output: "reserved" or "sold_out" (or the error). Like a channel
# backend, a buyer retries an UNAVAILABLE answer with the same idempotency key.
buy() {
    local url=$1 item=$2 from=$3 to=$4 i out attempt
    for ((i = from; i < to; i++)); do
        for attempt in 1 2 3 4 5; do
            if out=$(invctl_agent --agent "$url" -o json agent acquire "$item" --user "buyer-$i" \
                --key "$item-order-$i" 2>&1); then
                break
            fi
            [[ "$out" == *[Uu]navailable* && $attempt -lt 5 ]] || break
            sleep 0.3
        done
        case "$out" in
            *'"outcome": "reserved"'*) echo reserved ;;
            *'"outcome": '*) echo sold_out ;;
            *) echo "error: $out" ;;
        esac
    done
}

reserved_total() {
    local item=$1 sum=0 ch n
    for ch in "${channels[@]}"; do
        n=$(invctl_agent --agent "$(agent_url "$ch")" -o json agent stock "$item" | tr -d ' ,' | grep '^"reserved":' | cut -d: -f2)
        sum=$((sum + n))
    done
    echo "$sum"
}

cmd_sale() {
    load_env
    local total=${SALE_TOTAL:-300} buyers=${SALE_BUYERS:-450} item
    item="flash-$(date +%s)"
    local per=$(((buyers + ${#channels[@]} - 1) / ${#channels[@]}))
    log "sale: item $item, $total units, $buyers buyers over ${#channels[@]} channels at once"
    "$invctl" item create "$item" --total "$total" --per-user-limit 1 --low 5 --high 40 --batch 20
    local i=0 ch pids=()
    for ch in "${channels[@]}"; do
        buy "$(agent_url "$ch")" "$item" $((i * per)) $(((i + 1) * per > buyers ? buyers : (i + 1) * per)) \
            >"$state/sale-$ch.out" &
        pids+=($!)
        i=$((i + 1))
    done
    wait "${pids[@]}"
    local reserved=0 sold_out=0 errors=0
    for ch in "${channels[@]}"; do
        local r s e
        r=$(grep -c '^reserved$' "$state/sale-$ch.out" || true)
        s=$(grep -c '^sold_out$' "$state/sale-$ch.out" || true)
        e=$(grep -c '^error' "$state/sale-$ch.out" || true)
        printf '   %-8s reserved %4d  sold out %4d  errors %d\n' "$ch" "$r" "$s" "$e"
        reserved=$((reserved + r)) sold_out=$((sold_out + s)) errors=$((errors + e))
    done
    echo "reserved $reserved of $total units for $buyers buyers ($sold_out sold out, $errors errors)"
    ((errors == 0)) || { grep -h '^error' "$state"/sale-*.out | head -n3 >&2; die "some acquires failed"; }
    ((reserved <= total)) || die "oversold: $reserved reservations for $total units"

    # No stranded stock: units idle in one pool flow to channels that still have buyers.
    # Late buyers take whatever is left until every unit is reserved (bounded).
    local late=0 deadline=$((SECONDS + 30))
    while ((reserved < total && SECONDS < deadline)); do
        for ch in "${channels[@]}"; do
            buy "$(agent_url "$ch")" "$item" $((buyers + late)) $((buyers + late + 1)) >/dev/null
            late=$((late + 1))
        done
        reserved=$(reserved_total "$item")
    done
    ((late == 0)) || echo "late buyers: $late, reserved now $reserved"
    ((reserved == total)) || die "stranded stock: $reserved of $total units reserved after 30s of late buyers"
    echo "every unit reserved exactly once: $reserved of $total"
    echo "$item" >"$state/last-sale"
}

# --- bench ---------------------------------------------------------------------------

cmd_bench() {
    load_env
    local total=${BENCH_TOTAL:-2000} item ch agents=()
    item="bench-$(date +%s)"
    for ch in "${channels[@]}"; do agents+=(--agent "$(agent_url "$ch")"); done
    # For its first 10 s a center holds back lending an item while a pool reports more than
    # the ledger counts (a report read before a Return it has applied since, or commits a
    # promoted standby lost: it cannot tell yet), and Borrows answer UNAVAILABLE. The bench
    # measures the steady state, so it starts after that window.
    local started waited
    started=$(cat "$state/center-started" 2>/dev/null || echo 0)
    waited=$(($(date +%s) - started))
    ((waited >= 11)) || sleep $((11 - waited))
    "$invctl" item create "$item" --total "$total" --per-user-limit 2 >/dev/null
    log "inventory-bench acquire: 2 s on item $item ($total units) through the three agents, as a backend"
    # Users spread uniformly: each stays far below the agents' per-user rate limit.
    local bench=("$BIN/inventory-bench" acquire "${agents[@]}" --item "$item" --stock "$total"
        --duration 2s --concurrency 8 --connections 3 --skew uniform)
    INVENTORY_TOKEN_FILE="$state/secrets/backend.token" "${bench[@]}" --warmup 500ms --json "$state/bench.json" \
        >"$state/bench.out" 2>&1 ||
        die "inventory-bench failed: $(tail -n 3 "$state/bench.out")"
    grep -A2 '^calls/s' "$state/bench.out" | sed -n '1p;3p' | sed 's/^/   /'
    grep -q '"errors": [1-9]' "$state/bench.json" && die "inventory-bench saw errors: $(grep -A3 '"errors": {' "$state/bench.json" | tr -d '\n ')"
    grep -q '"ok": [1-9]' "$state/bench.json" || die "inventory-bench reserved nothing"
    # The token is what let it in: without it the agents refuse every call.
    env -u INVENTORY_TOKEN_FILE -u INVENTORY_TOKEN "${bench[@]}" --warmup 0s --requests 20 \
        --json "$state/bench-no-token.json" >"$state/bench-no-token.out" 2>&1 || true
    grep -q '"Unauthenticated": 20' "$state/bench-no-token.json" ||
        die "without the backends' token inventory-bench was not refused: $(tail -n 3 "$state/bench-no-token.out")"
    echo "   without the token: 20 of 20 calls refused (unauthenticated)"
}

# --- reconcile -----------------------------------------------------------------------

cmd_reconcile() {
    load_env
    log "waiting for every channel's report to match what it holds (heartbeats every ~3s)"
    local deadline=$((SECONDS + 30)) out
    until out=$("$invctl" -o json reconcile 2>&1) && [[ "$out" == *'"drifts": []'* ]]; do
        ((SECONDS < deadline)) || { echo "$out"; die "the ledger did not settle within 30s"; }
        sleep 0.5
    done
    if [[ -f "$state/last-sale" ]]; then
        "$invctl" item show "$(cat "$state/last-sale")"
        echo
    fi
    log "invariants"
    "$invctl" reconcile
    local drift
    drift=$(http_get "$CENTER_HTTP" /metrics | grep '^inventory_center_channel_drift_units' | awk '$2 != 0' || true)
    [[ -z "$drift" ]] || die "metrics show drift: $drift"
    echo "metrics: drift 0 on every channel (http://127.0.0.1:$CENTER_HTTP/metrics)"
    if alive "${PROM_PID:-}"; then
        # Every target scraped, the drift series there, and (once a scrape has come after
        # the ledger settled: Prometheus only knows what it last scraped) drift 0 in them.
        local targets=$((1 + ${#channels[@]})) deadline=$((SECONDS + 60)) up="" drifting=""
        until up=$(http_get "$PROM_PORT" '/api/v1/query?query=sum(up)') && [[ "$up" == *"\"$targets\"]"* ]] &&
            drifting=$(http_get "$PROM_PORT" '/api/v1/query?query=inventory:channel_drift_units:abs') &&
            [[ "$drifting" == *'"result":[{'* ]] && [[ "$drifting" != *'"value":[1'*',"'[1-9]* ]]; do
            ((SECONDS < deadline)) || die "Prometheus: not all $targets targets up with drift 0 after 60s: $up $drifting"
            sleep 0.5
        done
        local alerts
        alerts=$(http_get "$PROM_PORT" /api/v1/alerts | grep -o '"alertname":"[A-Za-z]*"' | sort -u | tr '\n' ' ' || true)
        echo "prometheus: $targets/$targets targets up, drift 0 in the recording rule; alerts: ${alerts:-none}"
        echo "            http://127.0.0.1:$PROM_PORT/alerts"
    fi
}

# --- status / stop -------------------------------------------------------------------

cmd_status() {
    load_env
    local ch
    printf '   %-14s %-8s %s\n' center "$(alive "$CENTER_PID" && echo up || echo down)" \
        "grpc $INVENTORY_CENTER  console http://127.0.0.1:$CENTER_HTTP/  metrics /metrics"
    for ch in "${channels[@]}"; do
        local p="AGENT_PID_$ch" h="AGENT_HTTP_$ch"
        printf '   %-14s %-8s %s\n' "agent $ch" "$(alive "${!p}" && echo up || echo down)" \
            "grpc $(agent_url "$ch")  metrics http://127.0.0.1:${!h}/metrics"
    done
    printf '   %-14s %-8s %s\n' redis "$(alive "$REDIS_PID" && echo up || echo down)" "redis://127.0.0.1:$REDIS_PORT"
    printf '   %-14s %-8s %s\n' postgres "$PG_MODE" "$DATABASE_URL"
    if [[ -n "${PROM_PID:-}" ]]; then
        printf '   %-14s %-8s %s\n' prometheus "$(alive "$PROM_PID" && echo up || echo down)" "http://127.0.0.1:$PROM_PORT/"
    fi
    echo "   try: INVENTORY_CENTER=$INVENTORY_CENTER INVENTORY_TOKEN_FILE=$INVENTORY_TOKEN_FILE $invctl item list"
}

# SIGTERM and wait (bounded) for the process to exit.
stop_pid() {
    local pid=$1 what=$2 seconds=${3:-30}
    alive "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    local deadline=$((SECONDS + seconds))
    while alive "$pid"; do
        if ((SECONDS >= deadline)); then
            echo "   $what did not stop within ${seconds}s; killing it" >&2
            kill -KILL "$pid" 2>/dev/null || true
            return 0
        fi
        sleep 0.1
    done
}

cmd_stop() {
    load_env
    local ch failed=0
    log "draining the agents (SIGTERM: no new acquires, unreserved units back to the center)"
    for ch in "${channels[@]}"; do
        local p="AGENT_PID_$ch"
        if alive "${!p:-}"; then kill -TERM "${!p}" 2>/dev/null || true; fi
    done
    for ch in "${channels[@]}"; do
        local p="AGENT_PID_$ch"
        stop_pid "${!p:-}" "agent $ch" 30
    done
    if alive "${CENTER_PID:-}"; then
        log "ledger after the drain (only reserved units stay with the channels)"
        "$invctl" item list || true
        "$invctl" reconcile || failed=1
        stop_pid "$CENTER_PID" center 45
    fi
    stop_pid "${PROM_PID:-}" prometheus 20
    if alive "${REDIS_PID:-}"; then
        redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
        stop_pid "$REDIS_PID" redis 10
    fi
    case "${PG_MODE:-}" in
        private)
            as_pg "$(pg_bin pg_ctl)" -D "$state/pg/data" -m fast -w stop >/dev/null 2>&1 || true
            ;;
        system)
            psql -q "$PG_SERVER_URL" -c "DROP DATABASE IF EXISTS $PG_DB WITH (FORCE)" >/dev/null 2>&1 || true
            ;;
    esac
    if [[ "${INVENTORY_LOCAL_KEEP:-0}" == 1 ]]; then
        log "stopped; state and logs kept in $state"
    else
        rm -rf "$state"
        log "stopped; state removed"
    fi
    ((failed == 0)) || die "reconcile reported a violation"
}

cmd_all() {
    trap 'status=$?; if ((status != 0)) && [[ -f "$envfile" ]]; then
            echo "run.sh: failed; logs:" >&2; tail -n 20 "$state"/*.log >&2 || true; INVENTORY_LOCAL_KEEP=0 cmd_stop || true; fi' EXIT
    cmd_start
    cmd_sale
    cmd_bench
    cmd_reconcile
    trap - EXIT
    cmd_stop
}

case "${1:-}" in
    start) cmd_start ;;
    sale) cmd_sale ;;
    bench) cmd_bench ;;
    reconcile) cmd_reconcile ;;
    status) cmd_status ;;
    stop) cmd_stop ;;
    all) cmd_all ;;
    *)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 2
        ;;
esac
