#!/usr/bin/env bash
# Benchmark baton and compare it with a Redis lock, side by side (issue 6).
#
#   scripts/bench.sh                  full run (about 8 minutes)
#   scripts/bench.sh --quick          short windows, one round (1-2 minutes)
#   scripts/bench.sh --no-redis       leave Redis out even if it is installed
#   scripts/bench.sh --no-etcd        leave etcd out (the etcd rows)
#   scripts/bench.sh -- --only etcd   the etcd rows alone: etcd, baton and Redis
#                                     side by side (installs etcd-server as root)
#   BATOND_FLAGS='--busy-poll-us 0' scripts/bench.sh
#                                     extra flags for every batond started
#   BATOND=/path/to/batond scripts/bench.sh
#                                     another build of batond (to compare)
#   scripts/bench.sh [--quick] -- OPTIONS...
#                                     more lockbench options, e.g. --only sweep
#                                     (see: cargo bench --bench lockbench -- --help)
#
# Builds release; starts, on free 127.0.0.1 ports, batond with the default
# --threads and with --threads 1 (when that is not the default), batond
# --echo (both settings: the floor), a 2-node cluster with default flags
# (the active with its standby attached and synced: the deployed rows, with
# the CPU time of both processes), fresh servers for the memory rows, and
# redis-server when it is installed (alone, and a master with a replica),
# batond and redis-server with TLS (the TLS rows), and batond and
# redis-server allowing more connections than the most watchers (the watch
# rows; the semaphore rows use the first batond and redis-server), and a
# fresh batond and redis-server for the connection-storm rows, a 2-node
# cluster for the join row (whose standby the harness stops and resumes;
# --max-keys JOIN_MAX_KEYS, default 11000000, for --join-keys up to 10M),
# and a second 2-node cluster for the fleet row (whose active the harness
# kills) (the
# Redis rows are left out with a note when it is not installed); for the
# etcd rows (section etcd: when --only names it or is not given), etcd
# (Debian's etcd-server, installed when missing and run as root; the rows
# are left out with a note when it cannot be had) with its default flags:
# one member with its data on disk (under target/), one on tmpfs, two
# clusters of three members on disk, and four baton clusters of 2 and 3
# nodes (default flags) whose leaders the harness kills or freezes; runs
# the harness (benches/lockbench.rs); prints its Markdown tables on stdout
# (progress on stderr); and stops every process it started, by PID, and
# removes etcd's data, when it exits.
set -euo pipefail
cd "$(dirname "$0")/.."

harness_args=()
shown_args=("$@")
use_redis=yes
use_etcd=yes
while [ $# -gt 0 ]; do
  case $1 in
  --quick) harness_args+=(--quick) ;;
  --no-redis) use_redis=no ;;
  --no-etcd) use_etcd=no ;;
  --)
    shift
    harness_args+=("$@")
    break
    ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d'
    exit 0
    ;;
  *)
    echo "bench.sh: unknown option $1 (see --help)" >&2
    exit 2
    ;;
  esac
  shift
done

work=$(mktemp -d "${TMPDIR:-/tmp}/baton-bench.XXXXXX")
pids=()
etcd_dirs=() # etcd data, on disk and on tmpfs: removed at exit
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work" "${etcd_dirs[@]}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# The watch rows hold 10,000 watcher connections: raise the open-file limit
# (for the harness and every server started below) as far as allowed.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

