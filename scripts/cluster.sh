#!/usr/bin/env bash
# Start, stop and inspect a local baton cluster on loopback (needs bash,
# coreutils and cargo; nothing else).
#
#   scripts/cluster.sh start [N] [BASE_PORT]  start N nodes (1-16, default 3) on
#                                             127.0.0.1:BASE_PORT.. (default 7373),
#                                             wait until each answers `I`, then
#                                             until the cluster is formed (one
#                                             active, every other node its synced
#                                             standby); exit 3 if it is not yet
#   scripts/cluster.sh status                 each node's pid and its `I` answer
#                                             (exit 1 if a node is down)
#   scripts/cluster.sh stop                   SIGTERM every node (graceful), wait,
#                                             SIGKILL what is left after 15 s
#   scripts/cluster.sh kill NODE              SIGKILL node NODE (0-based)
#   scripts/cluster.sh restart NODE           start node NODE again after a kill,
#                                             and wait until it has rejoined
#
# Extra batond flags can be given in $BATOND_FLAGS (e.g. "--detect 0.5").
# With "--auth-file PATH" there, set $BATON_AUTH_FILE=PATH too: the `I`
# probes authenticate with its first secret.
# Metrics: $BATON_METRICS_BASE=PORT (or ADDR:PORT; ADDR defaults to
# 127.0.0.1) gives node i `--metrics ADDR:PORT+i`; a "--metrics ADDR:PORT"
# in $BATOND_FLAGS is taken the same way (each node needs a port of its own).
# $BATOND names a batond binary to use instead of building one with cargo.
# State (pid files, logs, and the cluster key the nodes share, made on the
# first start with 32 random bytes, mode 600) lives in
# ${BATON_CLUSTER_DIR:-/tmp/baton-cluster}. A pid file is trusted only while
# its process is a batond on that node's port: a stale one is reported and
# removed.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BATON_CLUSTER_DIR:-/tmp/baton-cluster}
bin=${BATOND:-target/release/batond}
start_timeout=${BATON_START_TIMEOUT:-10}
form_timeout=${BATON_FORM_TIMEOUT:-15}

usage() {
  sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

die() {
  echo "cluster.sh: $*" >&2
  exit 1
}

# The cluster's size and base port, or a clear error when none was started.
load() {
  if [ ! -s "$dir/n" ] || [ ! -s "$dir/base" ]; then
    die "no cluster started in $dir (start one with: scripts/cluster.sh start)"
  fi
  n=$(cat "$dir/n") base=$(cat "$dir/base")
  metrics=$(cat "$dir/metrics" 2>/dev/null || true)
}

# NODE must be an index of the started cluster.
check_index() { # COMMAND NODE
  local command=$1 i=${2:-}
  if [ -z "$i" ]; then
    echo "usage: scripts/cluster.sh $command NODE   (NODE: 0-based index)" >&2
    exit 2
  fi
  load
  if ! [[ $i =~ ^[0-9]+$ ]] || ((i >= n)); then
    die "$command: no node '$i'; this cluster has nodes 0-$((n - 1))"
  fi
}

# $BATOND_FLAGS without any --metrics (in `flags`), and the metrics base
# it or $BATON_METRICS_BASE asks for, as ADDR:PORT (in `metrics`; empty for
# none). Checks that node i's port, PORT+i, is a port and no client port.
split_metrics() {
  local words word want="" take=0
  flags=()
  read -r -a words <<<"${BATOND_FLAGS:-}"
  for word in "${words[@]}"; do
    if ((take)); then want=$word take=0; continue; fi
    case $word in
    --metrics) take=1 ;;
    --metrics=*) want=${word#--metrics=} ;;
    *) flags+=("$word") ;;
    esac
  done
  ((take == 0)) || die "--metrics in BATOND_FLAGS needs ADDR:PORT"
  want=${want:-${BATON_METRICS_BASE:-}}
  metrics=""
  [ -n "$want" ] || return 0
  [[ $want == *:* ]] || want=127.0.0.1:$want
  local host=${want%:*} port=${want##*:}
  [[ $port =~ ^[0-9]+$ ]] && ((port >= 1 && port + n - 1 <= 65535)) ||
    die "metrics: expected PORT or ADDR:PORT with PORT 1-$((65536 - n)) for $n nodes, got '$want'"
  if ((port <= base + n - 1 && base <= port + n - 1)); then
    die "metrics: ports $port-$((port + n - 1)) overlap the client ports $base-$((base + n - 1))"
  fi
  metrics=$host:$port
}

