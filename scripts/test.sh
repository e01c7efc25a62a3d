#!/usr/bin/env bash
# Runs the whole test suite against the local PostgreSQL and Redis
# (INVENTORY_TEST_DATABASE_URL / INVENTORY_TEST_REDIS_URL override them).
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --workspace --locked "$@"
