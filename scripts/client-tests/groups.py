"""Consumer groups with real clients (confluent-kafka, i.e. librdkafka, and kafka-python) against shardlog.

Usage: python3 groups.py SCENARIO HOST:PORT[,...]

With GROUP_PROTOCOL=consumer in the environment, the confluent-kafka consumers use the consumer protocol of
KIP-848 (group.protocol=consumer: the broker assigns, members move partitions incrementally) instead of
the classic one; the broker must then run with a short group.consumer.session.timeout.ms.

Scenarios (each exits non-zero with a message on the first mismatch, and prints "<scenario>: passed"):
  three-consumers   three confluent-kafka consumer processes in one group on a 12-partition topic: each
                    partition has exactly one member and every record is consumed; one member is killed
                    with SIGKILL; after its session timeout the other two take its partitions and resume
                    from its committed offsets (nothing skipped, duplicates only from its uncommitted tail)
  kafka-python      kafka-python: a member consumes half, commits and leaves; the next member of the group
                    starts exactly at the committed offsets
  cooperative       librdkafka's cooperative-sticky assignor: a second member joining takes partitions
                    from the first without the first giving up the partitions it keeps
  resume-commit     (first half of a broker-restart test) consume and commit part of a topic, then close
  resume-check      (second half) a new member of the group starts at the offsets committed before
  side-by-side      a classic group and a consumer-protocol group consume the same topic at once, each
                    every record once; ListGroups tells their types apart and each is described
  regex-and-grow    (consumer protocol) a member subscribed by regular expression gets the matching topics
                    only, then a new matching topic and a matching topic's new partitions as they appear
  member            (internal) one consumer process of three-consumers, reporting on stdout
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

SESSION_TIMEOUT_MS = 6000
PROTOCOL = os.environ.get("GROUP_PROTOCOL", "classic")


def check(cond, message):
    if not cond:
        print(f"FAILED: {message}", file=sys.stderr, flush=True)
        sys.exit(1)


def create_topic(bootstrap, topic, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(timeout=30)


def produce(bootstrap, topic, partitions, per_partition, first=0):
    """Produces `per_partition` records to each partition, values "p:i" for i from `first`."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(first, first + per_partition):
        for p in range(partitions):
            producer.produce(topic, value=f"{p}:{i}".encode(), partition=p)
    check(producer.flush(30) == 0, "every record acknowledged")


def confluent_consumer(bootstrap, group, protocol=None, **extra):
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    if (protocol or PROTOCOL) == "consumer":
        # The broker decides the session timeout and heartbeat interval of this protocol.
        config["group.protocol"] = "consumer"
    else:
        config.update({"session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": 1000})
    config.update(extra)
    return Consumer(config)


# --- three-consumers -------------------------------------------------------------------------------------


def member(bootstrap, group, topic, name):
    """One member: prints what it is assigned, every record it consumes and every commit, as JSON lines.
    Commits synchronously every 7 records (so a tail may stay uncommitted) and when partitions are taken from it."""
    consumer = confluent_consumer(bootstrap, group)

    def say(**event):
        event["member"] = name
        print(json.dumps(event), flush=True)

    def commit():
        try:
            done = consumer.commit(asynchronous=False)
        except KafkaException:
            return  # nothing consumed since the last commit
        say(committed={str(tp.partition): tp.offset for tp in done if tp.offset >= 0})

    def on_assign(c, partitions):
        say(assigned=sorted(tp.partition for tp in partitions), t=time.time())

    def on_revoke(c, partitions):
        commit()
        say(revoked=sorted(tp.partition for tp in partitions), t=time.time())

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    since_commit = 0
    while True:
        message = consumer.poll(0.2)
        if message is None:
            continue
        if message.error():
            say(error=str(message.error()))
            continue
        say(p=message.partition(), o=message.offset(), t=time.time())
        since_commit += 1
        if since_commit == 7:
            commit()
            since_commit = 0


