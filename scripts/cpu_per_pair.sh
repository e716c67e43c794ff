#!/usr/bin/env bash
# Server CPU per acquire + release pair, read by a load generator that is
# not the project's harness (issue 44): a plain mio client (C=50, depth 1
# and 16, random keys) against batond, batond --echo and a minimal mio
# echo, each node also with --busy-poll-us 0, in one interleaved run, the
# load generator on a CPU of its own and the servers on the others.
#
#   scripts/cpu_per_pair.sh                  3 rounds of 2 s windows (about 2 minutes)
#   scripts/cpu_per_pair.sh --quick          1 round of 1 s windows
#   scripts/cpu_per_pair.sh -- OPTIONS...    more options, e.g. --rounds 5 --depths 16
#                                            (see: cargo bench --bench plain_cpu -- --help)
#   BATOND_FLAGS='--threads 1' scripts/cpu_per_pair.sh
#                                            extra flags for every batond started
#   BATOND=/path/to/batond scripts/cpu_per_pair.sh
#                                            another build of batond (to compare)
#
# Builds release; the bench (benches/plain_cpu.rs) starts every server on a
# free 127.0.0.1 port, prints Markdown tables on stdout (progress on
# stderr), and stops every process it started.
set -euo pipefail
cd "$(dirname "$0")/.."

args=()
while [ $# -gt 0 ]; do
  case $1 in
  --quick) args+=(--quick) ;;
  --)
    shift
    args+=("$@")
    break
    ;;
  -h | --help)
    sed -n '2,19p' "$0"
    exit 0
    ;;
  *)
    echo "cpu_per_pair.sh: unknown option $1 (see --help)" >&2
    exit 2
    ;;
  esac
  shift
done

echo "cpu_per_pair.sh: building (release)..." >&2
cargo build --release --bin batond -q
bench_bin=$(cargo bench --bench plain_cpu --no-run --message-format=json -q 2>/dev/null |
  grep '"name":"plain_cpu"' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
if [ -z "$bench_bin" ] || [ ! -x "$bench_bin" ]; then
  echo "cpu_per_pair.sh: cannot find the plain_cpu binary" >&2
  exit 1
fi
exec "$bench_bin" --batond "${BATOND:-target/release/batond}" "${args[@]}"
