#!/usr/bin/env bash
# Failover timing of local 2- and 3-node clusters (see benches/failover.rs).
#   scripts/failover.sh [--rounds N] [--detect SECS]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --bench failover -- "$@"