class Members:
    """The member processes and what they reported."""

    def __init__(self):
        self.lock = threading.Lock()
        self.consumed = {}  # (partition, offset) -> [member names]
        self.consumed_at = {}  # (partition, offset) -> when first consumed
        self.changes = []  # (when, member, "assigned" or "revoked", partitions)
        self.assigned = {}  # member -> set of partitions
        self.committed = {}  # member -> {partition: offset}
        self.procs = {}

    def start(self, bootstrap, group, topic, name):
        proc = subprocess.Popen(
            [sys.executable, __file__, "member", bootstrap, group, topic, name],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs[name] = proc
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc):
        for line in proc.stdout:
            event = json.loads(line)
            name = event["member"]
            with self.lock:
                if "p" in event:
                    self.consumed.setdefault((event["p"], event["o"]), []).append(name)
                    self.consumed_at.setdefault((event["p"], event["o"]), event["t"])
                elif "assigned" in event:
                    self.assigned[name] = set(self.assigned.get(name, set())) | set(event["assigned"])
                    self.changes.append((event["t"], name, "assigned", set(event["assigned"])))
                elif "revoked" in event:
                    self.assigned[name] = set(self.assigned.get(name, set())) - set(event["revoked"])
                    self.changes.append((event["t"], name, "revoked", set(event["revoked"])))
                elif "committed" in event:
                    mine = self.committed.setdefault(name, {})
                    for p, o in event["committed"].items():
                        mine[int(p)] = max(o, mine.get(int(p), -1))

    def wait(self, what, condition, seconds):
        deadline = time.time() + seconds
        while time.time() < deadline:
            with self.lock:
                if condition():
                    return
            for name, proc in self.procs.items():
                check(proc.poll() is None or proc.returncode == -signal.SIGKILL, f"member {name} exited: {proc.returncode}")
            time.sleep(0.1)
        with self.lock:
            check(False, f"{what} within {seconds} s; assigned {self.assigned}, consumed {len(self.consumed)}")

    def stop(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def three_consumers(bootstrap):
    topic, group, partitions, per_partition = "grp-three", "three", 12, 100
    create_topic(bootstrap, topic, partitions)
    produce(bootstrap, topic, partitions, per_partition)
    members = Members()

    def records(phase):
        return {(p, o) for p in range(partitions) for o in range(phase * per_partition, (phase + 1) * per_partition)}

    def settled(names):
        sets = [members.assigned.get(n, set()) for n in names]
        union = set().union(*sets)
        return union == set(range(partitions)) and sum(len(s) for s in sets) == partitions and all(sets)

    try:
        for name in ["a", "b", "c"]:
            members.start(bootstrap, group, topic, name)
        members.wait("every record consumed by three settled members",
                     lambda: records(0) <= members.consumed.keys() and settled(["a", "b", "c"]), 90)
        with members.lock:
            sizes = sorted(len(members.assigned[n]) for n in "abc")
            check(sizes == [4, 4, 4], f"12 partitions shared 4/4/4: {members.assigned}")
        # Records for everyone's partitions, consumed and committed (every 7 records: a tail may stay
        # uncommitted) by their owners.
        produce(bootstrap, topic, partitions, per_partition, first=per_partition)
        members.wait("the second records consumed", lambda: records(1) <= members.consumed.keys(), 60)
        time.sleep(1)
        with members.lock:
            check(settled(["a", "b", "c"]), f"no rebalance meanwhile: {members.assigned}")
            victim_partitions = set(members.assigned["a"])
            victim_committed = dict(members.committed.get("a", {}))
            os.kill(members.procs["a"].pid, signal.SIGKILL)
            killed_at = time.time()
        members.procs["a"].wait()
        check(victim_partitions <= set(victim_committed),
              f"the member killed committed on each of its partitions {victim_partitions}: {victim_committed}")

        produce(bootstrap, topic, partitions, per_partition, first=2 * per_partition)
        members.wait("the survivors took over every partition and consumed every new record",
                     lambda: records(2) <= members.consumed.keys() and settled(["b", "c"]), 90)
        with members.lock:
            check(victim_partitions <= members.assigned["b"] | members.assigned["c"], "the victim's partitions moved")
            everything = records(0) | records(1) | records(2)
            skipped = everything - members.consumed.keys()
            check(not skipped, f"records never consumed: {sorted(skipped)[:10]}")
            for (p, o), by in members.consumed.items():
                if len(by) > 1:
                    check(p in victim_partitions and o >= victim_committed[p],
                          f"{p}:{o} consumed by {by}, but not from the killed member's uncommitted tail "
                          f"(it committed {victim_committed.get(p)})")
            duplicates = sum(len(by) - 1 for by in members.consumed.values())
            if PROTOCOL == "consumer":
                # Incremental: the survivors gave up nothing and kept consuming their own partitions while
                # the killed member's waited for its session to end.
                after = [c for c in members.changes if c[0] >= killed_at]
                check(all(kind == "assigned" for _, _, kind, _ in after), f"survivors revoked nothing: {after}")
                takeover = min(t for t, _, _, ps in after if ps & victim_partitions)
                own = [at for (p, o), at in members.consumed_at.items()
                       if p not in victim_partitions and o >= 2 * per_partition]
                check(len(own) == len(records(2)) - len(victim_partitions) * per_partition and max(own) < takeover,
                      f"the survivors consumed their new records before the takeover, "
                      f"{takeover - killed_at:.1f} s after the kill")
                print(f"three-consumers: survivors consumed their new records {max(own) - killed_at:.1f} s after "
                      f"the kill, took over its partitions {takeover - killed_at:.1f} s after it")
    finally:
        members.stop()
    print(f"three-consumers: passed ({len(everything)} records, {duplicates} consumed again after the kill)")


# --- kafka-python ----------------------------------------------------------------------------------------


def kafka_python(bootstrap):
    from kafka import KafkaConsumer, TopicPartition as KTopicPartition

    topic, group, partitions, per_partition = "grp-kafka-python", "kp-group", 3, 100
    create_topic(bootstrap, topic, partitions)
    produce(bootstrap, topic, partitions, per_partition)

    def consumer():
        return KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=20000,
                             session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=1000)

    first = consumer()
    seen = set()
    for message in first:
        seen.add((message.partition, message.offset))
        if len(seen) == 150:
            break
    check(len(seen) == 150, f"the first member consumed {len(seen)} of 150")
    check(sorted(tp.partition for tp in first.assignment()) == [0, 1, 2], "the only member has every partition")
    first.commit()
    committed = {p: first.committed(KTopicPartition(topic, p)) for p in range(partitions)}
    check(sum(committed.values()) == 150, f"committed positions add up to what was consumed: {committed}")
    first.close()  # leaves the group

    second = consumer()
    starts = {}
    for message in second:
        starts.setdefault(message.partition, message.offset)
        check((message.partition, message.offset) not in seen, f"{message.partition}:{message.offset} again")
        seen.add((message.partition, message.offset))
        if len(seen) == partitions * per_partition:
            break
    second.close()
    check(len(seen) == partitions * per_partition, f"{len(seen)} records consumed in all")
    for p, start in starts.items():
        check(start == committed[p], f"partition {p}: the rejoined group started at {start}, committed {committed[p]}")
    print("kafka-python: passed")


