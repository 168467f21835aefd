#!/usr/bin/env bash
# Produce with 10,000 ACLs in force against no authorizer, in alternating rounds of one run, on one data
# dir: the broker (2 shards) is started once with Kafka's StandardAuthorizer to create 6 topics and
# 10,000 ACLs through confluent-kafka's AdminClient as a super user (over SASL_PLAINTEXT): a LITERAL WRITE
# for User:ANONYMOUS on each bench topic, and for 9,994 other principals LITERAL, PREFIXED, group and DENY
# ACLs. Then each round starts it once without an authorizer and once with it (in turn first), and produces as
# User:ANONYMOUS over PLAINTEXT for 10 s (`produce --mode async --acks all --batch-bytes 16384
# --in-flight 5`, 12 partitions, 1 KiB messages) into a topic of its own, reporting MB/s and the
# broker's CPU per byte (`perf stat` task-clock). With the authorizer each Produce passes the ACL gate.
#
#   scripts/bench-acls.sh BUILD_DIR [ROUNDS]     (release binaries shardlog and shardlog-bench; 3 rounds)
#
# Each round writes about 4.5 GB into target/: have 7 GB free per round, or the broker's disk floor
# slows it.
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:?directory of the build}")
rounds=${2:-3}
work=$(mktemp -d "$PWD/target/bench-acls.XXXXXX")
plain=29692; sasl=29693
broker=
stop() {
  if [ -n "$broker" ]; then
    kill "$broker" 2>/dev/null || true
    wait "$broker" 2>/dev/null || true
    broker=
  fi
}
trap 'stop; rm -rf "$work"' EXIT
common=(--data-dir "$work/data" --shards 2 --metrics-listen 127.0.0.1:0
  --set "listeners=PLAINTEXT://127.0.0.1:$plain,SASL_PLAINTEXT://127.0.0.1:$sasl")
start() {
  "$build/shardlog" start "${common[@]}" "$@" >> "$work/broker.log" 2>&1 &
  broker=$!
  for _ in $(seq 300); do "$build/shardlog" topic list --bootstrap 127.0.0.1:$plain > /dev/null 2>&1 && return; sleep 0.1; done
  tail -20 "$work/broker.log"; exit 1
}
authz=(--set authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer --set super.users=User:admin)
start "${authz[@]}" --add-scram 'SCRAM-SHA-256=[name=admin,password=admin-secret]'
python3 - "$sasl" "$rounds" <<'PY'
import sys
from confluent_kafka.admin import AdminClient, AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType, NewTopic
a = AdminClient({"bootstrap.servers": f"127.0.0.1:{sys.argv[1]}", "security.protocol": "SASL_PLAINTEXT",
    "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "admin", "sasl.password": "admin-secret"})
topics = 2 * int(sys.argv[2])
for f in a.create_topics([NewTopic(f"bench-{r}", 12, 1) for r in range(1, topics + 1)]).values(): f.result()
acls = [AclBinding(ResourceType.TOPIC, f"bench-{r}", ResourcePatternType.LITERAL, "User:ANONYMOUS", "*",
                   AclOperation.WRITE, AclPermissionType.ALLOW) for r in range(1, topics + 1)]
for i in range(10_000 - topics):
    kind = i % 4
    if kind == 0:
        acls.append(AclBinding(ResourceType.TOPIC, f"app{i}-events", ResourcePatternType.LITERAL, f"User:app{i}", "*", AclOperation.WRITE, AclPermissionType.ALLOW))
    elif kind == 1:
        acls.append(AclBinding(ResourceType.TOPIC, f"app{i}.", ResourcePatternType.PREFIXED, f"User:app{i}", "*", AclOperation.READ, AclPermissionType.ALLOW))
    elif kind == 2:
        acls.append(AclBinding(ResourceType.GROUP, f"app{i}-group", ResourcePatternType.LITERAL, f"User:app{i}", "*", AclOperation.READ, AclPermissionType.ALLOW))
    else:
        acls.append(AclBinding(ResourceType.TOPIC, f"app{i}-secret", ResourcePatternType.LITERAL, f"User:app{i}", "*", AclOperation.READ, AclPermissionType.DENY))
for i in range(0, len(acls), 1000):
    for f in a.create_acls(acls[i:i + 1000]).values(): f.result()
print("acls", len(acls))
PY
stop
measure() {
  perf stat -e task-clock -x, -p "$broker" -o "$work/stat" &
  local stat=$!
  "$build/shardlog-bench" produce --bootstrap 127.0.0.1:$plain --topic "$1" --mode async --acks all --batch-bytes 16384 --in-flight 5 --duration 10s > "$work/load" 2>&1 || { cat "$work/load"; exit 1; }
  kill -INT "$stat"; wait "$stat" 2>/dev/null || true
  local cpu; cpu=$(awk -F, '$3 == "task-clock" {print $1}' "$work/stat")
  grep -m1 ' msg/s, ' "$work/load" | awk -v cpu="$cpu" '{for (i=1;i<=NF;i++){if($i=="s:")s=$(i-1); if($i ~ /^MB\/s,?$/)m=$(i-1)} printf "%s MB/s %.2f ns CPU/byte\n", m, cpu*1e6/(m*1e6*s)}'
}
none() {
  start
  echo "round $1 none: $(measure "$2")"
  stop
}
with_acls() {
  start "${authz[@]}"
  echo "round $1 10000-acls: $(measure "$2")"
  echo "authorization denials logged so far: $(grep -c 'authorization denied' "$work/broker.log" || true)"
  stop
}
# Odd rounds run without the authorizer first, even rounds with it first, so that a drift over the
# run (the data dir filling, the page cache) does not favour one side.
for r in $(seq "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then
    none "$r" "bench-$((2*r-1))"; with_acls "$r" "bench-$((2*r))"
  else
    with_acls "$r" "bench-$((2*r))"; none "$r" "bench-$((2*r-1))"
  fi
done
