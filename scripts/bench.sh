#!/usr/bin/env bash
# The one-command benchmark (see BENCHMARKS.md): builds inventory-bench once in release
# and runs every measurement side by side on this machine, against the local PostgreSQL
# and Redis (INVENTORY_TEST_DATABASE_URL, INVENTORY_TEST_REDIS_URL; loopback only).
# It starts its own center and agents in-process, in a fresh database and under a private
# Redis key prefix, and removes both afterwards (figure (iv), the opening second, on a
# database and center of its own). The table goes to stdout, the JSON to
# bench-results/latest.json (--output FILE to change). Then figure (i) of segmented stock:
# acquire.lua straight from Rust for one hot item in 1 and in 8 segments on a private
# 3-master Redis Cluster it starts (redis-server and redis-cli needed), with the Redis CPU
# per call; table to stdout, JSON to bench-results/segments.json. Before it, the Redis bytes
# per live reservation: a million live reservations in one pool (50,000 with --quick) on a
# private redis-server it starts and kills; JSON to bench-results/memory.json.
#
#   scripts/bench.sh            # the full run, 8 to 15 minutes by the hour
#   scripts/bench.sh --quick    # about a second per measurement (what CI runs)
#   scripts/bench.sh --debug --quick   # skip the release build
#   scripts/bench.sh --only c,d --duration 30s   # some phases, longer (for profiling; no figure (i) of segments)
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
args=()
segment_secs=5s
memory_args=()
segments=yes
for a in "$@"; do
    case "$a" in
        --debug) profile=debug ;;
        --quick) segment_secs=1s; memory_args+=(--quick); args+=("$a") ;;
        --only|--only=*) segments=no; args+=("$a") ;;
        *) args+=("$a") ;;
    esac
done

if [[ $profile == release ]]; then
    cargo build --release -p inventory-bench
else
    cargo build -p inventory-bench
fi
bench="${CARGO_TARGET_DIR:-target}/$profile/inventory-bench"
"$bench" suite "${args[@]}"
[[ $segments == yes ]] || exit 0
mkdir -p bench-results
"$bench" memory "${memory_args[@]}" --output bench-results/memory.json
exec "$bench" segments --duration "$segment_secs" --output bench-results/segments.json
