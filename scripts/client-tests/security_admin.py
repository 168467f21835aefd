"""confluent-kafka's AdminClient managing a running shardlog broker's security metadata.

Usage: python3 security_admin.py HOST:PORT

SCRAM credentials (KIP-554): added, described, refused with Kafka's per-user errors, deleted. ACLs:
created, described with filters (ANY, MATCH, exact), deleted with the bindings each filter removed.
(confluent-kafka has no client quota API; the Rust tests set quotas with raw requests and `shardlog quota`,
and quota_throttle.py has a librdkafka producer throttled.) Exits non-zero
with a message on the first mismatch.
"""

import sys

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

BOOTSTRAP = sys.argv[1]
TIMEOUT = 30


def check(cond, message):
    if not cond:
        print(f"FAILED: {message}", file=sys.stderr)
        sys.exit(1)


def error_name(future):
    """The Kafka error name a future failed with, or None if it succeeded."""
    try:
        future.result(timeout=TIMEOUT)
        return None
    except KafkaException as e:
        return e.args[0].name()


def scram(admin):
    sha256 = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    sha512 = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    futures = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("alice", sha256, b"alice-secret"),
        UserScramCredentialUpsertion("alice2", sha512, b"alice2-secret", b"salt-of-alice2"),
    ])
    for user, future in futures.items():
        check(error_name(future) is None, f"upsert {user}: {error_name(future)}")

    described = admin.describe_user_scram_credentials().result(timeout=TIMEOUT)
    check(set(described) == {"alice", "alice2"}, f"described users: {sorted(described)}")
    infos = described["alice2"].scram_credential_infos
    check(len(infos) == 1 and infos[0].mechanism == ScramMechanism.SCRAM_SHA_512 and infos[0].iterations == 8192,
          f"alice2's credentials: {infos}")

    # Named users: one without credentials is RESOURCE_NOT_FOUND.
    named = admin.describe_user_scram_credentials(["alice", "nobody"])
    check(named["alice"].result(timeout=TIMEOUT).scram_credential_infos[0].iterations == 4096, "alice described")
    check(error_name(named["nobody"]) == "RESOURCE_NOT_FOUND", f"nobody: {error_name(named['nobody'])}")

    # Kafka's per-user errors: too few iterations, a missing credential to delete; the valid one passes.
    refused = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("weak", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"x"),
        UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_256),
        UserScramCredentialUpsertion("bob", sha256, b"bob-secret"),
    ])
    check(error_name(refused["weak"]) == "UNACCEPTABLE_CREDENTIAL", f"weak: {error_name(refused['weak'])}")
    check(error_name(refused["nobody"]) == "RESOURCE_NOT_FOUND", f"delete nobody: {error_name(refused['nobody'])}")
    check(error_name(refused["bob"]) is None, f"bob: {error_name(refused['bob'])}")

    deleted = admin.alter_user_scram_credentials([UserScramCredentialDeletion("alice", ScramMechanism.SCRAM_SHA_256)])
    check(error_name(deleted["alice"]) is None, "delete alice")
    described = admin.describe_user_scram_credentials().result(timeout=TIMEOUT)
    check(set(described) == {"alice2", "bob"}, f"after the deletion: {sorted(described)}")


def binding(name, pattern, principal="User:alice", operation=AclOperation.READ,
            permission=AclPermissionType.ALLOW, resource=ResourceType.TOPIC):
    return AclBinding(resource, name, pattern, principal, "*", operation, permission)


def acls(admin):
    orders = binding("orders", ResourcePatternType.LITERAL)
    prefixed = binding("ord", ResourcePatternType.PREFIXED)
    wildcard = binding("*", ResourcePatternType.LITERAL, "User:bob", AclOperation.WRITE, AclPermissionType.DENY)
    group = binding("app", ResourcePatternType.LITERAL, resource=ResourceType.GROUP)
    cluster = binding("kafka-cluster", ResourcePatternType.LITERAL, "User:admin", AclOperation.ALTER,
                      resource=ResourceType.BROKER)
    created = admin.create_acls([orders, prefixed, wildcard, group, cluster])
    for b, future in created.items():
        check(error_name(future) is None, f"create {b}: {error_name(future)}")

    # A CLUSTER resource is named kafka-cluster: Kafka refuses any other name with INVALID_REQUEST.
    bad = binding("other", ResourcePatternType.LITERAL, resource=ResourceType.BROKER)
    check(error_name(admin.create_acls([bad])[bad]) == "INVALID_REQUEST", "a CLUSTER resource with another name")

    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    found = admin.describe_acls(everything).result(timeout=TIMEOUT)
    check(len(found) == 5, f"all bindings: {found}")

    # MATCH for the topic "orders": its LITERAL binding, the `*` one and the PREFIXED prefix of it.
    match_orders = AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.MATCH, None, None,
                                    AclOperation.ANY, AclPermissionType.ANY)
    found = admin.describe_acls(match_orders).result(timeout=TIMEOUT)
    check(sorted(b.name for b in found) == ["*", "ord", "orders"], f"MATCH orders: {found}")
    # An exact filter: LITERAL and named, alice's only.
    exact = AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", None,
                             AclOperation.ANY, AclPermissionType.ANY)
    found = admin.describe_acls(exact).result(timeout=TIMEOUT)
    check(len(found) == 1 and found[0] == orders, f"exact orders: {found}")

    deny_only = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                 AclOperation.ANY, AclPermissionType.DENY)
    deleted = admin.delete_acls([deny_only, match_orders])
    check(deleted[deny_only].result(timeout=TIMEOUT) == [wildcard], "DENY filter removed the wildcard binding")
    removed = deleted[match_orders].result(timeout=TIMEOUT)
    check(sorted(b.name for b in removed) == ["ord", "orders"], f"MATCH orders removed: {removed}")
    left = admin.describe_acls(everything).result(timeout=TIMEOUT)
    check(sorted(b.name for b in left) == ["app", "kafka-cluster"], f"left: {left}")


def main():
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    scram(admin)
    acls(admin)
    print("security admin: all checks passed")


if __name__ == "__main__":
    main()
