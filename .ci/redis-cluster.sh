#!/usr/bin/env bash
# Starts a Redis Cluster of three masters on free loopback ports, in a temporary directory,
# for the Redis engine's tests; prints the nodes' URLs, comma-separated, on stdout (the
# servers stop when the caller kills them: `.ci/run` does on exit).
#   usage: bash .ci/redis-cluster.sh DIR
set -euo pipefail
dir="$1"
mkdir -p "$dir"
# A port that is free, with its cluster bus port (10 000 above it, so at most 55 535) free too.
free_port() {
  python3 - <<'PY'
import random, socket
def free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()
while True:
    port = random.randint(20000, 45000)
    if free(port) and free(port + 10000):
        print(port)
        break
PY
}
nodes=()
urls=()
for i in 1 2 3; do
  port=$(free_port)
  mkdir -p "$dir/$port"
  redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-config-file "$dir/$port/nodes.conf" --dir "$dir/$port" \
    --save "" --appendonly no --daemonize yes --logfile "$dir/$port/redis.log" \
    --pidfile "$dir/$port/redis.pid"
  nodes+=("127.0.0.1:$port")
  urls+=("redis://127.0.0.1:$port")
done
for node in "${nodes[@]}"; do
  up=""
  for _ in $(seq 1 50); do
    redis-cli -h 127.0.0.1 -p "${node#*:}" ping >/dev/null 2>&1 && up=1 && break
    sleep 0.1
  done
  if [ -z "$up" ]; then
    echo "redis-server on $node did not start: $(tail -n 3 "$dir/${node#*:}/redis.log")" >&2
    exit 1
  fi
done
redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1
for _ in $(seq 1 100); do
  if redis-cli -h 127.0.0.1 -p "${nodes[0]#*:}" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; then
    (IFS=,; echo "${urls[*]}")
    exit 0
  fi
  sleep 0.1
done
echo "the Redis Cluster did not come up: $(cat "$dir/create.log")" >&2
exit 1
