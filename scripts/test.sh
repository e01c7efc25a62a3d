#!/usr/bin/env bash
# Runs the whole test suite against the local PostgreSQL, Redis and NATS
# (INVENTORY_TEST_DATABASE_URL / INVENTORY_TEST_REDIS_URL override the first two). Starts
# them when they are down and installs the tools some tests call (scripts/test-env.sh), so
# a fresh machine needs nothing done by hand first.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/test-env.sh
ensure_test_env
exec cargo test --workspace --locked "$@"
