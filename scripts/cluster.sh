#!/usr/bin/env bash
# make cluster / make cluster-stop: a local Redis Cluster of 3 masters and 3
# replicas with warden loaded, data under cluster-data/.
# Usage: scripts/cluster.sh start|stop [first-port]
set -euo pipefail
cd "$(dirname "$0")/.."
action=${1:-start}
base=${2:-7000}
module=$PWD/target/release/libwarden.so
ports=$(seq "$base" $((base + 5)))
server=${WARDEN_SERVER:-redis-server}   # make cluster SERVER=valkey sets it

case "$action" in
start)
    for p in $ports; do
        if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "port $p is taken: make cluster-stop, or make cluster CLUSTER_PORT=<first port>"; exit 1
        fi
    done
    for p in $ports; do
        mkdir -p "cluster-data/$p"
        "$server" --port "$p" --bind 127.0.0.1 --dir "$PWD/cluster-data/$p" \
            --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000 \
            --appendonly yes --daemonize yes --logfile redis.log --loadmodule "$module"
    done
    for p in $ports; do
        until redis-cli -p "$p" PING >/dev/null 2>&1; do sleep 0.1; done
    done
    redis-cli --cluster create $(for p in $ports; do printf '127.0.0.1:%s ' "$p"; done) \
        --cluster-replicas 1 --cluster-yes
    for p in $ports; do
        until redis-cli -p "$p" CLUSTER INFO | grep -q cluster_state:ok; do sleep 0.2; done
    done
    echo
    echo "cluster up on ports $base-$((base + 5)); try: redis-cli -c -p $base LOCK.ACQUIRE {order:42}:lock me 30000"
    ;;
stop)
    for p in $ports; do redis-cli -p "$p" SHUTDOWN NOSAVE >/dev/null 2>&1 || true; done
    rm -rf cluster-data
    echo "cluster stopped"
    ;;
*)
    echo "usage: $0 start|stop [first-port]"; exit 2
    ;;
esac
