#!/usr/bin/env bash
# Plaintext against TLS on one broker, in alternating rounds of one run: the broker listens on a
# PLAINTEXT and an SSL listener (a certificate this script makes with openssl), and the same load goes
# to one and then the other, each round on a topic of its own. Each load reports MB/s and the broker's
# CPU time per byte moved (`perf stat` task-clock of the broker process, all its threads). Then TLS
# handshakes: `openssl s_time` opens connections one after another for 10 s, and the broker's CPU time
# per connection (a full handshake each, no resumption) is reported, and from
# it the handshakes one shard can do per second.
#
#   scripts/bench-tls.sh BUILD_DIR [ROUNDS]
#
# BUILD_DIR holds release binaries `shardlog` and `shardlog-bench` (copy target/release's after
# `cargo build --release -p shardlog-broker -p shardlog-bench`). One broker, 2 shards, 12 partitions,
# 1 KiB messages:
#   produce   `produce --mode async --acks all --batch-bytes 16384 --in-flight 5` for 10 s
#   consume   one consumer connection reads the 12 partitions that round's produce wrote (from the tail
#             cache or the disk, the same for both listeners)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:?directory of the build}")
rounds=${2:-3}
bench="$build/shardlog-bench"
work=$(mktemp -d "$PWD/target/bench-tls.XXXXXX")
plain_port=29592
tls_port=29593
broker=
cleanup() {
    if [ -n "$broker" ]; then
        kill "$broker" 2>/dev/null || true
        wait "$broker" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# A certificate authority and the broker's certificate for 127.0.0.1.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=bench CA" -keyout "$work/ca.key" \
    -out "$work/ca.pem" 2> /dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$work/broker.key" -out "$work/broker.csr" \
    2> /dev/null
openssl x509 -req -in "$work/broker.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial -days 2 \
    -out "$work/broker.crt" -extfile <(printf 'subjectAltName=IP:127.0.0.1\n') 2> /dev/null
cat "$work/broker.key" "$work/broker.crt" > "$work/broker.pem"
printf 'security.protocol=PLAINTEXT\n' > "$work/plaintext.properties"
printf 'security.protocol=SSL\nssl.ca.location=%s\n' "$work/ca.pem" > "$work/ssl.properties"

"$build/shardlog" start --data-dir "$work/data" --shards 2 --metrics-listen 127.0.0.1:0 \
    --set "listeners=PLAINTEXT://127.0.0.1:$plain_port,SSL://127.0.0.1:$tls_port" \
    --set "ssl.keystore.location=$work/broker.pem" >> "$work/broker.log" 2>&1 &
broker=$!
export SHARDLOG_BOOTSTRAP="127.0.0.1:$plain_port"
for _ in $(seq 300); do "$build/shardlog" topic list > /dev/null 2>&1 && break; sleep 0.1; done
"$build/shardlog" topic list > /dev/null || { cat "$work/broker.log" >&2; exit 1; }

# Runs a load (its arguments) and prints "MB/s broker-CPU-ns-per-byte".
measure() {
    perf stat -e task-clock -x, -p "$broker" -o "$work/stat" &
    local stat=$!
    "$@" > "$work/load" 2>&1 || { cat "$work/load" >&2; exit 1; }
    kill -INT "$stat"
    wait "$stat" 2>/dev/null || true
    local line cpu_ms
    line=$(grep -m1 -E ' msg/s, ' "$work/load") || { cat "$work/load" >&2; exit 1; }
    cpu_ms=$(awk -F, '$3 == "task-clock" {print $1}' "$work/stat")
    echo "$line" | awk -v cpu="$cpu_ms" '{
        for (i = 1; i <= NF; i++) {
            if ($i == "s:") secs = $(i - 1)
            if ($i ~ /^MB\/s,?$/) mbps = $(i - 1)
        }
        printf "%s %.2f\n", mbps, cpu * 1e6 / (mbps * 1e6 * secs) }'
}

# One round of one listener: produce into a new topic, then read it all back.
round() {
    local name=$1 port=$2 topic="bench-$1-$3"
    "$build/shardlog" topic create "$topic" --partitions 12 --replication-factor 1 > /dev/null
    local produced consumed messages
    produced=$(measure "$bench" produce --bootstrap "127.0.0.1:$port" --command-config "$work/$name.properties" \
        --topic "$topic" --mode async --acks all --batch-bytes 16384 --in-flight 5 --duration 10s)
    messages=$(grep -m1 -oE '^[0-9]+ messages' "$work/load" | cut -d' ' -f1)
    consumed=$(measure "$bench" consume --bootstrap "127.0.0.1:$port" --command-config "$work/$name.properties" \
        --topic "$topic" --messages "$messages" --connections 1)
    echo "$produced $consumed"
}

declare -A results
for r in $(seq "$rounds"); do
    for name in plaintext ssl; do
        port=$plain_port
        [ "$name" = ssl ] && port=$tls_port
        out=$(round "$name" "$port" "$r")
        results[$name]+="$out"$'\n'
        read -r pmb pcpu cmb ccpu <<< "$out"
        echo "round $r $name: produce $pmb MB/s ($pcpu ns CPU/byte), consume $cmb MB/s ($ccpu ns CPU/byte)"
    done
done
median() { sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
for name in plaintext ssl; do
    col() { printf '%s' "${results[$name]}" | awk -v c="$1" 'NF {print $c}' | median; }
    echo "median $name: produce $(col 1) MB/s ($(col 2) ns CPU/byte), consume $(col 3) MB/s ($(col 4) ns CPU/byte)"
done

# TLS handshakes: full handshakes (no session resumption) one after another for 10 s, per round.
for r in $(seq "$rounds"); do
    perf stat -e task-clock -x, -p "$broker" -o "$work/stat" &
    stat=$!
    openssl s_time -connect "127.0.0.1:$tls_port" -CAfile "$work/ca.pem" -new -time 10 > "$work/s_time" 2>&1
    kill -INT "$stat"
    wait "$stat" 2>/dev/null || true
    connections=$(grep -m1 -oE '^[0-9]+ connections in' "$work/s_time" | cut -d' ' -f1)
    cpu_ms=$(awk -F, '$3 == "task-clock" {print $1}' "$work/stat")
    awk -v n="$connections" -v cpu="$cpu_ms" 'BEGIN {
        printf "handshakes round '"$r"': %d in 10 s, broker CPU %.3f ms each: %.0f handshakes/s per shard\n", n, cpu / n, 1000 * n / cpu }'
done
