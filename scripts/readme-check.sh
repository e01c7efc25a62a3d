#!/usr/bin/env bash
# Runs every command of README.md's ```sh blocks, in order, as a user on a fresh clone
# would, and fails when one does not work. Servers (inventory-center, inventory-agent) run
# in the background until they answer /healthz; every other command must exit 0.
#
# The commands run as written, except for these rewrites, so that the check can run next
# to other work and in CI without a release build:
#   - ports: 127.0.0.1:50051/9464/50052/9465/50053/9466 and the Redis Cluster's 7000-7005
#     move to README_CHECK_PORT_BASE+1.. (default 27500; a server's default ports move
#     through INVENTORY_LISTEN / INVENTORY_HTTP_LISTEN / INVENTORY_CENTER);
#   - the build: debug instead of release (`cargo build --release`, `.../release`);
#   - /etc/inventory becomes a temporary directory; the PostgreSQL database `inventory`
#     gets a unique name (dropped at the end); the SQLite file of a center without
#     --database-url and the Redis key prefix are private too;
#   - `scripts/test.sh` is not run here (CI runs it as its own step); `scripts/quickstart.sh`
#     runs on the debug build with its ports moved, until it serves, then gets SIGTERM.
# It starts what the commands expect to exist: a Redis Cluster of six local processes for
# `--redis-cluster`. PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) must run.
# Finally it checks that a server which cannot start says why in one line, without a
# backtrace even with RUST_BACKTRACE=1.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

base=${README_CHECK_PORT_BASE:-27500}
work=$(mktemp -d)
db="inventory_readme_$$"
log() { printf '== %s\n' "$*"; }
die() { printf 'readme-check: %s\n' "$*" >&2; exit 1; }

declare -A moved=(
    [50051]=$((base + 1)) [9464]=$((base + 2)) [50052]=$((base + 3)) [9465]=$((base + 4))
    [50053]=$((base + 5)) [9466]=$((base + 6))
    [7000]=$((base + 10)) [7001]=$((base + 11)) [7002]=$((base + 12)) [7003]=$((base + 13))
    [7004]=$((base + 14)) [7005]=$((base + 15))
)
quickstart_base=$((base + 20))
# A cluster node's bus port is its port + 10000 unless set: 375xx lies in Linux's
# ephemeral range (32768-60999), where an outgoing connection may hold it for a moment.
# The bus ports are set just above the moved ports instead.
bus_offset=1000

# Servers this script started: pid -> kind, grpc port, http port, channel, store.
declare -A srv_kind=() srv_grpc=() srv_http=() srv_channel=() srv_store=()
cluster_pids=()