echo "bench.sh: building (release)..." >&2
cargo build --release --bin batond -q
bench_bin=$(cargo bench --bench lockbench --no-run --message-format=json -q 2>/dev/null |
  grep '"name":"lockbench"' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
if [ -z "$bench_bin" ] || [ ! -x "$bench_bin" ]; then
  echo "bench.sh: cannot find the lockbench binary" >&2
  exit 1
fi
batond=${BATOND:-target/release/batond} # BATOND=path: another build, to compare
# batond's default --threads: one I/O loop per core but one, at least 1.
threads=$(($(nproc) - 1))
[ "$threads" -ge 1 ] || threads=1

# start_batond NAME FLAGS...: sets last_pid and last_addr. batond binds
# port 0 and logs the port it got, so there is no race for a free port.
start_batond() {
  local name=$1 log="$work/$1.log" addr=""
  shift
  # Made before the start: the loop below may read it before the child
  # process has opened it.
  : >"$log"
  # shellcheck disable=SC2086 # BATOND_FLAGS is a list of flags
  RUST_LOG=info "$batond" --bind 127.0.0.1 --port 0 "$@" ${BATOND_FLAGS:-} >/dev/null 2>"$log" &
  last_pid=$!
  pids+=("$last_pid")
  for _ in $(seq 200); do
    addr=$(sed -n 's/.*listening on \(127\.0\.0\.1:[0-9][0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$addr" ] && break
    if ! kill -0 "$last_pid" 2>/dev/null; then
      echo "bench.sh: batond $* exited:" >&2
      cat "$log" >&2
      exit 1
    fi
    sleep 0.05
  done
  if [ -z "$addr" ]; then
    echo "bench.sh: batond $* did not start within 10 s" >&2
    exit 1
  fi
  last_addr=$addr
  echo "bench.sh: $name: batond $* on $addr (pid $last_pid)" >&2
}

# start_redis NAME [REDIS FLAGS...]: sets last_pid and last_addr.
start_redis() {
  local name=$1 port pid
  shift
  for _ in 1 2 3; do
    port=$("$bench_bin" --free-ports 1)
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
      --daemonize no --dir "$work" --logfile "$work/$name.log" "$@" &
    pid=$!
    pids+=("$pid")
    for _ in $(seq 100); do
      if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ]; then
        last_pid=$pid
        last_addr=127.0.0.1:$port
        echo "bench.sh: $name: redis-server on $last_addr (pid $pid)" >&2
        return 0
      fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
    kill -KILL "$pid" 2>/dev/null || true
  done
  echo "bench.sh: redis-server did not start; see $work/$name.log" >&2
  exit 1
}

args=(--default-threads "$threads")
start_batond baton
args+=(--baton "$last_addr" --baton-pid "$last_pid")
if [ "$threads" -ne 1 ]; then # else the default is --threads 1
  start_batond baton1 --threads 1
  args+=(--baton1 "$last_addr" --baton1-pid "$last_pid")
fi
start_batond echo --echo
args+=(--echo "$last_addr" --echo-pid "$last_pid")
if [ "$threads" -ne 1 ]; then
  start_batond echo1 --echo --threads 1
  args+=(--echo1 "$last_addr" --echo1-pid "$last_pid")
fi
start_batond mem-baton
args+=(--mem-baton "$last_addr" --mem-baton-pid "$last_pid")
start_batond mem-waiters
args+=(--mem-waiters "$last_addr" --mem-waiters-pid "$last_pid")
# The watch rows: up to 10,000 watcher connections and the loop's clients.
start_batond watch --max-conns 12000
args+=(--watch-baton "$last_addr")
# The storm rows: 10,000 sequential idle connects to a fresh server.
start_batond storm --max-conns 12000
args+=(--storm-baton "$last_addr" --storm-baton-pid "$last_pid")

# ---- as deployed: a 2-node cluster, default flags (the deployed rows) ----
# info PORT: baton's `I` line.
info() {
  local line=""
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'I\n' >&3
  IFS= read -r -t 2 line <&3 || true
  exec 3>&-
  printf '%s\n' "$line"
}
# start_nodes NAME N [FLAG...]: a baton cluster of N nodes (FLAGs, then
# $BATOND_FLAGS, on each), logs in $work/NAME-<i>.log, its first node
# active with every standby synced; sets nodes_ports, nodes_pids and
# nodes_peers (the --peers list, first node first).
start_nodes() {
  local name=$1 n=$2 i synced=""
  shift 2
  mapfile -t nodes_ports < <("$bench_bin" --free-ports "$n")
  nodes_peers=""
  for ((i = 0; i < n; i++)); do nodes_peers+="${nodes_peers:+,}127.0.0.1:${nodes_ports[$i]}"; done
  nodes_pids=()
  for ((i = 0; i < n; i++)); do
    # shellcheck disable=SC2086
    RUST_LOG=info "$batond" --bind 127.0.0.1 --port "${nodes_ports[$i]}" --peers "$nodes_peers" \
      --cluster-key-file "$work/cluster.key" "$@" ${BATOND_FLAGS:-} >/dev/null 2>"$work/$name-$i.log" &
    nodes_pids+=($!)
    pids+=($!)
  done
  for _ in $(seq 200); do
    case $(info "${nodes_ports[0]}" 2>/dev/null) in
    *role=active*standbys=$((n - 1))*)
      synced=yes
      break
      ;;
    esac
    sleep 0.05
  done
  if [ -z "$synced" ]; then
    echo "bench.sh: $name: the $n-node cluster did not sync within 10 s:" >&2
    cat "$work/$name-"*.log >&2
    exit 1
  fi
  echo "bench.sh: $name: batond cluster $nodes_peers (pids ${nodes_pids[*]})" >&2
}
(umask 077 && head -c 32 /dev/urandom | base64 >"$work/cluster.key")
# The deployed rows' cluster.
start_nodes cluster 2
args+=(--cluster "127.0.0.1:${nodes_ports[0]}" --cluster-pids "${nodes_pids[0]},${nodes_pids[1]}")
# The join row: a 2-node cluster whose standby the harness stops, then
# resumes once the active holds --join-keys keys and clients are busy.
start_nodes join 2 --max-keys "${JOIN_MAX_KEYS:-11000000}"
args+=(--join "$nodes_peers" --join-pids "${nodes_pids[0]},${nodes_pids[1]}")
# The fleet row: a second 2-node cluster whose active the harness kills,
# room for the fleet's two connections per client on the new active.
start_nodes fleet 2 --max-conns 20000
args+=(--failover "$nodes_peers" --failover-pids "${nodes_pids[0]},${nodes_pids[1]}")

