#!/usr/bin/env bash
# Partition run of a local baton cluster (see benches/partition.rs): every
# node in a network namespace of its own, joined by a bridge, packets dropped
# per direction with iptables while the processes keep running (isolate the
# active or a standby, one-way cuts, a bridge partition, clients cut off the
# active; blips shorter than --detect and partitions longer than it), a
# seeded schedule, 8 workers with a fenced resource, and the checks of the
# chaos run plus "a split brain ends within 2 x --detect of the heal" and
# "a blip changes no role".
#
#   scripts/partition.sh [--nodes 2|3] [--duration SECS] [--seed N] [--detect SECS]
#
# Needs root, ip (iproute2) and iptables. It creates only its own namespaces
# (bp<pid>-*) with addresses in 10.213.0.0/24 that exist only inside them, and
# always removes them (also if interrupted). Node logs and the report:
# target/tmp/partition/nodes-N-seed-S/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "partition.sh: needs root (network namespaces, veth pairs, a bridge and iptables); run it as root, or use scripts/chaos.sh" >&2
  exit 2
fi
for tool in ip iptables; do
  if ! command -v "$tool" >/dev/null; then
    echo "partition.sh: needs $tool (apt-get install iproute2 iptables)" >&2
    exit 2
  fi
done
cleanup() {
  # The harness removes its namespaces itself; this catches a harness that
  # was killed before it could.
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E '^bp[0-9]+-(br|cl|n[0-9])$' || true); do
    pid=${ns#bp}
    pid=${pid%%-*}
    if ! kill -0 "$pid" 2>/dev/null; then ip netns del "$ns" 2>/dev/null || true; fi
  done
}
trap cleanup EXIT
cleanup
cargo bench --bench partition -- "$@"
