#!/usr/bin/env bash
# The one-command benchmark (see BENCHMARKS.md): builds inventory-bench once in release
# and runs every measurement side by side on this machine, against the local PostgreSQL
# and Redis (INVENTORY_TEST_DATABASE_URL, INVENTORY_TEST_REDIS_URL; loopback only).
# It starts its own center and agents in-process, in a fresh database and under a private
# Redis key prefix, and removes both afterwards. The table goes to stdout, the JSON to
# bench-results/latest.json (--output FILE to change).
#
#   scripts/bench.sh            # the full run, about 2 minutes
#   scripts/bench.sh --quick    # about a second per measurement (what CI runs)
#   scripts/bench.sh --debug --quick   # skip the release build
#   scripts/bench.sh --only c,d --duration 30s   # some phases, longer (for profiling)
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
args=()
for a in "$@"; do
    case "$a" in
        --debug) profile=debug ;;
        *) args+=("$a") ;;
    esac
done

if [[ $profile == release ]]; then
    cargo build --release -p inventory-bench
else
    cargo build -p inventory-bench
fi
exec "target/$profile/inventory-bench" suite "${args[@]}"