# Node I's --metrics address, or nothing without metrics.
metrics_of() { # I
  [ -n "${metrics:-}" ] || return 0
  echo "${metrics%:*}:$((${metrics##*:} + $1))"
}

# ", metrics http://ADDR:PORT/metrics" for node I's lines, or nothing.
metrics_note() { # I
  [ -n "${metrics:-}" ] || return 0
  echo ", metrics http://$(metrics_of "$1")/metrics"
}

peers_of() { # N BASE
  local n=$1 base=$2 list="" i
  for ((i = 0; i < n; i++)); do list+="${list:+,}127.0.0.1:$((base + i))"; done
  echo "$list"
}

# The pid of node I if it is running: its pid file names a live batond
# listening on the node's port. A stale pid file is removed, and said so.
pid_of() { # I
  local i=$1 f="$dir/node$1.pid" pid cmd
  [ -s "$f" ] || return 1
  pid=$(cat "$f")
  if [[ $pid =~ ^[0-9]+$ ]] && [ -r "/proc/$pid/cmdline" ]; then
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline")
    if [[ $cmd == *batond* && $cmd == *" --port $((base + i)) "* ]]; then
      echo "$pid"
      return 0
    fi
  fi
  echo "node $i: pid $pid in $f is not running (stale pid file removed)" >&2
  rm -f "$f"
  return 1
}

