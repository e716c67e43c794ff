#!/usr/bin/env bash
# CI for the Java client, run from the repository root: bash clients/java/ci.sh
# Builds, tests (against target/release/batond, which `cargo build --release`
# or `cargo test --release` leaves there; BATON_BATOND overrides it),
# checks the javadoc and packages the jar. Needs JDK 17+ and Maven 3.8+;
# the first run downloads the plugins and JUnit from Maven Central, later
# runs work offline from ~/.m2.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
export BATON_BATOND="${BATON_BATOND:-$root/target/release/batond}"
if [ ! -x "$BATON_BATOND" ]; then
    echo "clients/java/ci.sh: no batond at $BATON_BATOND (cargo build --release first)" >&2
    exit 1
fi
# Maven asks Central only for what ~/.m2 lacks (no snapshots are used).
exec timeout 900 mvn -q -B -f "$root/clients/java/pom.xml" verify