# --- cooperative -----------------------------------------------------------------------------------------


def cooperative(bootstrap):
    topic, group, partitions = "grp-cooperative", "coop", 6
    create_topic(bootstrap, topic, partitions)
    produce(bootstrap, topic, partitions, 10)
    events = {"a": [], "b": []}

    def consumer(name):
        c = confluent_consumer(bootstrap, group, **{"partition.assignment.strategy": "cooperative-sticky"})

        def on_assign(consumer, tps):
            events[name].append(("assign", sorted(tp.partition for tp in tps)))

        def on_revoke(consumer, tps):
            events[name].append(("revoke", sorted(tp.partition for tp in tps)))

        c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        return c

    def pump(consumers, condition, what, seconds=60):
        deadline = time.time() + seconds
        while time.time() < deadline:
            for c in consumers:
                c.poll(0.1)
            if condition():
                return
        check(False, f"{what} within {seconds} s: {events}")

    a = consumer("a")
    pump([a], lambda: len(a.assignment()) == partitions, "the first member gets every partition")
    check(all(kind == "assign" for kind, _ in events["a"]), f"no revocation while alone: {events['a']}")
    b = consumer("b")
    pump([a, b], lambda: len(a.assignment()) == 3 and len(b.assignment()) == 3, "the partitions are shared 3/3")
    kept = {tp.partition for tp in a.assignment()}
    taken = {tp.partition for tp in b.assignment()}
    check(not kept & taken, f"no partition owned twice: a {kept}, b {taken}")
    revoked = [set(ps) for kind, ps in events["a"] if kind == "revoke"]
    check(revoked and set().union(*revoked) == taken,
          f"the first member gave up exactly what the second took (incrementally): {events['a']}")
    # Both keep consuming after the rebalance.
    produce(bootstrap, topic, partitions, 10, first=10)
    got = {"a": 0, "b": 0}
    deadline = time.time() + 30
    while time.time() < deadline and (got["a"] < 30 or got["b"] < 30):
        for name, c in (("a", a), ("b", b)):
            m = c.poll(0.1)
            if m is not None and not m.error() and int(m.value().decode().split(":")[1]) >= 10:
                got[name] += 1
    check(got["a"] >= 30 and got["b"] >= 30, f"both members consume their new records: {got}")
    a.close()
    b.close()
    print("cooperative: passed")