cleanup() {
    local status=$? pid
    for pid in "${!srv_kind[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${cluster_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    psql -q "postgres://postgres@127.0.0.1:5432/postgres" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" \
        >/dev/null 2>&1 || true
    if [ "$status" -ne 0 ]; then
        for f in "$work"/*.log; do
            [ -f "$f" ] && { echo "--- $(basename "$f") (last lines)" >&2; tail -n 20 "$f" >&2; }
        done
    fi
    rm -rf "$work"
}
trap cleanup EXIT

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

healthy() {
    local response
    response=$( (exec 3<>"/dev/tcp/127.0.0.1/$1" &&
        printf 'GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3 && timeout 5 cat <&3) 2>/dev/null) || return 1
    [[ "$response" == "HTTP/1."?" 200"* ]]
}

for p in "${moved[@]}" $(seq "$quickstart_base" $((quickstart_base + 7))) \
    $(seq $((${moved[7000]} + bus_offset)) $((${moved[7005]} + bus_offset))); do
    port_busy "$p" && die "port $p is in use; set README_CHECK_PORT_BASE to a free range"
done

# The commands of the README's sh blocks, one per line: comments dropped, continuation
# lines joined.
readme_commands() {
    awk '
        /^```sh[[:space:]]*$/ { inblock = 1; next }
        /^```/ { inblock = 0; next }
        !inblock { next }
        {
            line = $0
            if (line ~ /^[[:space:]]*#/) next
            sub(/[[:space:]]+#[[:space:]].*$/, "", line)
            sub(/^[[:space:]]+/, "", line)
            if (line ~ /\\$/) { sub(/[[:space:]]*\\$/, "", line); pending = pending line " "; next }
            line = pending line
            pending = ""
            if (line != "") print line
        }
    ' README.md
}

rewrite() {
    local cmd=$1 from
    for from in "${!moved[@]}"; do
        cmd=$(sed "s/127\.0\.0\.1:$from\b/127.0.0.1:${moved[$from]}/g" <<<"$cmd")
    done
    cmd=$(sed -e 's/^cargo build --release\b/cargo build/' -e 's#}/release:#}/debug:#' \
        -e "s#/etc/inventory#$work/etc-inventory#g" \
        -e "s#5432/inventory\b#5432/$db#g" -e "s#^\(createdb .*\) inventory\$#\1 $db#" <<<"$cmd")
    printf '%s\n' "$cmd"
}

# flag_value COMMAND --flag: the flag's value in COMMAND (`--flag v` or `--flag=v`), if any.
flag_value() {
    local -a words
    read -ra words <<<"$1"
    local i
    for ((i = 0; i < ${#words[@]}; i++)); do
        case "${words[$i]}" in
            "$2") echo "${words[$((i + 1))]:-}"; return ;;
            "$2"=*) echo "${words[$i]#*=}"; return ;;
        esac
    done
}

port_of() { local addr=$1; echo "${addr##*:}"; }

stop_server() {
    local pid=$1
    [ -n "${srv_kind[$pid]:-}" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    unset "srv_kind[$pid]" "srv_grpc[$pid]" "srv_http[$pid]" "srv_channel[$pid]" "srv_store[$pid]"
}

start_cluster() {
    [ ${#cluster_pids[@]} -eq 0 ] || return 0
    log "a Redis Cluster for --redis-cluster: three masters and three replicas on 127.0.0.1:${moved[7000]}-${moved[7005]}"
    local p nodes=()
    mkdir -p "$work/cluster"
    for p in 7000 7001 7002 7003 7004 7005; do
        p=${moved[$p]}
        redis-server --bind 127.0.0.1 --port "$p" --cluster-port $((p + bus_offset)) --cluster-enabled yes --cluster-config-file "$work/cluster/nodes-$p.conf" \
            --dir "$work/cluster" --save "" --appendonly no --logfile "$work/cluster-$p.log" &
        cluster_pids+=($!)
        nodes+=("127.0.0.1:$p")
    done
    for p in "${nodes[@]}"; do
        local deadline=$((SECONDS + 10))
        until redis-cli -p "${p#*:}" ping >/dev/null 2>&1; do
            ((SECONDS < deadline)) || die "Redis node $p did not start"
            sleep 0.1
        done
    done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$work/cluster-create.log" 2>&1 ||
        die "redis-cli --cluster create failed: $(tail -n 3 "$work/cluster-create.log")"
    local deadline=$((SECONDS + 30))
    for p in "${nodes[@]}"; do
        until redis-cli -p "${p#*:}" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; do
            ((SECONDS < deadline)) || die "the Redis Cluster did not become ready"
            sleep 0.2
        done
    done
}

serve() {
    local cmd=$1 kind=$2 grpc_default http_default
    if [ "$kind" = center ]; then
        grpc_default="127.0.0.1:${moved[50051]}" http_default="127.0.0.1:${moved[9464]}"
    else
        grpc_default="127.0.0.1:${moved[50052]}" http_default="127.0.0.1:${moved[9465]}"
    fi
    local grpc http channel store
    grpc=$(port_of "$(flag_value "$cmd" --listen)"); grpc=${grpc:-${grpc_default##*:}}
    http=$(port_of "$(flag_value "$cmd" --http-listen)"); http=${http:-${http_default##*:}}
    channel=$(flag_value "$cmd" --channel)
    store="$(flag_value "$cmd" --redis-cluster)"
    [ -n "$store" ] || store="$(flag_value "$cmd" --store)@$(flag_value "$cmd" --redis-url)"
    [[ "$cmd" == *--redis-cluster* ]] && start_cluster

    # What a user would have stopped first: a server on the same port (its agents with a
    # center), and agents of this channel on another store.
    local pid
    for pid in "${!srv_kind[@]}"; do
        [ -n "${srv_kind[$pid]:-}" ] || continue # stopped earlier in this loop
        if [ "${srv_grpc[$pid]}" = "$grpc" ] || [ "${srv_http[$pid]}" = "$http" ]; then
            if [ "${srv_kind[$pid]}" = center ]; then
                local a
                for a in "${!srv_kind[@]}"; do
                    if [ "${srv_kind[$a]}" = agent ]; then stop_server "$a"; fi
                done
            fi
            stop_server "$pid"
        elif [ "$kind" = agent ] && [ "${srv_kind[$pid]:-}" = agent ] && [ "${srv_channel[$pid]}" = "$channel" ] &&
            [ "${srv_store[$pid]}" != "$store" ]; then
            stop_server "$pid"
        fi
    done

    local n=${#srv_kind[@]} logfile
    logfile="$work/server-$SECONDS-$n-$kind.log"
    (
        export INVENTORY_LISTEN="$grpc_default" INVENTORY_HTTP_LISTEN="$http_default"
        eval "exec $cmd"
    ) >"$logfile" 2>&1 &
    pid=$!
    srv_kind[$pid]=$kind srv_grpc[$pid]=$grpc srv_http[$pid]=$http srv_channel[$pid]=$channel srv_store[$pid]=$store
    local deadline=$((SECONDS + 60))
    until healthy "$http"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            cat "$logfile" >&2
            die "exited at start: $cmd"
        fi
        ((SECONDS < deadline)) || die "no answer on /healthz (port $http) after 60 s: $cmd"
        sleep 0.1
    done
}

quickstart() {
    local out="$work/quickstart.log"
    QUICKSTART_PROFILE=debug QUICKSTART_PORT_BASE=$quickstart_base scripts/quickstart.sh >"$out" 2>&1 &
    local pid=$! deadline=$((SECONDS + 300))
    until grep -q 'Ctrl-C stops everything' "$out"; do
        kill -0 "$pid" 2>/dev/null || { cat "$out" >&2; die "scripts/quickstart.sh exited before serving"; }
        ((SECONDS < deadline)) || die "scripts/quickstart.sh did not finish its demo within 300 s"
        sleep 0.2
    done
    # Its own hint, as printed, must work.
    local hint
    hint=$(sed -n 's/^try: *//p' "$out")
    [ -n "$hint" ] || die "scripts/quickstart.sh printed no try: hint"
    eval "$hint" >/dev/null || die "the quickstart's hint failed: $hint"
    kill -TERM "$pid"
    local status=0
    wait "$pid" || status=$?
    [ "$status" -eq 0 ] || { cat "$out" >&2; die "scripts/quickstart.sh exited $status on SIGTERM"; }
    port_busy $((quickstart_base + 1)) && die "the quickstart's center still serves after SIGTERM"
    return 0
}

