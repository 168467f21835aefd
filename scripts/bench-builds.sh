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
#                  data dir per round, to PARTITIONS partitions (env, default 12); also reports the acks'
#                  p99 (ms), the batches each fdatasync or device flush made durable (the broker's
#                  `shardlog_log_batches_per_fdatasync`), its fdatasyncs and flushes a second
#                  (`shardlog_log_fdatasyncs_total`, and those with sync="file"), and the flush requests the disk completed a second
#                  (/proc/diskstats; DISK, default vda), and the bytes its write-outs copied (out of
#                  the in-memory tail into write buffers, `shardlog_log_written_bytes_total{from="copy"}`)
#                  per byte produced
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
metrics_port=29493
partitions=${PARTITIONS:-12}
disk=${DISK:-vda}
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
    "$1/shardlog" start --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$metrics_port" --data-dir "$2" \
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

# The sum over shards of a metric the broker serves now (of its series whose labels include $2, if given).
metric() {
    curl -s "127.0.0.1:$metrics_port/metrics" |
        awk -v m="$1" -v l="${2:-}" '($1 == m || index($1, m "{") == 1) && index($1, l) { s += $2 } END { printf "%.0f\n", s }'
}
disk_flushes() { awk -v d="$disk" '$3 == d { print $19 }' /proc/diskstats; }

produce_small_setup() { :; }
produce_small_round() {
    rm -rf "$work/data"
    start_broker "$1" "$work/data"
    "$1/shardlog" topic create bench --partitions "$partitions" --replication-factor 1 > /dev/null
    local syncs batches dflush figures p99 copied mb fsyncs dbatches
    copied=$(metric shardlog_log_written_bytes_total 'from="copy"')
    fsyncs=$(metric shardlog_log_fdatasyncs_total 'sync="file"')
    dbatches=$(metric shardlog_log_batches_per_fdatasync_sum 'sync="device"')
    syncs=$(metric shardlog_log_fdatasyncs_total)
    batches=$(metric shardlog_log_batches_per_fdatasync_sum)
    dflush=$(disk_flushes)
    figures=$(measure "$bench" produce --topic bench --mode async --acks all --batch-bytes 16384 --in-flight 5 --duration 10s)
    p99=$(awk '/to acknowledgement/ { for (i = 1; i <= NF; i++) if ($i == "p99") print $(i + 1) }' "$work/load")
    syncs=$(( $(metric shardlog_log_fdatasyncs_total) - syncs ))
    batches=$(( $(metric shardlog_log_batches_per_fdatasync_sum) - batches ))
    dflush=$(( $(disk_flushes) - dflush ))
    copied=$(( $(metric shardlog_log_written_bytes_total 'from="copy"') - copied ))
    fsyncs=$(( $(metric shardlog_log_fdatasyncs_total 'sync="file"') - fsyncs ))
    dbatches=$(( $(metric shardlog_log_batches_per_fdatasync_sum 'sync="device"') - dbatches ))
    mb=${figures%% *}
    echo "$figures $p99 $(awk -v b="$batches" -v s="$syncs" -v d="$dflush" -v c="$copied" -v mb="$mb" -v f="$fsyncs" \
        -v db="$dbatches" 'BEGIN { printf "%.2f %.2f %.0f %.0f %.0f %.2f", b / (s ? s : 1), db / (s - f ? s - f : 1),
            s / 10, f / 10, d / 10, c / (mb * 1e6 * 10) }')"
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

case "$scenario" in
    consume) setup=consume_setup; round=consume_round ;;
    consume-tail) setup=consume_tail_setup; round=consume_tail_round ;;
    produce-small) setup=produce_small_setup; round=produce_small_round ;;
    rdkafka-produce) setup=rdkafka_produce_setup; round=rdkafka_produce_round ;;
    replication) setup=replication_setup; round=replication_round ;;
    *) echo "unknown scenario $scenario" >&2; exit 2 ;;
esac
$setup
# A round prints "MB/s ns-CPU-per-byte" and, for produce-small, "p99-ms batches-per-sync
# batches-per-device-flush syncs/s file-fdatasyncs/s disk-flushes/s copies-per-byte" after them (a build
# from before the sync label counts no file fdatasyncs), for replication the CPU per byte of the leader
# and of each follower.
names=("MB/s" "ns CPU/byte" "p99 ms" "batches/sync" "batches/device flush" "syncs/s" "of them file fdatasyncs/s"
    "disk flushes/s" "write-out copies/byte")
if [ "$scenario" = replication ]; then
    names=("MB/s" "ns CPU/byte, all three" "ns CPU/byte, leader" "ns CPU/byte, follower 2" "ns CPU/byte, follower 3")
fi
first=()
second=()
for r in $(seq "$rounds"); do
    # (A command substitution, not a process one: the round, its broker's stop included, is over before
    # the next starts.)
    first+=("$($round "$before")")
    second+=("$($round "$after")")
    echo "round $r: $(basename "$before") ${first[-1]} | $(basename "$after") ${second[-1]}"
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
# Column $1 (from 1) of every round of a build's rounds (the rest of the arguments).
column() { local c=$1; shift; printf '%s\n' "$@" | awk -v c="$c" '{ print $c }'; }
echo "$scenario medians of $rounds rounds$([ "$scenario" = produce-small ] && echo " (PARTITIONS=$partitions)"):"
for c in $(seq "$(echo "${first[0]}" | wc -w)"); do
    # shellcheck disable=SC2046
    echo "  ${names[c - 1]}: $(basename "$before") $(median $(column "$c" "${first[@]}")), $(basename "$after") $(median $(column "$c" "${second[@]}"))"
done
