"""aiokafka (the asyncio client, installed by `.ci/run`) against a running shardlog broker, at its default
settings.

Usage: python3 aiokafka_clients.py HOST:PORT

Creates a topic through the admin API; produces with the default producer (acks=1, not idempotent); a
group of two consumers shares the topic's partitions, consumes every record once and commits; DescribeGroups
shows the group Stable with two members, then Empty, of protocol type "consumer", once they leave. Then it
prints "restart-broker" and waits for a line on stdin: the test restarts the broker meanwhile. After the
restart the committed offsets are still there, the same producer produces again, and two new members
start exactly at the committed offsets: they get the new records and none of the old. Exits non-zero
with a message on the first mismatch; prints "aiokafka: all checks passed" at the end.
"""

import asyncio
import sys
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

BOOTSTRAP = sys.argv[1]
TOPIC, GROUP, PARTITIONS = "aio-orders", "aio-group", 4
FIRST, SECOND = 200, 100


def check(cond, message):
    if not cond:
        print(f"FAILED: {message}", file=sys.stderr, flush=True)
        sys.exit(1)


async def until(what, seconds, condition):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if await condition():
            return
        await asyncio.sleep(0.2)
    check(False, f"{what} within {seconds} s")


async def broker_restarted():
    print("restart-broker", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    check(line.strip() == "restarted", f"the test restarts the broker, said {line!r}")


async def produce(producer, first, count):
    sent = [await producer.send(TOPIC, key=f"k{i % 13}".encode(), value=f"v{i}".encode())
            for i in range(first, first + count)]
    acked = await asyncio.gather(*sent)
    check(len(acked) == count and all(m.offset >= 0 for m in acked), "every record acknowledged")


async def consume_as_group(expected):
    """Two members of GROUP consuming until `expected` records arrived and they share the partitions;
    each commits what it consumed. Returns the members and what was consumed, by (partition, offset)."""
    # With no committed offset the group starts at the earliest record (aiokafka's default is the latest).
    members = [AIOKafkaConsumer(TOPIC, bootstrap_servers=BOOTSTRAP, group_id=GROUP, auto_offset_reset="earliest")
               for _ in range(2)]
    for m in members:
        await m.start()
    seen, values = {}, []

    def shared():
        owned = [tp.partition for m in members for tp in m.assignment()]
        return all(m.assignment() for m in members) and sorted(owned) == list(range(PARTITIONS))

    deadline = time.time() + 120
    while time.time() < deadline and not (len(seen) >= expected and shared()):
        for i, m in enumerate(members):
            batches = await m.getmany(timeout_ms=100)
            for records in batches.values():
                for r in records:
                    seen.setdefault((r.partition, r.offset), []).append(i)
                    values.append(r.value.decode())
            if batches:
                await m.commit()
    check(len(seen) >= expected and shared(), f"{expected} records consumed by two members sharing the "
          f"partitions: {len(seen)}, {[sorted(tp.partition for tp in m.assignment()) for m in members]}")
    return members, seen, values


async def committed(admin):
    """The group's committed offsets by partition; a partition without a commit (-1) counts as 0."""
    offsets = await admin.list_consumer_group_offsets(GROUP)
    return {tp.partition: max(0, meta.offset) for tp, meta in offsets.items() if tp.topic == TOPIC}


async def describe(admin):
    [response] = await admin.describe_consumer_groups([GROUP])
    [group] = response.to_object()["groups"]
    check(group["error_code"] == 0, f"describe_consumer_groups: {group}")
    return group


async def main():
    admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    await admin.start()
    created = await admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)])
    errors = [t["error_code"] for t in created.to_object()["topic_errors"]]
    check(errors == [0], f"create_topics: {created}")
    described = await admin.describe_topics([TOPIC])
    check(len(described[0]["partitions"]) == PARTITIONS, f"the topic has {PARTITIONS} partitions: {described}")

    producer = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP)
    await producer.start()
    await produce(producer, 0, FIRST)

    members, seen, _ = await consume_as_group(FIRST)
    check(len(seen) == FIRST and all(len(by) == 1 for by in seen.values()), f"every record once: {len(seen)}")

    async def all_committed():
        return sum((await committed(admin)).values()) == FIRST

    await until("the consumed offsets committed", 30, all_committed)
    stable = await describe(admin)
    check(stable["state"] == "Stable" and len(stable["members"]) == 2, f"a stable group of two: {stable}")
    check(stable["protocol_type"] == "consumer", f"protocol type: {stable['protocol_type']!r}")
    for m in members:
        await m.stop()
    empty = await describe(admin)
    check(empty["state"] == "Empty" and not empty["members"], f"empty once both left: {empty['state']}")
    check(empty["protocol_type"] == "consumer", f"an empty group keeps its protocol type: {empty['protocol_type']!r}")
    before = await committed(admin)

    await broker_restarted()

    # The clients made before the restart find the broker again.
    async def reloaded():
        try:
            return await committed(admin) == before
        except Exception:  # the coordinator is still loading, or the connection is being made again
            return False

    await until("the committed offsets read after the restart", 60, reloaded)
    after = await describe(admin)
    check(after["state"] == "Empty" and after["protocol_type"] == "consumer",
          f"the group after the restart: {after['state']} {after['protocol_type']!r}")
    await produce(producer, FIRST, SECOND)

    members, seen, values = await consume_as_group(SECOND)
    # Anything consumed again would show up now.
    for _ in range(10):
        for m in members:
            for records in (await m.getmany(timeout_ms=100)).values():
                for r in records:
                    seen.setdefault((r.partition, r.offset), []).append(-1)
                    values.append(r.value.decode())
    check(len(seen) == SECOND and all(len(by) == 1 for by in seen.values()),
          f"only the new records, once each: {len(seen)} of {SECOND}")
    check(all(int(v[1:]) >= FIRST for v in values), "the group resumed at its committed offsets")
    for m in members:
        await m.stop()
    await producer.stop()
    await admin.close()
    print("aiokafka: all checks passed", flush=True)


asyncio.run(main())