# ----- etcd rows (section etcd): etcd beside baton and Redis. Wanted when
# --only is not given or names etcd.
wants_etcd=yes
for ((i = 0; i < ${#harness_args[@]}; i++)); do
  if [ "${harness_args[$i]}" = --only ]; then
    case ",${harness_args[$((i + 1))]:-}," in
    *,etcd,*) ;;
    *) wants_etcd=no ;;
    esac
  fi
done
etcd_note=""
if [ "$use_etcd" = no ]; then
  etcd_note="etcd left out (--no-etcd)"
elif [ "$wants_etcd" = yes ] && ! command -v etcd >/dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "bench.sh: installing etcd-server (for the etcd rows)..." >&2
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null 2>&1 ||
      { apt-get update -qq >/dev/null 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null 2>&1; }; then
      # Where the package starts its service (systemd running), it listens
      # on :2379: stop it; the rows run etcds of their own on free ports.
      if [ -d /run/systemd/system ]; then
        systemctl disable --now etcd.service >/dev/null 2>&1 || true
      fi
    fi
  fi
  command -v etcd >/dev/null ||
    etcd_note="etcd not installed and could not be (apt-get install etcd-server as root): etcd rows skipped"
fi
# etcd_health PORT: its /health says true (a leader is known). In a
# subshell: a refused connection ends the shell that exec'd it.
etcd_health() {
  (
    exec 4<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&4
    # (the body ends without a newline: read's last line is partial)
    while IFS= read -r -t 2 line <&4 || [ -n "$line" ]; do
      case $line in *'"health":"true"'*) exit 0 ;; esac
    done
    exit 1
  ) 2>/dev/null
}
# start_etcd NAME DIR N: N members, data in DIR; sets etcd_addrs, etcd_pids
# (member order), and the ports come from the harness (free, distinct).
start_etcd() {
  local name=$1 dir=$2 n=$3 ports cluster="" i up
  mapfile -t ports < <("$bench_bin" --free-ports $((2 * n)))
  for ((i = 0; i < n; i++)); do
    cluster+="${cluster:+,}$name$i=http://127.0.0.1:${ports[$((2 * i + 1))]}"
  done
  etcd_addrs=() etcd_pids=()
  for ((i = 0; i < n; i++)); do
    etcd --name "$name$i" --data-dir "$dir/$name$i" \
      --listen-client-urls "http://127.0.0.1:${ports[$((2 * i))]}" \
      --advertise-client-urls "http://127.0.0.1:${ports[$((2 * i))]}" \
      --listen-peer-urls "http://127.0.0.1:${ports[$((2 * i + 1))]}" \
      --initial-advertise-peer-urls "http://127.0.0.1:${ports[$((2 * i + 1))]}" \
      --initial-cluster "$cluster" --initial-cluster-token "$name" \
      --initial-cluster-state new >"$work/$name$i.log" 2>&1 &
    pids+=($!)
    etcd_pids+=($!)
    etcd_addrs+=("127.0.0.1:${ports[$((2 * i))]}")
  done
  for _ in $(seq 300); do
    up=0
    for ((i = 0; i < n; i++)); do
      etcd_health "${ports[$((2 * i))]}" && up=$((up + 1))
    done
    [ "$up" -eq "$n" ] && break
    sleep 0.1
  done
  if [ "$up" -ne "$n" ]; then
    echo "bench.sh: etcd $name ($n members) not healthy within 30 s:" >&2
    tail -5 "$work/$name"*.log >&2
    exit 1
  fi
  echo "bench.sh: $name: etcd ${etcd_addrs[*]} (pids ${etcd_pids[*]}), data in $dir" >&2
}
if [ "$wants_etcd" = yes ] && [ -z "$etcd_note" ]; then
  # On disk: under target/ (the repository's disk; $TMPDIR may be tmpfs).
  disk_dir=$(mktemp -d "$PWD/target/bench-etcd.XXXXXX")
  etcd_dirs+=("$disk_dir")
  tmpfs_dir=""
  if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ]; then
    tmpfs_dir=$(mktemp -d /dev/shm/baton-bench-etcd.XXXXXX)
    etcd_dirs+=("$tmpfs_dir")
  fi
  start_etcd etcd "$disk_dir" 1
  args+=(--etcd "${etcd_addrs[0]}")
  if [ -n "$tmpfs_dir" ]; then
    start_etcd etcdtmpfs "$tmpfs_dir" 1
    args+=(--etcd-tmpfs "${etcd_addrs[0]}")
  fi
  start_etcd etcd3m "$disk_dir" 3
  args+=(--etcd-cluster "$(IFS=,; echo "${etcd_addrs[*]}")"
    --etcd-cluster-pids "$(IFS=,; echo "${etcd_pids[*]}")")
  # The failover rows: each cluster's leader is killed (SIGKILL: a crash)
  # or frozen (SIGSTOP: a machine gone silent) once.
  for how in kill freeze; do
    start_nodes "$how-baton2" 2
    args+=("--$how-baton2" "$nodes_peers" "--$how-baton2-pids" "$(IFS=,; echo "${nodes_pids[*]}")")
    start_nodes "$how-baton3" 3
    args+=("--$how-baton3" "$nodes_peers" "--$how-baton3-pids" "$(IFS=,; echo "${nodes_pids[*]}")")
  done
  start_etcd etcd3f "$disk_dir" 3
  args+=(--freeze-etcd3 "$(IFS=,; echo "${etcd_addrs[*]}")"
    --freeze-etcd3-pids "$(IFS=,; echo "${etcd_pids[*]}")")
  etcd_note="$(etcd --version | sed -n 1p), default flags (fsync on; heartbeat 100 ms, election timeout 1000 ms);"
  etcd_note+=" data on $(df --output=fstype "$disk_dir" | sed -n 2p) (the disk)"
  [ -n "$tmpfs_dir" ] && etcd_note+=", and one member on tmpfs (fsync then costs nothing)"
  etcd_note+="."
  args+=(--etcd-note "$etcd_note")
