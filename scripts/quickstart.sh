#!/usr/bin/env bash
# Runs the product on its embedded defaults: a center on a SQLite file and two agents
# ("app" and "web") with in-memory pools, and the reference channel backend (HTTP) over
# the app agent. Nothing to install. It runs without tokens
# (--insecure, on 127.0.0.1 only); see README.md for tokens and TLS. Then it creates an item,
# runs a small sale through both agents with invctl, and shows the ledger.
#
#   scripts/quickstart.sh            build (release), run the demo, keep serving until Ctrl-C
#   scripts/quickstart.sh --exit     stop after the demo (used by CI)
#   scripts/quickstart.sh --debug    use the debug build (faster to build)
#
# Environment: QUICKSTART_PROFILE=debug (same as --debug), QUICKSTART_PORT_BASE=N (ports
# N+1..N+7 instead of the defaults), CARGO_TARGET_DIR (where cargo builds) is honoured.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${QUICKSTART_PROFILE:-release}
stay=1
for arg in "$@"; do
    case "$arg" in
        --exit) stay=0 ;;
        --debug) profile=debug ;;
        *) echo "usage: $0 [--exit] [--debug]" >&2; exit 2 ;;
    esac
done

if [ "$profile" = release ]; then cargo build --release --bins; else cargo build --bins; fi
# Cargo's own answer, so CARGO_TARGET_DIR and build.target-dir in a config file both count.
target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="${target:-target}/$profile"
for b in inventory-center inventory-agent invctl channel-backend; do
    [ -x "$bin/$b" ] || { echo "quickstart: $bin/$b is missing after the build" >&2; exit 1; }
