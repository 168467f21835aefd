#!/usr/bin/env bash
# Builds librdkafka's own load tool, rdkafka_performance, from the librdkafka the rdkafka crate vendors and
# builds (the same version the tests run against): the source ships in rdkafka-sys's build output, next to
# the static library it built. Writes target/rdkafka_performance.
#
#   scripts/build-rdkafka-performance.sh
#
# Then, e.g. (1 KiB messages, 12 partitions, linger.ms=5, acks=all, for 30 s):
#   target/rdkafka_performance -P -t bench -b 127.0.0.1:9092 -s 1024 -a -1 -X linger.ms=5 -l 30 -u
set -euo pipefail
cd "$(dirname "$0")/.."
find_out() {
    find target/*/build -maxdepth 4 -path '*rdkafka-sys-*/out/src/librdkafka.a' 2>/dev/null | head -1
}
lib=$(find_out)
if [ -z "$lib" ]; then
    # rdkafka is a dev-dependency of the broker's tests: building them builds librdkafka.
    cargo test -p shardlog-broker --no-run --quiet
    lib=$(find_out)
fi
[ -n "$lib" ] || { echo "no librdkafka.a under target/*/build/rdkafka-sys-*/out" >&2; exit 1; }
out=$(dirname "$(dirname "$lib")")
# The zstd the library was configured with (rdkafka's zstd feature links zstd-sys's static build).
zstd_flags=$(sed -n 's/^LDFLAGS+=[[:space:]]*//p' "$out/Makefile.config" | tr '\n' ' ')
libs=$(sed -n 's/^LIBS+=[[:space:]]*//p' "$out/Makefile.config" | tr '\n' ' ')
# shellcheck disable=SC2086
gcc -O2 -I"$out/src" "$out/examples/rdkafka_performance.c" "$lib" $zstd_flags $libs -o target/rdkafka_performance
echo "built target/rdkafka_performance from $out"