elif [ "$wants_etcd" = yes ]; then
  echo "bench.sh: $etcd_note" >&2
  args+=(--etcd-note "$etcd_note")
fi
# ----- end of the etcd rows

redis_note="redis-server not installed: Redis rows skipped"
[ "$use_redis" = yes ] || redis_note="Redis left out (--no-redis)"
if [ "$use_redis" = yes ] && command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  start_redis redis
  args+=(--redis "$last_addr" --redis-pid "$last_pid")
  # A master with one replica attached and in sync (the deployed rows).
  start_redis redis-master
  master_addr=$last_addr master_pid=$last_pid
  start_redis redis-replica
  redis-cli -h 127.0.0.1 -p "${last_addr##*:}" replicaof 127.0.0.1 "${master_addr##*:}" >/dev/null
  for _ in $(seq 200); do
    redis-cli -h 127.0.0.1 -p "${last_addr##*:}" info replication |
      grep -q 'master_link_status:up' && break
    sleep 0.05
  done
  args+=(--redis-repl "$master_addr" --redis-repl-pids "$master_pid,$last_pid")
  start_redis mem-redis
  args+=(--mem-redis "$last_addr" --mem-redis-pid "$last_pid")
  start_redis redis-watch --maxclients 12000
  args+=(--watch-redis "$last_addr")
  start_redis redis-storm --maxclients 12000
  args+=(--storm-redis "$last_addr" --storm-redis-pid "$last_pid")
  redis_note=$(redis-server --version | sed 's/ sha=.*//')
