#!/usr/bin/env bash
# What scraping the metrics endpoint costs: produce throughput of one broker with /metrics scraped every
# second against not scraped, in alternating rounds of one run (the host varies between runs), medians
# compared. Release binaries: cargo build --release -p shardlog-broker -p shardlog-bench
#
#   scripts/bench-metrics-scrape.sh [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
seconds=${2:-10}
bin=target/release
data=$(mktemp -d "$PWD/target/bench-metrics.XXXXXX")
port=29392
metrics=29393
"$bin/shardlog" start --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$metrics" --data-dir "$data/broker" \
    > "$data/broker.log" 2>&1 &
broker=$!
scraper=
cleanup() {
    [ -n "$scraper" ] && kill "$scraper" 2>/dev/null || true
    kill "$broker" 2>/dev/null || true
    wait "$broker" 2>/dev/null || true
    rm -rf "$data"
}
trap cleanup EXIT
export SHARDLOG_BOOTSTRAP="127.0.0.1:$port"
for _ in $(seq 100); do "$bin/shardlog" topic list > /dev/null 2>&1 && break; sleep 0.1; done

# One round: async produce, 1 KiB messages, 16 KiB batches, acks=all (fdatasync before the answer), to
# a 12-partition topic of its own, deleted afterwards so that the rounds' data never fills the disk.
round() {
    "$bin/shardlog" topic create scrape --partitions 12 --replication-factor 1 > /dev/null
    "$bin/shardlog-bench" produce --topic scrape --mode async --acks all --batch-bytes 16384 \
        --duration "${seconds}s" 2>&1 | sed -n 's/.* msg\/s, \([0-9.]*\) MB\/s.*/\1/p'
    "$bin/shardlog" topic delete scrape > /dev/null
}
scrapes() {
    while true; do
        curl -s -o /dev/null "http://127.0.0.1:$metrics/metrics"
        sleep 1
    done
}
plain=()
scraped=()
for r in $(seq "$rounds"); do
    plain+=("$(round)")
    scrapes &
    scraper=$!
    scraped+=("$(round)")
    kill "$scraper"
    wait "$scraper" 2>/dev/null || true
    scraper=
    echo "round $r: not scraped ${plain[-1]} MB/s, scraped every second ${scraped[-1]} MB/s"
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
echo "median: not scraped $(median "${plain[@]}") MB/s, scraped every second $(median "${scraped[@]}") MB/s"
echo "one scrape: $(curl -s "http://127.0.0.1:$metrics/metrics" | wc -c) bytes, $(curl -s "http://127.0.0.1:$metrics/metrics" | grep -vc '^#') samples"
