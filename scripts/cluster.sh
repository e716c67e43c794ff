#!/usr/bin/env bash
# Start, stop and inspect a local baton cluster on loopback.
#
#   scripts/cluster.sh start [N] [BASE_PORT]   start N nodes (default 3) on
#                                              127.0.0.1:BASE_PORT.. (default 7373)
#   scripts/cluster.sh status                  print `I` of every node
#   scripts/cluster.sh stop                    SIGTERM every node (graceful), wait
#   scripts/cluster.sh kill NODE               SIGKILL node NODE (0-based)
#   scripts/cluster.sh restart NODE            start node NODE again
#
# Extra batond flags can be given in $BATOND_FLAGS (e.g. "--detect 0.5").
# State (PIDs, logs, and the cluster key the nodes share, made on the first
# start with 32 random bytes, mode 600) lives in
# ${BATON_CLUSTER_DIR:-/tmp/baton-cluster}.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BATON_CLUSTER_DIR:-/tmp/baton-cluster}
bin=target/release/batond

peers_of() { # N BASE
  local n=$1 base=$2 list="" i
  for ((i = 0; i < n; i++)); do list+="${list:+,}127.0.0.1:$((base + i))"; done
  echo "$list"
}

start_node() { # I
  local i=$1 n base port
  n=$(cat "$dir/n") base=$(cat "$dir/base")
  port=$((base + i))
  # shellcheck disable=SC2086
  "$bin" --bind 127.0.0.1 --port "$port" --peers "$(peers_of "$n" "$base")" \
    --cluster-key-file "$dir/cluster.key" ${BATOND_FLAGS:-} \
    >>"$dir/node$i.log" 2>&1 &
  echo $! >"$dir/node$i.pid"
  echo "node $i: 127.0.0.1:$port pid $! log $dir/node$i.log"
}

info() { # PORT
  python3 - "$1" <<'PY'
import socket, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)
    s.sendall(b"I\n")
    s.settimeout(1)
    print(s.recv(4096).decode().strip())
except OSError as e:
    print(f"down ({e})")
PY
}

case ${1:-} in
start)
  n=${2:-3} base=${3:-7373}
  mkdir -p "$dir"
  if [ ! -s "$dir/cluster.key" ]; then
    (umask 077 && head -c 32 /dev/urandom | base64 >"$dir/cluster.key")
  fi
  echo "$n" >"$dir/n"
  echo "$base" >"$dir/base"
  cargo build --release --bin batond -q
  for ((i = 0; i < n; i++)); do start_node "$i"; done
  ;;
status)
  n=$(cat "$dir/n") base=$(cat "$dir/base")
  for ((i = 0; i < n; i++)); do echo "node $i: $(info $((base + i)))"; done
  ;;
stop)
  for f in "$dir"/node*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$f"
  done
  echo "stopped"
  ;;
kill)
  kill -KILL "$(cat "$dir/node$2.pid")" && echo "node $2 killed"
  ;;
restart)
  start_node "$2"
  ;;
*)
  sed -n '2,13p' "$0"
  exit 2
  ;;
esac
