"""kafka-python and confluent-kafka against a running shardlog broker.

Usage: python3 python_clients.py HOST:PORT

Creates a topic through each client's admin API, describes its configs, produces idempotently (acks=all),
consumes from the earliest offset and from a timestamp, and lists offsets. Exits non-zero with a
message on the first mismatch.
"""

import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic as CNewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource as KConfigResource, ConfigResourceType, NewTopic

BOOTSTRAP = sys.argv[1]
N = 300


def check(cond, message):
    if not cond:
        print(f"FAILED: {message}", file=sys.stderr)
        sys.exit(1)


def confluent_round_trip():
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    futures = admin.create_topics([CNewTopic("py-confluent", num_partitions=3, replication_factor=1,
                                             config={"retention.ms": "86400000"})])
    futures["py-confluent"].result(timeout=30)
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "py-confluent")])
    configs = list(described.values())[0].result(timeout=30)
    check(configs["retention.ms"].value == "86400000", f"confluent describe_configs: {configs['retention.ms'].value}")

    producer = Producer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True, "compression.type": "lz4"})
    acked = []
    for i in range(N):
        producer.produce("py-confluent", key=f"k{i % 7}", value=f"v{i}",
                         timestamp=1_700_000_000_000 + i,
                         on_delivery=lambda err, msg: acked.append((err, msg.partition(), msg.offset())))
    producer.flush(30)
    check(len(acked) == N and all(err is None for err, _, _ in acked), f"confluent produce acks: {acked[:3]}")

    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "unused", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.assign([CTopicPartition("py-confluent", p, 0) for p in range(3)])
    seen = []
    deadline = time.time() + 30
    while len(seen) < N and time.time() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            seen.append((msg.partition(), msg.offset(), msg.key().decode(), msg.value().decode()))
    check(len(seen) == N, f"confluent consumed {len(seen)} of {N}")
    check(sorted(v for _, _, _, v in seen) == sorted(f"v{i}" for i in range(N)), "confluent values differ")

    # From a timestamp: offsets_for_times, then every partition from there.
    wanted = 1_700_000_000_000 + N // 2
    found = consumer.offsets_for_times([CTopicPartition("py-confluent", p, wanted) for p in range(3)], timeout=30)
    check(all(tp.offset >= 0 for tp in found), f"offsets_for_times: {found}")
    low, high = consumer.get_watermark_offsets(CTopicPartition("py-confluent", 0), timeout=30)
    check(low == 0 and high == sum(1 for p, _, _, _ in seen if p == 0), f"watermarks {low} {high}")
    consumer.close()


def kafka_python_round_trip():
    admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    admin.create_topics([NewTopic("py-kafka", num_partitions=2, replication_factor=1,
                                  topic_configs={"segment.bytes": "1048576"})])
    described = admin.describe_configs([KConfigResource(ConfigResourceType.TOPIC, "py-kafka")])
    text = str(described)
    check("segment.bytes" in text and "1048576" in text, f"kafka-python describe_configs: {text[:300]}")
    admin.close()

    # The client's defaults: idempotent (InitProducerId, sequence numbers) with acks=all.
    producer = KafkaProducer(bootstrap_servers=BOOTSTRAP, compression_type="gzip")
    check(producer.config["enable_idempotence"], "kafka-python 3 defaults to an idempotent producer")
    futures = [producer.send("py-kafka", key=b"k", value=f"m{i}".encode(), timestamp_ms=1_700_000_100_000 + i)
               for i in range(N)]
    producer.flush(30)
    offsets = [f.get(timeout=30).offset for f in futures]
    check(offsets == list(range(N)), "kafka-python: one key, one partition, offsets 0..N in order")

    tps = [TopicPartition("py-kafka", p) for p in range(2)]
    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP, enable_auto_commit=False, consumer_timeout_ms=5000)
    consumer.assign(tps)
    consumer.seek_to_beginning()
    values = [r.value.decode() for r in consumer]
    check(values == [f"m{i}" for i in range(N)], f"kafka-python consumed {len(values)} in order")
    end = consumer.end_offsets(tps)
    check(sum(end.values()) == N, f"end offsets {end}")
    by_time = consumer.offsets_for_times({tp: 1_700_000_100_000 + 100 for tp in tps})
    hit = [v for v in by_time.values() if v is not None]
    check(len(hit) == 1 and hit[0].offset == 100, f"offsets_for_times {by_time}")
    consumer.close()


confluent_round_trip()
kafka_python_round_trip()
print("python clients: all checks passed")