else
  echo "bench.sh: $redis_note (apt-get install redis-server to compare)" >&2
  harness_args+=(--redis-note "$redis_note")
fi

# ----- TLS rows (self-contained): baton over TLS against plain baton, and
# Redis over TLS against plain Redis when redis-server was built with TLS.
# Certificates are made at run time by the harness (rcgen), in $work.
tls_dir="$work/tls"
"$bench_bin" --make-certs "$tls_dir"
start_batond baton-tls --tls-cert "$tls_dir/node.pem" --tls-key "$tls_dir/node.key"
args+=(--baton-tls "$last_addr" --tls-ca "$tls_dir/ca.pem")
tls_note="Redis TLS left out (no Redis)"
if [ "$use_redis" = yes ] && command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  tls_note="Redis TLS left out: this redis-server does not start with --tls-port (built without TLS?)"
  for _ in 1 2 3; do
    tls_ports=($("$bench_bin" --free-ports 2))
    plain_port=${tls_ports[0]}
    tls_port=${tls_ports[1]}
    redis-server --port "$plain_port" --tls-port "$tls_port" --bind 127.0.0.1 --save '' \
      --appendonly no --daemonize no --dir "$work" --logfile "$work/redis-tls.log" \
      --tls-cert-file "$tls_dir/node.pem" --tls-key-file "$tls_dir/node.key" \
      --tls-ca-cert-file "$tls_dir/ca.pem" --tls-auth-clients no &
    pid=$!
    pids+=("$pid")
    for _ in $(seq 100); do
      [ "$(redis-cli -h 127.0.0.1 -p "$plain_port" ping 2>/dev/null)" = PONG ] && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
    if [ "$(redis-cli -h 127.0.0.1 -p "$plain_port" ping 2>/dev/null)" = PONG ]; then
      echo "bench.sh: redis-tls: redis-server TLS on 127.0.0.1:$tls_port (pid $pid)" >&2
      args+=(--redis-tls "127.0.0.1:$tls_port" --redis-tls-plain "127.0.0.1:$plain_port")
      tls_note="Redis TLS: $(redis-server --version | sed 's/ sha=.*//'), --tls-port, no client certificates."
      break
    fi
    kill -KILL "$pid" 2>/dev/null || true
  done
fi
echo "bench.sh: $tls_note" >&2
args+=(--tls-note "$tls_note")
# ----- end of the TLS rows

echo "## baton benchmark: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo
echo "Command: \`scripts/bench.sh${shown_args[*]:+ ${shown_args[*]}}\`. Machine: $(nproc) cores, batond default --threads $threads" \
  "($(uname -sr)), shared with the load generator. $redis_note."
"$bench_bin" "${args[@]}" "${harness_args[@]}"