export RUST_LOG=warn
export INVENTORY_CENTER="http://127.0.0.1:${moved[50051]}" INVENTORY_AGENT="http://127.0.0.1:${moved[50052]}"
export INVENTORY_DATABASE_URL="sqlite://$work/inventory.db" INVENTORY_REDIS_PREFIX="readme-check-$$:"
unset INVENTORY_TOKEN INVENTORY_TOKEN_FILE INVENTORY_INSECURE

count=0
while IFS= read -r original; do
    count=$((count + 1))
    cmd=$(rewrite "$original")
    log "$original"
    [ "$cmd" = "$original" ] || echo "   (run as: $cmd)"
    case "$cmd" in
        scripts/test.sh*) echo "   (skipped: CI runs the test suite as its own step)" ;;
        scripts/quickstart.sh) quickstart ;;
        inventory-center*) serve "$cmd" center ;;
        inventory-agent*) serve "$cmd" agent ;;
        *) eval "$cmd" || die "failed (exit $?): $cmd" ;;
    esac
done < <(readme_commands)
((count > 10)) || die "found only $count commands in README.md's sh blocks"

log "a server that cannot start says why in one line, even with RUST_BACKTRACE=1"
for args in "inventory-center" "inventory-agent --channel app"; do
    status=0
    # shellcheck disable=SC2086
    RUST_BACKTRACE=1 INVENTORY_LISTEN="127.0.0.1:${moved[50051]}" INVENTORY_HTTP_LISTEN="127.0.0.1:${moved[9464]}" \
        $args >"$work/refused.out" 2>"$work/refused.err" </dev/null || status=$?
    [ "$status" -eq 1 ] || die "$args without tokens: exit $status, expected 1"
    [ "$(wc -l <"$work/refused.err")" -eq 1 ] || { cat "$work/refused.err" >&2; die "$args: not one line on stderr"; }
    grep -q "^${args%% *}: .*--insecure" "$work/refused.err" || { cat "$work/refused.err" >&2; die "$args: unexpected message"; }
    echo "   $(cat "$work/refused.err")"
done

log "README.md: all $count commands work"
