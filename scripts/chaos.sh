#!/usr/bin/env bash
# Chaos run of a local 3-node cluster (see tests/chaos_harness/mod.rs): a
# seeded fault schedule (SIGKILL, SIGSTOP/SIGCONT, SIGTERM) against 16
# workers on mutex keys (the official client) and a semaphore key of limit
# 3, then fencing (per slot for the semaphore), exclusion (at most 3
# holders), hang and convergence checks. By default it runs twice on the same seed, with
# --promotion-grace off and on, and compares.
#   scripts/chaos.sh [--duration SECS] [--seed N] [--promotion-grace SECS]
#                    [--grace off|on|both]
# Node logs, the fault log and a timeline: target/tmp/chaos/seed-N-grace-G/.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --bench chaos -- "$@"
