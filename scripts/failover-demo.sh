#!/usr/bin/env bash
# A lock lost in a Sentinel failover: without warden.grace, with it, and with
# grants the replicas acknowledged.
#
# Starts a master, two replicas and three Sentinels on 127.0.0.1, stalls the
# replicas and cuts their links (so the next grant reaches nobody), asks for
# `job` as A on the master, kills the master, lets Sentinel promote a replica
# and asks for `job` as B. With grace 0 B is granted while A's lease still
# runs: two holders. With grace >= max-lease B is refused until A's lease
# could have ended: one holder. With `sync` (warden.sync-replicas 1,
# warden.grace auto) A is never told it holds `job` — no replica
# acknowledged it — and B is granted as soon as the other replica follows
# the promoted one: one holder, no 12 s wait.
#
# usage: scripts/failover-demo.sh [grace_ms | sync ...]   (default: 0 12000 sync)
# env: WARDEN_MODULE (the .so), WARDEN_SERVER (redis-server or valkey-server),
#      DEMO_PORT (first of 6 ports, default 7500), TTL (default 12000)
set -euo pipefail

MODULE=${WARDEN_MODULE:-$(cd "$(dirname "$0")/.." && pwd)/target/release/libwarden.so}
SERVER=${WARDEN_SERVER:-redis-server}
BASE=${DEMO_PORT:-7500}
TTL=${TTL:-12000}
GRACES=("$@")
[ ${#GRACES[@]} -gt 0 ] || GRACES=(0 "$TTL" sync)
[ -f "$MODULE" ] || { echo "no module at $MODULE: run make build"; exit 1; }
command -v redis-cli >/dev/null || { echo "redis-cli is missing: run make deps"; exit 1; }

DIR=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -CONT "$pid" 2>/dev/null || true; kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

cli() { local port=$1; shift; redis-cli -h 127.0.0.1 -p "$port" "$@"; }
now_ms() { date +%s%3N; }
wait_until() { # seconds, description, command...
    local limit=$1 what=$2; shift 2
    local end=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || { echo "timed out waiting for $what"; exit 1; }
        sleep 0.05
    done
}
for p in $(seq "$BASE" $((BASE + 5))); do
    if (exec 3<>/dev/tcp/127.0.0.1/"$p") 2>/dev/null; then
        echo "port $p is taken: use DEMO_PORT=<first of 6 free ports>"; exit 1
    fi
done

run_once() {
    local grace=$1
    local m=$BASE r1=$((BASE + 1)) r2=$((BASE + 2))
    rm -rf "${DIR:?}"/*
    PIDS=()
    declare -A PID
    for port in $m $r1 $r2; do
        mkdir -p "$DIR/$port"
        local extra=()
        [ "$port" = "$m" ] || extra=(--replicaof 127.0.0.1 "$m")
        "$SERVER" --port "$port" --bind 127.0.0.1 --dir "$DIR/$port" --save "" --appendonly no \
            --logfile "$DIR/$port/log" "${extra[@]}" \
            --loadmodule "$MODULE" max-lease "$TTL" >/dev/null 2>&1 &
        PID[$port]=$!
        PIDS+=($!)
    done
    for port in $m $r1 $r2; do wait_until 20 "server $port" cli "$port" PING; done
    # Set after the start: a starting master opens a window of its own.
    for port in $m $r1 $r2; do
        if [ "$grace" = sync ]; then
            cli "$port" CONFIG SET warden.grace auto warden.sync-replicas 1 >/dev/null
        else
            cli "$port" CONFIG SET warden.grace "$grace" >/dev/null
        fi
    done
    for port in $r1 $r2; do
        wait_until 20 "replica $port" bash -c "redis-cli -p $port INFO replication | grep -q master_link_status:up"
    done
    if [ "$grace" = sync ]; then
        # A first grant, acknowledged: the replicas learn who acknowledges.
        wait_until 20 "a grant the replicas acknowledged" bash -c \
            "redis-cli -p $m LOCK.ACQUIRE warmup A 1000 | grep -q '^[0-9]'"
    fi
    for i in 0 1 2; do
        local sp=$((BASE + 3 + i))
        mkdir -p "$DIR/s$i"
        cat >"$DIR/s$i/sentinel.conf" <<EOF
port $sp
bind 127.0.0.1
dir $DIR/s$i
logfile $DIR/s$i/log
sentinel monitor locks 127.0.0.1 $m 2
sentinel down-after-milliseconds locks 500
sentinel failover-timeout locks 3000
EOF
        "$SERVER" "$DIR/s$i/sentinel.conf" --sentinel >/dev/null 2>&1 &
        PIDS+=($!)
    done
    for i in 0 1 2; do
        local sp=$((BASE + 3 + i))
        wait_until 30 "sentinel $sp to know the group" bash -c \
            "redis-cli -p $sp SENTINEL MASTER locks | grep -A1 -x num-other-sentinels | tail -1 | grep -qx 2 &&
             redis-cli -p $sp SENTINEL MASTER locks | grep -A1 -x num-slaves | tail -1 | grep -qx 2"
    done

    if [ "$grace" = sync ]; then
        echo "== warden.sync-replicas 1, warden.grace auto, warden.max-lease $TTL ms =="
    else
        echo "== warden.grace $grace ms, warden.max-lease $TTL ms =="
    fi
    kill -STOP "${PID[$r1]}" "${PID[$r2]}"
    cli $m CLIENT KILL TYPE replica >/dev/null
    wait_until 10 "links cut" bash -c "redis-cli -p $m INFO replication | grep -q connected_slaves:0"
    local a a_at a_until
    a=$(cli $m LOCK.ACQUIRE job A "$TTL")
    a_at=$(now_ms)
    a_until=$((a_at + TTL))
    if [ -n "$a" ]; then
        echo "A holds job on the master (port $m), token $a, lease until +$TTL ms"
    else
        a_until=$a_at
        echo "A is refused on the master (port $m): no replica acknowledged the grant, which was taken back"
    fi
    kill -9 "${PID[$m]}"
    wait "${PID[$m]}" 2>/dev/null || true
    kill -CONT "${PID[$r1]}" "${PID[$r2]}"
    echo "master killed before any replica received the grant; Sentinel fails over..."
    local new=""
    local end=$((SECONDS + 60))
    while :; do
        new=$(cli $((BASE + 3)) SENTINEL get-master-addr-by-name locks 2>/dev/null | tail -1)
        if [ -n "$new" ] && [ "$new" != "$m" ] && cli "$new" ROLE 2>/dev/null | head -1 | grep -qx master; then break; fi
        [ $SECONDS -lt $end ] || { echo "no failover"; exit 1; }
        sleep 0.05
    done
    local promoted_at
    promoted_at=$(now_ms)
    echo "Sentinel promoted port $new, $((promoted_at - a_at)) ms after A's grant"
    local b
    b=$(cli "$new" LOCK.ACQUIRE job B "$TTL")
    local b_at
    b_at=$(now_ms)
    if [ -n "$b" ]; then
        if [ -n "$a" ]; then
            echo "B is granted job on the new master, token $b, $((b_at - a_at)) ms after A, while A's lease runs $((a_until - b_at)) ms more"
            echo "RESULT: two holders (A and B)"
        else
            echo "B is granted job on the new master, token $b, $((b_at - promoted_at)) ms after the promotion"
            echo "RESULT: one holder (B)"
        fi
    else
        echo "B is refused (grace window: $(cli "$new" INFO warden | tr -d '\r' | grep grace_remaining_ms | cut -d: -f2) ms left)"
        if [ -n "$a" ]; then
            echo "RESULT: one holder (A); B waits..."
        else
            echo "RESULT: no holder; B waits until the other replica follows the promoted one..."
        fi
        # Sentinel closes normal clients when it reconfigures an instance
        # (CLIENT KILL TYPE normal): ask again, on the master it names.
        b=""
        end=$((SECONDS + 60))
        until [[ $b =~ ^[0-9]+$ ]]; do
            [ $SECONDS -lt $end ] || { echo "B never granted"; exit 1; }
            new=$(cli $((BASE + 3)) SENTINEL get-master-addr-by-name locks 2>/dev/null | tail -1)
            b=$(cli "$new" LOCK.ACQUIRE job B "$TTL" WAIT 0 2>/dev/null || true)
        done
        b_at=$(now_ms)
        if [ -n "$a" ]; then
            echo "B is granted job, token $b, $((b_at - a_until)) ms after A's lease ended ($((b_at - promoted_at)) ms after the promotion)"
        else
            echo "B is granted job, token $b, $((b_at - promoted_at)) ms after the promotion"
        fi
    fi
    {
        for pid in "${PIDS[@]}"; do kill -CONT "$pid" 2>/dev/null || true; kill -9 "$pid" 2>/dev/null || true; done
        wait || true
    } 2>/dev/null
    PIDS=()
    echo
}

for grace in "${GRACES[@]}"; do run_once "$grace"; done
