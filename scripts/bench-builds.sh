#!/usr/bin/env bash
# Two builds of the broker side by side: the same load against one and then the other, in alternating
# rounds of one run (the host varies by +-30% between runs), medians compared. Each build is a directory
# holding release binaries `shardlog` and `shardlog-bench` (copy target/release's after
# `cargo build --release -p shardlog-broker -p shardlog-bench`); the load generator is always the second
# build's `shardlog-bench`, so only the broker differs.
#
#   scripts/bench-builds.sh SCENARIO BEFORE_DIR AFTER_DIR [ROUNDS]
#
# Scenarios (one broker, 2 shards, 12 partitions, 1 KiB messages):
#   consume        one consumer connection reads 3 GB from the start: the data is on disk (written once,
#                  then each round starts the build on the same data dir)
#   produce-small  `produce --mode async --batch-bytes 16384 --in-flight 5 --acks all` for 10 s, a fresh
#                  data dir per round
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:?scenario: consume | produce-small}
before=$(realpath "${2:?directory of the first build}")
after=$(realpath "${3:?directory of the second build}")
rounds=${4:-5}
bench="$after/shardlog-bench"
work=$(mktemp -d "$PWD/target/bench-builds.XXXXXX")
port=29492
broker=
stop_broker() {
    if [ -n "$broker" ]; then
        kill "$broker" 2>/dev/null || true
        wait "$broker" 2>/dev/null || true
        broker=
    fi
}
cleanup() {
    stop_broker
    rm -rf "$work"
}
trap cleanup EXIT
export SHARDLOG_BOOTSTRAP="127.0.0.1:$port"

# Starts build $1 on data dir $2 and waits until it answers.
start_broker() {
    "$1/shardlog" start --listen "127.0.0.1:$port" --metrics-listen 127.0.0.1:0 --data-dir "$2" \
        >> "$work/broker.log" 2>&1 &
    broker=$!
    for _ in $(seq 300); do "$1/shardlog" topic list > /dev/null 2>&1 && return; sleep 0.1; done
    echo "the broker did not start; its log:" >&2
    cat "$work/broker.log" >&2
    exit 1
}
mbps() { sed -n 's/.* msg\/s, \([0-9.]*\) MB\/s.*/\1/p'; }

consume_setup() {
    start_broker "$after" "$work/data"
    "$after/shardlog" topic create bench --partitions 12 --replication-factor 1 > /dev/null
    "$bench" produce --topic bench --mode async --acks 1 --messages 3000000 > /dev/null
    stop_broker
}
consume_round() {
    start_broker "$1" "$work/data"
    "$bench" consume --topic bench --messages 3000000 --connections 1 2>&1 | mbps
    stop_broker
}

produce_small_setup() { :; }
produce_small_round() {
    rm -rf "$work/data"
    start_broker "$1" "$work/data"
    "$1/shardlog" topic create bench --partitions 12 --replication-factor 1 > /dev/null
    "$bench" produce --topic bench --mode async --acks all --batch-bytes 16384 --in-flight 5 --duration 10s 2>&1 | mbps
    stop_broker
    rm -rf "$work/data"
}

case "$scenario" in
    consume) setup=consume_setup; round=consume_round ;;
    produce-small) setup=produce_small_setup; round=produce_small_round ;;
    *) echo "unknown scenario $scenario" >&2; exit 2 ;;
esac
$setup
first=()
second=()
for r in $(seq "$rounds"); do
    first+=("$($round "$before")")
    second+=("$($round "$after")")
    echo "round $r: $(basename "$before") ${first[-1]} MB/s, $(basename "$after") ${second[-1]} MB/s"
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
echo "$scenario median: $(basename "$before") $(median "${first[@]}") MB/s, $(basename "$after") $(median "${second[@]}") MB/s"
