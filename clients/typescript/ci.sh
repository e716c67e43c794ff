#!/usr/bin/env bash
# CI for the TypeScript client (baton-locks), run from the repository root:
#   bash clients/typescript/ci.sh
# npm ci, the strict type check, the build, the tests (node --test, against
# real batond processes: $BATON_BATOND, else target/release/batond, which
# `cargo build --release` makes), and the packed package installed into a
# fresh project. Every step is bounded in time.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root/clients/typescript"
export BATON_BATOND="${BATON_BATOND:-$root/target/release/batond}"
if [ ! -x "$BATON_BATOND" ]; then
  echo "no batond at $BATON_BATOND: cargo build --release, or set BATON_BATOND" >&2
  exit 1
fi

step() { echo "--- typescript: $1"; }
step "npm ci"
timeout 300 npm ci --no-audit --no-fund
step "type check (tsc --strict)"
timeout 180 npx tsc -p tsconfig.json --noEmit --strict
step "build"
timeout 180 npm run build
step "build and type-check the tests"
timeout 180 npm run build:test
step "node --test"
timeout 600 node --test --test-concurrency=1 dist-test/
step "npm pack, installed into a fresh project"
timeout 300 bash scripts/check-pack.sh
step "ok"
