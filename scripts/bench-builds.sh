#!/usr/bin/env bash
# Two builds of the broker side by side: the same load against one and then the other, in alternating
# rounds of one run (the host varies by +-30% between runs), medians compared. Each build is a directory
# holding release binaries `shardlog` and `shardlog-bench` (copy target/release's after
# `cargo build --release -p shardlog-broker -p shardlog-bench`); the load generator is always the second
# build's `shardlog-bench`, so only the broker differs. Each round also reports the broker's CPU time per
# byte moved (`perf stat` task-clock of the broker process).
#
#   scripts/bench-builds.sh SCENARIO BEFORE_DIR AFTER_DIR [ROUNDS]
#
# Scenarios (one broker, 2 shards, 12 partitions, 1 KiB messages):
#   consume        one consumer connection reads 3 GB from the start: the data is on disk (written once,
#                  then each round starts the build on the same data dir)
#   consume-tail   one consumer connection reads 3 GB from the tail cache: 40,000 messages (about 4.0 MB
#                  per partition, within its 4 MiB tail cache) produced into a fresh data dir, then read
#                  over and over (`consume --repeat`)
#   produce-small  `produce --mode async --batch-bytes 16384 --in-flight 5 --acks all` for 10 s, a fresh
#                  data dir per round
#   rdkafka-produce librdkafka's rdkafka_performance (scripts/build-rdkafka-performance.sh): 3,000,000
#                  messages, linger.ms=5, acks=all (fdatasync before the answer), a fresh data dir per round
#   replication    three brokers (`shardlog-bench cluster --brokers 3 --shards 2`), a fresh cluster per
#                  round; a 12-partition RF=3 topic (`min.insync.replicas=2`) whose partitions all lead on
#                  broker 1, so that brokers 2 and 3 only follow; `produce --mode async --acks all` for
#                  15 s. Reports the three brokers' CPU per produced byte, then the leader's and each
#                  follower's apart (a follower receives every produced byte: its figure is per
#                  replicated byte)
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:?scenario: consume | consume-tail | produce-small | rdkafka-produce | replication}
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
# Runs a load (its arguments) against the running broker and prints "MB/s broker-CPU-ns-per-byte": the
# broker's task-clock (`perf stat`, all its threads; this VM has no cycle counter) over the bytes moved.
measure() {
    perf stat -e task-clock -x, -p "$broker" -o "$work/stat" &
    local stat=$!
    "$@" > "$work/load" 2>&1
    kill -INT "$stat"
    wait "$stat" 2>/dev/null || true
    local line cpu_ms
    # shardlog-bench: "N messages in S s: R msg/s, M MB/s"; rdkafka_performance: "... in Tms: R msgs/s and M MB/s"
    line=$(grep -m1 -E ' msg/s, | msgs/s and ' "$work/load") || { cat "$work/load" >&2; exit 1; }
    cpu_ms=$(awk -F, '$3 == "task-clock" {print $1}' "$work/stat")
    echo "$line" | awk -v cpu="$cpu_ms" '{
        for (i = 1; i <= NF; i++) {
            if ($i == "s:") secs = $(i - 1)
            if ($i ~ /^[0-9]+ms:$/) secs = substr($i, 1, length($i) - 3) / 1000
            if ($i ~ /^MB\/s,?$/) mbps = $(i - 1)
        }
        printf "%s %.2f\n", mbps, cpu * 1e6 / (mbps * 1e6 * secs) }'
}

consume_setup() {
    start_broker "$after" "$work/data"
    "$after/shardlog" topic create bench --partitions 12 --replication-factor 1 > /dev/null
    "$bench" produce --topic bench --mode async --acks 1 --messages 3000000 > /dev/null
    stop_broker
}
consume_round() {
    start_broker "$1" "$work/data"
    measure "$bench" consume --topic bench --messages 3000000 --connections 1
    stop_broker
}

consume_tail_setup() { :; }
consume_tail_round() {
    rm -rf "$work/data"
    start_broker "$1" "$work/data"
    "$1/shardlog" topic create bench --partitions 12 --replication-factor 1 > /dev/null
    "$bench" produce --topic bench --mode async --acks 1 --messages 40000 > /dev/null
    measure "$bench" consume --topic bench --messages 3000000 --connections 1 --repeat
    stop_broker
    rm -rf "$work/data"
}

produce_small_setup() { :; }
produce_small_round() {
    rm -rf "$work/data"
    start_broker "$1" "$work/data"
    "$1/shardlog" topic create bench --partitions 12 --replication-factor 1 > /dev/null
    measure "$bench" produce --topic bench --mode async --acks all --batch-bytes 16384 --in-flight 5 --duration 10s
    stop_broker
    rm -rf "$work/data"
}