# --- side by side ----------------------------------------------------------------------------------------


def side_by_side(bootstrap):
    from confluent_kafka import ConsumerGroupType
    topic, partitions, per_partition = "grp-side", 6, 50
    create_topic(bootstrap, topic, partitions)
    groups = {"side-classic": "classic", "side-consumer": "consumer"}
    consumers = {g: [confluent_consumer(bootstrap, g, protocol=p) for _ in range(2)] for g, p in groups.items()}
    for members in consumers.values():
        for c in members:
            c.subscribe([topic])

    def pump(condition, what, seconds=60):
        deadline = time.time() + seconds
        while time.time() < deadline:
            for members in consumers.values():
                for c in members:
                    m = c.poll(0.05)
                    if m is not None and not m.error():
                        seen[(c, m.partition(), m.offset())] = seen.get((c, m.partition(), m.offset()), 0) + 1
            if condition():
                return
        check(False, f"{what} within {seconds} s")

    seen = {}
    pump(lambda: all(len(c.assignment()) == partitions // 2 for ms in consumers.values() for c in ms),
         "each group shares the partitions 3/3")
    produce(bootstrap, topic, partitions, per_partition)
    expected = {(p, o) for p in range(partitions) for o in range(per_partition)}

    def consumed(group):
        return [(p, o) for (c, p, o), n in seen.items() for _ in range(n) if c in consumers[group]]

    pump(lambda: all(set(consumed(g)) == expected for g in groups), "each group consumed every record")
    for g in groups:
        check(len(consumed(g)) == len(expected), f"{g}: every record once ({len(consumed(g))})")

    admin = AdminClient({"bootstrap.servers": bootstrap})
    listed = {l.group_id: l for l in admin.list_consumer_groups().result(timeout=30).valid}
    check(listed["side-classic"].type == ConsumerGroupType.CLASSIC, f"classic type: {listed['side-classic']}")
    check(listed["side-consumer"].type == ConsumerGroupType.CONSUMER, f"consumer type: {listed['side-consumer']}")
    described = admin.describe_consumer_groups(list(groups))
    for g, future in described.items():
        d = future.result(timeout=30)
        owned = sorted(tp.partition for m in d.members for tp in m.assignment.topic_partitions)
        check(owned == list(range(partitions)), f"{g} described with every partition once: {owned}")
        check(len(d.members) == 2, f"{g}: two members")
    for members in consumers.values():
        for c in members:
            c.close()
    print("side-by-side: passed")


# --- regex subscription, new topics and partitions -------------------------------------------------------


def regex_and_grow(bootstrap):
    from confluent_kafka.admin import NewPartitions
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for topic, partitions in [("grp-re-a", 2), ("grp-re-b", 2), ("grp-other", 1)]:
        create_topic(bootstrap, topic, partitions)
    c = confluent_consumer(bootstrap, "regex-group", protocol="consumer")
    c.subscribe(["^grp-re-.*"])

    def owned():
        return {(tp.topic, tp.partition) for tp in c.assignment()}

    def wait_for(expected, what, seconds=60):
        deadline = time.time() + seconds
        while time.time() < deadline:
            c.poll(0.1)
            if owned() == expected:
                return
        check(False, f"{what} within {seconds} s: {sorted(owned())}")

    wait_for({("grp-re-a", 0), ("grp-re-a", 1), ("grp-re-b", 0), ("grp-re-b", 1)}, "the matching topics only")
    create_topic(bootstrap, "grp-re-c", 1)
    wait_for({("grp-re-a", 0), ("grp-re-a", 1), ("grp-re-b", 0), ("grp-re-b", 1), ("grp-re-c", 0)},
             "the new matching topic")
    admin.create_partitions([NewPartitions("grp-re-a", 3)])["grp-re-a"].result(timeout=30)
    wait_for({("grp-re-a", 0), ("grp-re-a", 1), ("grp-re-a", 2), ("grp-re-b", 0), ("grp-re-b", 1), ("grp-re-c", 0)},
             "the new partition")
    producer = Producer({"bootstrap.servers": bootstrap})
    for topic, partition in [("grp-re-a", 2), ("grp-re-c", 0), ("grp-other", 0)]:
        producer.produce(topic, value=b"v", partition=partition)
    check(producer.flush(30) == 0, "every record acknowledged")
    got, deadline = set(), time.time() + 60
    while time.time() < deadline and len(got) < 2:
        m = c.poll(0.2)
        if m is not None and not m.error():
            got.add((m.topic(), m.partition()))
    check(got == {("grp-re-a", 2), ("grp-re-c", 0)}, f"consumed from the new topic and partition only: {got}")
    c.close()
    print("regex-and-grow: passed")


# --- resume across a broker restart ----------------------------------------------------------------------

RESUME_TOPIC, RESUME_GROUP = "grp-resume", "resume"


def resume_commit(bootstrap):
    create_topic(bootstrap, RESUME_TOPIC, 2)
    produce(bootstrap, RESUME_TOPIC, 2, 100)
    c = confluent_consumer(bootstrap, RESUME_GROUP)
    c.subscribe([RESUME_TOPIC])
    n, deadline = 0, time.time() + 60
    while n < 120 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            n += 1
    check(n == 120, f"consumed {n} of 120")
    done = c.commit(asynchronous=False)
    committed = {tp.partition: tp.offset for tp in done}
    check(sum(committed.values()) == 120, f"committed {committed}")
    c.close()
    print("resume-commit: passed " + json.dumps(committed))


def resume_check(bootstrap, expected):
    expected = {int(p): o for p, o in json.loads(expected).items()}
    c = confluent_consumer(bootstrap, RESUME_GROUP)
    fetched = c.committed([TopicPartition(RESUME_TOPIC, p) for p in expected], timeout=30)
    check({tp.partition: tp.offset for tp in fetched} == expected, f"OffsetFetch after restart: {fetched}")
    c.subscribe([RESUME_TOPIC])
    starts, n, deadline = {}, 0, time.time() + 60
    while n < 80 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            starts.setdefault(m.partition(), m.offset())
            n += 1
    c.close()
    check(n == 80, f"consumed {n} of the 80 left")
    check(all(starts[p] == expected[p] for p in starts), f"resumed at {starts}, committed {expected}")
    print("resume-check: passed")


if __name__ == "__main__":
    scenario, bootstrap = sys.argv[1], sys.argv[2]
    if scenario == "member":
        member(bootstrap, *sys.argv[3:6])
    elif scenario == "three-consumers":
        three_consumers(bootstrap)
    elif scenario == "kafka-python":
        kafka_python(bootstrap)
    elif scenario == "cooperative":
        cooperative(bootstrap)
    elif scenario == "resume-commit":
        resume_commit(bootstrap)
    elif scenario == "resume-check":
        resume_check(bootstrap, sys.argv[3])
    elif scenario == "side-by-side":
        side_by_side(bootstrap)
    elif scenario == "regex-and-grow":
        regex_and_grow(bootstrap)
    else:
        check(False, f"unknown scenario {scenario}")
