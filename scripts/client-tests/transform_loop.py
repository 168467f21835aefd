"""A consume-transform-produce loop with transactions (KIP-98, KIP-447), as Kafka Streams and Flink run
one: confluent-kafka (librdkafka) at its default settings. Each transaction holds the transformed records
of one poll and the consumer's offsets after them (send_offsets_to_transaction), so a crash at any point
leaves either both or neither. Run, killed with SIGKILL and run again by
broker/tests/transactions_clients.rs, which then checks that every input appears in the output exactly once.

    python3 transform_loop.py BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID EXPECTED

Exits 0 once the group's committed offsets cover EXPECTED input records (printing "done"); a fatal error
(fenced by another instance) exits 1.
"""

import sys
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

bootstrap, source, sink, group, transactional_id, expected = sys.argv[1:7]
expected = int(expected)

consumer = Consumer(
    {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        # Static membership (KIP-345), as Kafka Streams applications use: a restarted instance takes its
        # predecessor's place at once instead of waiting out its session.
        "group.instance.id": transactional_id,
    }
)
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
producer.init_transactions(60)
consumer.subscribe([source])


def committed_total():
    """How many input records the group's committed offsets cover."""
    assigned = consumer.assignment()
    if not assigned:
        return 0
    return sum(max(tp.offset, 0) for tp in consumer.committed(assigned, timeout=10))


idle_since = time.time()
while True:
    records = consumer.consume(num_messages=50, timeout=0.5)
    records = [r for r in records if not r.error() or r.error().code() != KafkaError._PARTITION_EOF]
    if not records:
        # The group has one member: once it is assigned every partition, its commits cover the input.
        if time.time() - idle_since > 1 and len(consumer.assignment()) > 0 and committed_total() >= expected:
            print("done", flush=True)
            break
        continue
    idle_since = time.time()
    for r in records:
        if r.error():
            raise KafkaException(r.error())
    producer.begin_transaction()
    for r in records:
        producer.produce(sink, key=r.key(), value=b"out-" + r.value(), partition=r.partition())
    positions = consumer.position(consumer.assignment())
    producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 60)
    try:
        producer.commit_transaction(60)
    except KafkaException as e:
        if e.args[0].txn_requires_abort():
            # A retriable failure: abort, go back to the last committed offsets and do the work again.
            producer.abort_transaction(60)
            for tp in consumer.committed(consumer.assignment(), timeout=10):
                consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))
            continue
        raise
consumer.close()