done
work="$(mktemp -d)"
pids=()
cleanup() {
    local status=$?
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "$status" -ne 0 ]; then
        # Show what the servers said before they go.
        for log in "$work"/*.log; do
            [ -f "$log" ] && { echo "--- $(basename "$log") (last lines)" >&2; tail -n 40 "$log" >&2; }
        done
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Waits (up to 60 s) until "$@" succeeds; fails at once if the server (PID) has exited,
# else after 60 s, showing the named log either way.
ready() {
    local log="$1" pid="$2"; shift 2
    for _ in $(seq 1 600); do
        # Bounded: a port held by something else may accept and never answer.
        timeout 2 "$@" >/dev/null 2>&1 && return 0
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "quickstart: the server logging to $log exited; its log:" >&2
            cat "$work/$log" >&2 || true
            exit 1
        fi
        sleep 0.1
    done
    echo "quickstart: not ready after 60 s: $*; its log ($log):" >&2
    cat "$work/$log" >&2 || true
    exit 1
}

# Ports: the brief's defaults, unless QUICKSTART_PORT_BASE moves them (e.g. in CI).
base="${QUICKSTART_PORT_BASE:-}"
center_grpc=${base:+$((base + 1))}; center_grpc=${center_grpc:-50051}
center_http=${base:+$((base + 2))}; center_http=${center_http:-9464}
app_grpc=${base:+$((base + 3))}; app_grpc=${app_grpc:-50052}
app_http=${base:+$((base + 4))}; app_http=${app_http:-9465}
web_grpc=${base:+$((base + 5))}; web_grpc=${web_grpc:-50053}
web_http=${base:+$((base + 6))}; web_http=${web_http:-9466}
backend_http=${base:+$((base + 7))}; backend_http=${backend_http:-8080}

# A plain HTTP/1.1 request over bash's /dev/tcp (no curl needed): METHOD PATH [BODY].
http() {
    local body="${3:-}"
    exec 3<>"/dev/tcp/127.0.0.1/$backend_http" || return 1
    printf '%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %s\r\n\r\n%s' \
        "$1" "$2" "${#body}" "$body" >&3
    # The status line and the body (which ends without a newline).
    timeout 10 cat <&3 | sed -n '1p;$p'
    echo
    exec 3<&-
}

export RUST_LOG="${RUST_LOG:-warn}"
"$bin/inventory-center" --listen "127.0.0.1:$center_grpc" --http-listen "127.0.0.1:$center_http" \
    --database-url "sqlite://$work/inventory.db" --insecure >"$work/center.log" 2>&1 &
pids+=($!)
center_pid=$!
export INVENTORY_CENTER="http://127.0.0.1:$center_grpc"
invctl="$bin/invctl"
ready center.log "$center_pid" "$invctl" item list

echo "== create an item: 100 units, at most 2 per user"
"$invctl" item create launch-bundle --total 100 --per-user-limit 2 --low 5 --high 30 --batch 10

for ch in app web; do
    if [ "$ch" = app ]; then g=$app_grpc; h=$app_http; else g=$web_grpc; h=$web_http; fi
    "$bin/inventory-agent" --channel "$ch" --agent-id "$ch-1" --center "$INVENTORY_CENTER" \
        --listen "127.0.0.1:$g" --http-listen "127.0.0.1:$h" --store memory \
        --memory-state-file "$work/agent-$ch.pools.json" --insecure >"$work/agent-$ch.log" 2>&1 &
    pids+=($!)
    printf -v "pid_$ch" '%s' $!
done
ready agent-app.log "$pid_app" "$invctl" --agent "http://127.0.0.1:$app_grpc" agent stock launch-bundle
ready agent-web.log "$pid_web" "$invctl" --agent "http://127.0.0.1:$web_grpc" agent stock launch-bundle
"$bin/channel-backend" --listen "127.0.0.1:$backend_http" --agent "http://127.0.0.1:$app_grpc" \
    >"$work/channel-backend.log" 2>&1 &
pids+=($!)
backend_pid=$!
ready channel-backend.log "$backend_pid" bash -c "exec 3<>/dev/tcp/127.0.0.1/$backend_http"

echo
echo "== a sale: 150 buyers, one unit each, through both channels"
reserved=0
for i in $(seq 1 150); do
    if [ $((i % 3)) -eq 0 ]; then g=$web_grpc; else g=$app_grpc; fi
    out=$("$invctl" --agent "http://127.0.0.1:$g" -o json agent acquire launch-bundle --user "buyer-$i" --quantity 1 --key "order-$i")
    case "$out" in *'"outcome": "reserved"'*) reserved=$((reserved + 1)) ;; esac
done
echo "reserved: $reserved of 150 attempts (100 units exist)"
echo
echo "== a replay of order-1 returns the same reservation"
"$invctl" --agent "http://127.0.0.1:$app_grpc" agent acquire launch-bundle --user buyer-1 --key order-1
echo
echo "== the pools, as each agent sees them"
"$invctl" --agent "http://127.0.0.1:$app_grpc" agent stock launch-bundle
"$invctl" --agent "http://127.0.0.1:$web_grpc" agent stock launch-bundle
echo
# Reports reach the center with each heartbeat; wait until the ledger is quiet.
for _ in $(seq 1 100); do
    "$invctl" -o json reconcile | grep -q '"drifts": \[\]' && break
    sleep 0.2
done
echo "== the ledger at the center"
"$invctl" item show launch-bundle
echo
echo "== invariants"
"$invctl" reconcile
if [ "$reserved" -ne 100 ]; then echo "expected exactly 100 reservations, got $reserved" >&2; exit 1; fi
echo
echo "== the channel backend's HTTP API (http://127.0.0.1:$backend_http): an order after the sell-out, the item"
order=$(http POST /orders '{"order_id":"web-order-1","item_id":"launch-bundle","user_id":"late-buyer","quantity":1}')
echo "$order"
case "$order" in *" 410 "*) ;; *) echo "expected 410 sold out from the backend" >&2; exit 1 ;; esac
http GET /items/launch-bundle
"$invctl" item create tote-bag --total 10 --per-user-limit 2 --low 1 --high 5 --batch 2 >/dev/null
tote='{"order_id":"web-order-2","item_id":"tote-bag","user_id":"buyer-1","quantity":1}'
echo "-- an order of another item, then the same order again (a replay: 200, the same reservation)"
first=$(http POST /orders "$tote")
echo "$first"
case "$first" in *" 201 "*) ;; *) echo "expected 201 from the backend" >&2; exit 1 ;; esac
http POST /orders "$tote"

if [ "$stay" = 1 ]; then
    echo
    echo "center: $INVENTORY_CENTER (metrics http://127.0.0.1:$center_http/metrics)"
    echo "agents: app http://127.0.0.1:$app_grpc, web http://127.0.0.1:$web_grpc"
    echo "backend: http://127.0.0.1:$backend_http (the channel backend over the app agent)"
    echo "try:    INVENTORY_CENTER=$INVENTORY_CENTER $invctl item show launch-bundle"
    echo "        curl -i -X POST http://127.0.0.1:$backend_http/orders -d '{\"order_id\":\"order-9001\",\"item_id\":\"tote-bag\",\"user_id\":\"me\",\"quantity\":1}'"
    echo "Ctrl-C stops everything."
    # From here a stop is the expected end, not a failure.
    trap 'exit 0' INT TERM
    wait
fi