# The first secret of $BATON_AUTH_FILE (batond --auth-file's format), or
# nothing without it.
auth_secret() {
  [ -n "${BATON_AUTH_FILE:-}" ] || return 0
  [ -r "$BATON_AUTH_FILE" ] || die "BATON_AUTH_FILE: cannot read $BATON_AUTH_FILE"
  local line
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line#"${line%%[![:space:]]*}"} line=${line%"${line##*[![:space:]]}"}
    [ -z "$line" ] || [[ $line == \#* ]] || { printf '%s' "$line"; return 0; }
  done <"$BATON_AUTH_FILE"
}

# The `I` answer of the node on PORT, through bash's /dev/tcp, after `U`
# when there is a secret (passed in the environment, never in argv); fails
# when nothing answers within 2 s.
info() { # PORT
  BATON_SECRET=$(auth_secret) timeout 2 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    if [ -n "$BATON_SECRET" ]; then
      printf "U %s\n" "$BATON_SECRET" >&3
      IFS= read -r line <&3 || exit 1
      [ "${line%$'"'"'\r'"'"'}" = "U ok" ] || exit 1
    fi
    printf "I\n" >&3
    IFS= read -r line <&3 || exit 1
    printf "%s\n" "${line%$'"'"'\r'"'"'}"
  ' _ "$1" 2>/dev/null
}

# Start node I in the background; its pid file is written at once, and its
# log offset is kept so that readiness looks at this run's lines only.
launch() { # I
  local i=$1 port=$((base + $1)) log="$dir/node$1.log"
  touch "$log"
  offset[i]=$(stat -c %s "$log")
  local more=()
  # One node is a plain single node: no replication thread to run.
  ((n == 1)) || more+=(--peers "$(peers_of "$n" "$base")" --cluster-key-file "$dir/cluster.key")
  more+=("${flags[@]}")
  [ -z "${metrics:-}" ] || more+=(--metrics "$(metrics_of "$i")")
  "$bin" --bind 127.0.0.1 --port "$port" "${more[@]}" >>"$log" 2>&1 </dev/null &
  echo $! >"$dir/node$i.pid"
}

# Wait until node I listens (its own log says so) and answers `I`. On
# failure: why, with the last lines of this run's log; returns 1.
await() { # I
  local i=$1 port=$((base + $1)) log="$dir/node$1.log" pid answer
  pid=$(cat "$dir/node$i.pid")
  local deadline=$((SECONDS + start_timeout))
  while :; do
    # Alive is enough here: until the fork in launch has exec'd, the pid is
    # a copy of this script (no batond on the port yet), and `wait` below
    # would block on a node that is starting, not failing.
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid" 2>/dev/null && status=0 || status=$?
      echo "node $i: batond exited at once (exit status $status) on 127.0.0.1:$port; the end of $log:" >&2
      tail -c +"$((offset[i] + 1))" "$log" | tail -n 5 | sed 's/^/    /' >&2
      rm -f "$dir/node$i.pid"
      return 1
    fi
    if tail -c +"$((offset[i] + 1))" "$log" | grep -q "listening on" &&
      answer=$(info "$port"); then
      echo "node $i: 127.0.0.1:$port pid $pid log $log: ${answer%% node=*}$(metrics_note "$i")"
      return 0
    fi
    if ((SECONDS >= deadline)); then
      echo "node $i: pid $pid did not answer I on 127.0.0.1:$port within ${start_timeout} s; the end of $log:" >&2
      tail -c +"$((offset[i] + 1))" "$log" | tail -n 5 | sed 's/^/    /' >&2
      return 1
    fi
    sleep 0.05
  done
}

# SIGTERM node I (graceful: an active hands over first) and wait for it to
# go; SIGKILL after 15 s. Removes its pid file.
stop_node() { # I
  local i=$1 pid
  pid=$(pid_of "$i") || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "node $i: pid $pid still running 15 s after SIGTERM; SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/node$i.pid"
  echo "node $i: stopped (pid $pid)"
}

# The value of NAME= in an `I` answer.
field() { # ANSWER NAME
  [[ " $1 " =~ \ $2=([^ ]*) ]] && echo "${BASH_REMATCH[1]}"
}

# Whether the running nodes form a cluster: each answers `I`, exactly one
# is active, every other one is a standby that follows it, and the active
# counts them all as standbys that hold its whole state. If not, `why`
# says what is missing.
formed() {
  local i port answer role running=0 active="" active_node="" synced=0
  local -a followers=()
  why=""
  for ((i = 0; i < n; i++)); do
    pid_of "$i" >/dev/null 2>&1 || continue
    running=$((running + 1))
    port=$((base + i))
    if ! answer=$(info "$port"); then
      why="node $i does not answer I"
      return 1
    fi
    role=$(field "$answer" role)
    if [ "$role" = active ]; then
      [ -z "$active" ] || { why="nodes $active and $i are both active"; return 1; }
      active=$i active_node=$(field "$answer" node) synced=$(field "$answer" standbys)
    else
      followers+=("$i:$(field "$answer" active)")
    fi
  done
  ((running > 0)) || { why="no node is running"; return 1; }
  [ -n "$active" ] || { why="no node is active yet"; return 1; }
  local f
  for f in "${followers[@]}"; do
    [ "${f#*:}" = "$active_node" ] || { why="node ${f%%:*} does not follow node $active yet"; return 1; }
  done
  if [ "$synced" != $((running - 1)) ]; then
    why="node $active (active) has ${synced:-no} of $((running - 1)) standbys synced"
    return 1
  fi
  formed_note="node $active active, $((running - 1)) standby(s) synced"
}

# Wait until the cluster is formed, for $form_timeout s at most. Formed:
# one line saying so. Not yet: why, on stderr, and exit 3 (the nodes keep
# running; `status` shows them).
await_formed() {
  local deadline=$((SECONDS + form_timeout))
  while ! formed; do
    if ((SECONDS >= deadline)); then
      echo "cluster.sh: the nodes run, but the cluster is not formed yet after ${form_timeout} s: $why (see: scripts/cluster.sh status)" >&2
      exit 3
    fi
    sleep 0.05
  done
  echo "cluster formed: $formed_note"
}

build() {
  if [ -z "${BATOND:-}" ]; then
    command -v cargo >/dev/null || die "cargo not found (or set BATOND to a batond binary)"
    cargo build --release --locked --bin batond -q
  fi
  [ -x "$bin" ] || die "no batond binary at $bin"
}

declare -a offset
case ${1:-} in
start)
  [ $# -le 3 ] || usage
  want_n=${2:-3} want_base=${3:-7373}
  [[ $want_n =~ ^[0-9]+$ ]] && ((want_n >= 1 && want_n <= 16)) ||
    die "start: N must be 1-16, got '$want_n'"
  [[ $want_base =~ ^[0-9]+$ ]] && ((want_base >= 1 && want_base + want_n - 1 <= 65535)) ||
    die "start: BASE_PORT must be 1-$((65536 - want_n)) for $want_n nodes, got '$want_base'"
  mkdir -p "$dir"
  if [ -s "$dir/n" ] && [ -s "$dir/base" ]; then
    n=$(cat "$dir/n") base=$(cat "$dir/base")
    for ((i = 0; i < n; i++)); do
      if pid=$(pid_of "$i"); then
        die "a cluster is already running in $dir (node $i, pid $pid); stop it first: scripts/cluster.sh stop"
      fi
    done
  fi
  n=$want_n base=$want_base
  split_metrics
  if [ ! -s "$dir/cluster.key" ]; then
    (umask 077 && head -c 32 /dev/urandom | base64 >"$dir/cluster.key")
  fi
  build
  echo "$n" >"$dir/n"
  echo "$base" >"$dir/base"
  if [ -n "$metrics" ]; then echo "$metrics" >"$dir/metrics"; else rm -f "$dir/metrics"; fi
  for ((i = 0; i < n; i++)); do launch "$i"; done
  failed=0
  for ((i = 0; i < n; i++)); do await "$i" || failed=1; done
  if ((failed)); then
    echo "cluster.sh: the cluster did not start; stopping the nodes that did" >&2
    for ((i = 0; i < n; i++)); do stop_node "$i" >/dev/null; done
    rm -f "$dir/n" "$dir/base" "$dir/metrics"
    exit 1
  fi
  await_formed
  ;;
status)
  [ $# -eq 1 ] || usage
  load
  down=0
  for ((i = 0; i < n; i++)); do
    port=$((base + i))
    if pid=$(pid_of "$i"); then
      if answer=$(info "$port"); then
        echo "node $i: 127.0.0.1:$port pid $pid: $answer$(metrics_note "$i")"
      else
        echo "node $i: 127.0.0.1:$port pid $pid: running but not answering I"
        down=1
      fi
    else
      echo "node $i: 127.0.0.1:$port not running"
      down=1
    fi
  done
  exit "$down"
  ;;
stop)
  [ $# -eq 1 ] || usage
  if [ ! -s "$dir/n" ] || [ ! -s "$dir/base" ]; then
    echo "no cluster started in $dir; nothing to stop"
    exit 0
  fi
  load
  for ((i = 0; i < n; i++)); do stop_node "$i"; done
  rm -f "$dir/n" "$dir/base" "$dir/metrics"
  ;;
kill)
  [ $# -le 2 ] || usage
  check_index kill "${2:-}"
  pid=$(pid_of "$2") || die "kill: node $2 is not running"
  kill -KILL "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  rm -f "$dir/node$2.pid"
  echo "node $2: killed (pid $pid)"
  ;;
restart)
  [ $# -le 2 ] || usage
  check_index restart "${2:-}"
  if pid=$(pid_of "$2"); then
    die "restart: node $2 is still running (pid $pid); kill it first"
  fi
  [ -x "$bin" ] || build
  split_metrics
  metrics=$(cat "$dir/metrics" 2>/dev/null || true)
  launch "$2"
  await "$2" || exit 1
  await_formed
  ;;
-h | --help | help)
  sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
  ;;
*)
  [ -z "${1:-}" ] || echo "cluster.sh: unknown command '$1'" >&2
  usage
  ;;
esac
