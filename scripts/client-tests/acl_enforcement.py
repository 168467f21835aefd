"""ACLs enforced on a running shardlog broker, seen by confluent-kafka clients.

Usage: python3 acl_enforcement.py HOST:PORT ADMIN_PASSWORD ALICE_PASSWORD BOB_PASSWORD

HOST:PORT is a SASL_PLAINTEXT listener offering SCRAM-SHA-256; `authorizer.class.name` is the
StandardAuthorizer with `super.users = User:admin`; the three users exist. The super user grants alice
access through PREFIXED, LITERAL and `*` ACLs, with a DENY over an ALLOW; bob has no ACL. Each client's
calls get Kafka's authorization errors, and Metadata shows each principal only what it may describe.
Prints "ok" on success; exits non-zero with a message on the first mismatch.
"""

import sys
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

BOOTSTRAP, ADMIN_PW, ALICE_PW, BOB_PW = sys.argv[1:5]
TIMEOUT = 30


def check(cond, message):
    if not cond:
        print(f"FAILED: {message}", file=sys.stderr)
        sys.exit(1)


def conf(user, password, **extra):
    base = {
        "bootstrap.servers": BOOTSTRAP,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": user,
        "sasl.password": password,
    }
    base.update(extra)
    return base


def error_code(future):
    try:
        future.result(timeout=TIMEOUT)
        return None
    except KafkaException as e:
        return e.args[0].code()


admin = AdminClient(conf("admin", ADMIN_PW))
alice_admin = AdminClient(conf("alice", ALICE_PW))
bob_admin = AdminClient(conf("bob", BOB_PW))

# The super user makes the topics; bob, without ACLs, may not.
for name, code in admin.create_topics([NewTopic(t, 1, 1) for t in ["app-orders", "app-secret", "payroll"]]).items():
    check(error_code(code) is None, f"admin creates {name}")
code = error_code(bob_admin.create_topics([NewTopic("bobs-topic", 1, 1)])["bobs-topic"])
check(code == KafkaError.TOPIC_AUTHORIZATION_FAILED, f"bob creating a topic: {code}")
code = error_code(
    bob_admin.create_acls(
        [AclBinding(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, "User:bob", "*", AclOperation.ALL,
                    AclPermissionType.ALLOW)]
    )[
        AclBinding(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, "User:bob", "*", AclOperation.ALL,
                   AclPermissionType.ALLOW)
    ]
)
check(code == KafkaError.CLUSTER_AUTHORIZATION_FAILED, f"bob creating an ACL: {code}")

ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
grants = [
    # Everything under app-: PREFIXED.
    AclBinding(ResourceType.TOPIC, "app-", ResourcePatternType.PREFIXED, "User:alice", "*", AclOperation.WRITE, ALLOW),
    AclBinding(ResourceType.TOPIC, "app-", ResourcePatternType.PREFIXED, "User:alice", "*", AclOperation.READ, ALLOW),
    # ... but not app-secret: DENY wins over ALLOW.
    AclBinding(ResourceType.TOPIC, "app-secret", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.ALL, DENY),
    # Any group: the LITERAL `*` name.
    AclBinding(ResourceType.GROUP, "*", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.READ, ALLOW),
]
for binding, future in admin.create_acls(grants).items():
    check(error_code(future) is None, f"creating {binding}")

# Metadata for all topics: alice sees what she may describe (READ and WRITE imply DESCRIBE), bob nothing.
alice_topics = set(alice_admin.list_topics(timeout=TIMEOUT).topics)
check(alice_topics == {"app-orders"}, f"alice's topics: {sorted(alice_topics)}")
bob_topics = set(bob_admin.list_topics(timeout=TIMEOUT).topics)
check(bob_topics == set(), f"bob's topics: {sorted(bob_topics)}")

# Alice's default (idempotent) producer writes app-orders (KIP-679: WRITE on a topic lets it
# InitProducerId), and is refused app-secret and payroll.
producer = Producer(conf("alice", ALICE_PW, **{"enable.idempotence": True, "message.timeout.ms": 20000}))
results = {}


def delivered(err, msg):
    results[msg.topic()] = err.code() if err else None


for topic in ["app-orders", "app-secret", "payroll"]:
    producer.produce(topic, value=b"v", on_delivery=delivered)
producer.flush(TIMEOUT)
check(results.get("app-orders") is None, f"alice producing app-orders: {results}")
check(results.get("app-secret") == KafkaError.TOPIC_AUTHORIZATION_FAILED, f"app-secret: {results}")
check(results.get("payroll") == KafkaError.TOPIC_AUTHORIZATION_FAILED, f"payroll: {results}")

# Alice consumes app-orders in a group of her own.
consumer = Consumer(conf("alice", ALICE_PW, **{"group.id": "alice-" + uuid.uuid4().hex[:6], "auto.offset.reset": "earliest"}))
consumer.subscribe(["app-orders"])
message = None
for _ in range(40):
    message = consumer.poll(1)
    if message is not None and message.error() is None:
        break
check(message is not None and message.error() is None and message.value() == b"v", f"alice consuming: {message}")
consumer.close()

# Bob's consumer is refused the topic.
bob = Consumer(conf("bob", BOB_PW, **{"group.id": "bobs", "auto.offset.reset": "earliest"}))
bob.assign([TopicPartition("app-orders", 0, 0)])
refused = None
for _ in range(20):
    m = bob.poll(1)
    if m is not None and m.error() is not None:
        refused = m.error().code()
        break
check(refused in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED), f"bob consuming: {refused}")
bob.close()
print("ok")
