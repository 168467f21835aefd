#!/usr/bin/env bash
# RF=3 against RF=1, async acks=all produce of 1 KiB records to 12 partitions, on a local cluster of three
# brokers, one after the other in the same run (docs/performance.md, "Async produce, RF=3 against RF=1").
# Env: DUR (default 15s), RATE (messages/s, open loop; unset: closed loop), DISK (block device holding the
# data dir, default vda) for the flush count in /proc/diskstats. Needs `cargo build --release` first.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release
data=$(mktemp -d /tmp/bench-replication.XXXXXX)
disk=${DISK:-vda}
boot=127.0.0.1:29092,127.0.0.1:29093,127.0.0.1:29094
flushes() { awk -v d="$disk" '$3 == d { print $19 }' /proc/diskstats; }
"$bin/shardlog-bench" cluster --brokers 3 --base-port 29092 --data-dir "$data/cluster" > "$data/cluster.out" 2>&1 &
cluster=$!
trap 'kill -INT $cluster 2>/dev/null; wait $cluster 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 1 60); do grep -q running "$data/cluster.out" && break; sleep 1; done
for rf in 1 3; do
    min_insync=$(( rf > 1 ? 2 : 1 ))
    "$bin/shardlog" topic create "rf$rf" --partitions 12 --replication-factor "$rf" \
        --config "min.insync.replicas=$min_insync" --bootstrap "$boot" > /dev/null
    sleep 2
    before=$(flushes); start=$(date +%s.%N)
    "$bin/shardlog-bench" produce --bootstrap "$boot" --topic "rf$rf" --mode async --acks all \
        --message-size 1024 --duration "${DUR:-15s}" ${RATE:+--rate "$RATE"} 2>&1 | tail -2
    after=$(flushes); end=$(date +%s.%N)
    echo "RF=$rf: $(echo "($after - $before) / ($end - $start)" | bc -l | cut -c1-7) device flushes/s"
done
