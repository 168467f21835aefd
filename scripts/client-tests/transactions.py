"""Transactions with real clients at their default settings, against a running shardlog (one broker or a
cluster): confluent-kafka (librdkafka) and kafka-python transactional producers, read_committed and
read_uncommitted consumers, and a zombie fenced by a new instance of its transactional id. Run by
broker/tests/transactions_clients.rs.

    python3 transactions.py BOOTSTRAP TOPIC REPLICATION_FACTOR

Checks, each a line "ok: ..." or an exception (non-zero exit):
- a committed transaction is seen whole by read_committed consumers, an aborted one not at all, while
  read_uncommitted consumers see both;
- a second producer with the same transactional.id fences the first: the first's commit fails with a fatal
  error (PRODUCER_FENCED) and its open transaction is aborted (read_committed never sees its records);
- kafka-python's transactional producer commits and aborts the same way.
"""

import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

bootstrap, topic, replication = sys.argv[1], sys.argv[2], int(sys.argv[3])
PARTITIONS = 3

admin = AdminClient({"bootstrap.servers": bootstrap})
admin.create_topics([NewTopic(topic, PARTITIONS, replication)])[topic].result()


def consume_all(isolation, expected_at_least, seconds=30):
    """Every value in the topic as a consumer with `isolation` sees it, read until `expected_at_least`
    values came and nothing more arrives for a second."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4()}",
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got = []
    deadline = time.time() + seconds
    quiet_since = time.time()
    while time.time() < deadline:
        m = c.poll(0.2)
        if m is None:
            if len(got) >= expected_at_least and time.time() - quiet_since > 1.0:
                break
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise KafkaException(m.error())
        got.append(m.value().decode())
        quiet_since = time.time()
    c.close()
    return got


def produce(p, prefix, count):
    for i in range(count):
        p.produce(topic, key=str(i), value=f"{prefix}-{i}", partition=i % PARTITIONS)


# confluent-kafka: one committed, one aborted, one committed transaction.
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "clients-librdkafka"})
p.init_transactions(60)
p.begin_transaction()
produce(p, "committed", 30)
p.commit_transaction(60)
p.begin_transaction()
produce(p, "aborted", 20)
p.flush(30)
p.abort_transaction(60)
p.begin_transaction()
produce(p, "again", 10)
p.commit_transaction(60)
print("ok: librdkafka committed, aborted and committed a transaction")

# A zombie: the first instance has a transaction open when a second instance of its id starts.
zombie = Producer({"bootstrap.servers": bootstrap, "transactional.id": "clients-zombie"})
zombie.init_transactions(60)
zombie.begin_transaction()
produce(zombie, "zombie", 5)
zombie.flush(30)
successor = Producer({"bootstrap.servers": bootstrap, "transactional.id": "clients-zombie"})
# Aborts the zombie's open transaction first (the coordinator answers CONCURRENT_TRANSACTIONS until it is).
successor.init_transactions(60)
try:
    zombie.commit_transaction(30)
    raise SystemExit("the zombie committed after a new instance of its transactional.id started")
except KafkaException as e:
    err = e.args[0]
    assert err.fatal() or err.txn_requires_abort(), f"the zombie's commit failed, but not fatally: {err}"
    assert err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH), err
successor.begin_transaction()
produce(successor, "successor", 5)
successor.commit_transaction(60)
print("ok: a second instance fenced the first, whose transaction was aborted")

# kafka-python
from kafka import KafkaProducer  # noqa: E402

kp = KafkaProducer(bootstrap_servers=bootstrap, transactional_id="clients-kafka-python")
kp.init_transactions()
kp.begin_transaction()
for i in range(10):
    kp.send(topic, key=str(i).encode(), value=f"kafka-python-{i}".encode(), partition=i % PARTITIONS)
kp.commit_transaction()
kp.begin_transaction()
for i in range(7):
    kp.send(topic, key=str(i).encode(), value=f"kafka-python-aborted-{i}".encode(), partition=i % PARTITIONS)
kp.flush()
kp.abort_transaction()
kp.close()
print("ok: kafka-python committed and aborted a transaction")

committed = sorted(
    [f"committed-{i}" for i in range(30)]
    + [f"again-{i}" for i in range(10)]
    + [f"successor-{i}" for i in range(5)]
    + [f"kafka-python-{i}" for i in range(10)]
)
everything = sorted(
    committed
    + [f"aborted-{i}" for i in range(20)]
    + [f"zombie-{i}" for i in range(5)]
    + [f"kafka-python-aborted-{i}" for i in range(7)]
)
seen = sorted(consume_all("read_committed", len(committed)))
assert seen == committed, f"read_committed saw {len(seen)} values, expected {len(committed)}: {set(seen) ^ set(committed)}"
print(f"ok: read_committed sees exactly the {len(committed)} committed records")
seen = sorted(consume_all("read_uncommitted", len(everything)))
assert seen == everything, f"read_uncommitted saw {len(seen)}, expected {len(everything)}: {set(seen) ^ set(everything)}"
print(f"ok: read_uncommitted sees all {len(everything)} records")
print("ok")