rdkafka_produce_setup() {
    [ -x target/rdkafka_performance ] || scripts/build-rdkafka-performance.sh
}
rdkafka_produce_round() {
    rm -rf "$work/data"
    start_broker "$1" "$work/data"
    "$1/shardlog" topic create bench --partitions 12 --replication-factor 1 > /dev/null
    measure target/rdkafka_performance -P -t bench -b "127.0.0.1:$port" -s 1024 -a -1 -X linger.ms=5 -c 3000000 -q
    stop_broker
    rm -rf "$work/data"
}
replication_setup() { :; }
# Prints "MB/s ns-per-byte-all leader follower follower": each broker's task-clock over the bytes produced.
replication_round() {
    rm -rf "$work/cluster"
    "$bench" cluster --brokers 3 --shards 2 --base-port $((port + 10)) --data-dir "$work/cluster" \
        --shardlog "$1/shardlog" > "$work/cluster.out" 2>&1 &
    local cluster=$! boot="127.0.0.1:$((port + 10))" id pid
    for _ in $(seq 60); do grep -q running "$work/cluster.out" && break; sleep 1; done
    "$1/shardlog" topic create rf3 --replica-assignment "$(printf '1:2:3,%.0s' $(seq 11))1:2:3" \
        --config min.insync.replicas=2 --bootstrap "$boot" > /dev/null
    sleep 2
    local stats=()
    for id in 1 2 3; do
        for pid in $(pgrep -P "$cluster"); do
            tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "--node-id $id " || continue
            perf stat -e task-clock -x, -p "$pid" -o "$work/stat-$id" &
            stats+=($!)
        done
    done
    "$bench" produce --bootstrap "$boot" --topic rf3 --mode async --acks all --message-size 1024 \
        --duration 15s > "$work/load" 2>&1
    kill -INT "${stats[@]}"
    wait "${stats[@]}" 2>/dev/null || true
    kill -INT "$cluster"
    wait "$cluster" 2>/dev/null || true
    local line
    line=$(grep -m1 -E ' msg/s, ' "$work/load") || { cat "$work/load" >&2; exit 1; }
    for id in 1 2 3; do awk -F, '$3 == "task-clock" {print $1}' "$work/stat-$id"; done | paste -sd' ' |
        awk -v line="$line" '{
            n = split(line, f, " ")
            for (i = 1; i <= n; i++) {
                if (f[i] == "s:") secs = f[i - 1]
                if (f[i] ~ /^MB\/s,?$/) mbps = f[i - 1]
            }
            bytes = mbps * 1e6 * secs
            printf "%s %.2f %.2f %.2f %.2f\n", mbps, ($1 + $2 + $3) * 1e6 / bytes, $1 * 1e6 / bytes,
                $2 * 1e6 / bytes, $3 * 1e6 / bytes }'
    rm -rf "$work/cluster"
}

more_label=
case "$scenario" in
    consume) setup=consume_setup; round=consume_round ;;
    consume-tail) setup=consume_tail_setup; round=consume_tail_round ;;
    produce-small) setup=produce_small_setup; round=produce_small_round ;;
    rdkafka-produce) setup=rdkafka_produce_setup; round=rdkafka_produce_round ;;
    replication) setup=replication_setup; round=replication_round; more_label="ns CPU/byte leader, followers" ;;
    *) echo "unknown scenario $scenario" >&2; exit 2 ;;
esac
$setup
first=()
second=()
first_cpu=()
second_cpu=()
# Scenarios that report more than one CPU figure (replication: the leader's and each follower's) print
# them after the first; their medians are printed at the end, column by column.
first_more=()
second_more=()
for r in $(seq "$rounds"); do
    # (A command substitution, not a process one: the round, its broker's stop included, is over before
    # the next starts.)
    out=$($round "$before")
    read -r mb cpu more <<< "$out"
    first+=("$mb")
    first_cpu+=("$cpu")
    first_more+=("$more")
    out=$($round "$after")
    read -r mb cpu more <<< "$out"
    second+=("$mb")
    second_cpu+=("$cpu")
    second_more+=("$more")
    echo "round $r: $(basename "$before") ${first[-1]} MB/s (${first_cpu[-1]} ns CPU/byte${first_more[-1]:+; $more_label ${first_more[-1]}})," \
        "$(basename "$after") ${second[-1]} MB/s (${second_cpu[-1]} ns CPU/byte${second_more[-1]:+; $more_label ${second_more[-1]}})"
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
echo "$scenario median: $(basename "$before") $(median "${first[@]}") MB/s ($(median "${first_cpu[@]}") ns CPU/byte)," \
    "$(basename "$after") $(median "${second[@]}") MB/s ($(median "${second_cpu[@]}") ns CPU/byte)"
# The medians of the further columns.
more_medians() {
    local column=1 values
    while values=$(printf '%s\n' "$@" | awk -v c="$column" 'NF >= c {print $c}') && [ -n "$values" ]; do
        printf ' %s' "$(median $values)"
        column=$((column + 1))
    done
}
if [ -n "${first_more[0]}" ]; then
    echo "$scenario medians, $more_label: $(basename "$before")$(more_medians "${first_more[@]}")," \
        "$(basename "$after")$(more_medians "${second_more[@]}")"
fi
