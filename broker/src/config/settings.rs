//! The broker's settings table: every key the TOML file and `--set` accept, with its type, range,
//! default, unit and meaning. The parser ([`super::BrokerConfig::load`]) reads values through this
//! table, `shardlog config list` prints it, and DescribeConfigs answers from it, so the three never
//! disagree. A key that is not in the table is refused; so is a key shardlog knows but does not
//! implement ([`UNSUPPORTED`]), with the reason.

/// The type and valid range of a setting's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A TOML integer in `[min, max]`.
    Int {
        min: i64,
        max: i64,
    },
    Bool,
    /// A TOML string.
    Text,
    /// A list: Kafka's comma-separated string, or a TOML array of strings.
    List,
}

/// Where a setting's value comes from when it is not set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Default {
    /// This value, written as it would be set.
    Value(&'static str),
    /// Worked out at start (or no value at all); the text says how.
    Derived(&'static str),
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// Kafka's name for it, where Kafka has one.
    pub key: &'static str,
    pub kind: Kind,
    pub default: Default,
    /// `ms`, `us`, `s`, `min`, `bytes`, or empty for counts, ids, flags, percentages and addresses.
    pub unit: &'static str,
    /// One line.
    pub meaning: &'static str,
    /// A valid value other than the default (the tests set every key to it and check it has an effect).
    pub example: &'static str,
}

impl Setting {
    /// The default as `shardlog config list` shows it.
    pub fn default_text(&self) -> &'static str {
        match self.default {
            Default::Value(v) | Default::Derived(v) => v,
        }
    }

    /// Kafka's config type code in DescribeConfigs (v3+): BOOLEAN 1, STRING 2, LONG 5.
    pub fn kafka_type(&self) -> i8 {
        match self.kind {
            Kind::Bool => 1,
            Kind::Text => 2,
            Kind::List => 7,
            Kind::Int { .. } => 5,
        }
    }
}

const I32: i64 = i32::MAX as i64;
const I16: i64 = i16::MAX as i64;
const FOREVER: i64 = i64::MAX;

const fn int(min: i64, max: i64) -> Kind {
    Kind::Int { min, max }
}

/// Every broker setting, in the order `shardlog config list` prints them.
pub const SETTINGS: &[Setting] = &[
    Setting {
        key: "node.id",
        kind: int(0, I32),
        default: Default::Value("1"),
        unit: "",
        meaning: "this broker's id (and its quorum voter's, when listed in controller.quorum.voters)",
        example: "2",
    },
    Setting {
        key: "log.dirs",
        kind: Kind::Text,
        default: Default::Value("data"),
        unit: "",
        meaning: "the data directory (one): partition logs, checkpoints, the quorum's files",
        example: "/var/lib/shardlog",
    },
    Setting {
        key: "listeners",
        kind: Kind::List,
        default: Default::Value("PLAINTEXT://127.0.0.1:9092"),
        unit: "",
        meaning: "the Kafka listeners, NAME://HOST:PORT,... (a bare HOST:PORT is PLAINTEXT); each its own port",
        example: "PLAINTEXT://127.0.0.1:9192",
    },
    Setting {
        key: "listener.security.protocol.map",
        kind: Kind::List,
        default: Default::Value(super::listeners::DEFAULT_PROTOCOL_MAP),
        unit: "",
        meaning: "NAME:PROTOCOL,... what each listener speaks: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
        example: "PLAINTEXT:SASL_PLAINTEXT",
    },
    Setting {
        key: "metrics.listen",
        kind: Kind::Text,
        default: Default::Value("127.0.0.1:9644"),
        unit: "",
        meaning: "the Prometheus endpoint, HOST:PORT: GET /metrics, /health, /ready (port 0: any free port, logged)",
        example: "0.0.0.0:9644",
    },
    Setting {
        key: "advertised.listeners",
        kind: Kind::List,
        default: Default::Derived("the listeners"),
        unit: "",
        meaning: "NAME://HOST:PORT,... what Metadata tells the clients of each listener (HOST:PORT with one listener)",
        example: "broker1.example:9092",
    },
    Setting {
        key: "ssl.keystore.location",
        kind: Kind::Text,
        default: Default::Derived("unset"),
        unit: "",
        meaning: "TLS listeners: PEM file with the private key and certificate chain (listener.name.NAME.ssl.* overrides)",
        example: "/etc/shardlog/broker.pem",
    },
    Setting {
        key: "ssl.truststore.location",
        kind: Kind::Text,
        default: Default::Derived("unset"),
        unit: "",
        meaning: "TLS listeners: PEM file of the authorities client certificates are checked against",
        example: "/etc/shardlog/ca.pem",
    },
    Setting {
        key: "ssl.client.auth",
        kind: Kind::Text,
        default: Default::Value("none"),
        unit: "",
        meaning: "TLS listeners: ask clients for a certificate: none, requested or required",
        example: "requested",
    },
    Setting {
        key: "ssl.principal.mapping.rules",
        kind: Kind::Text,
        default: Default::Value("DEFAULT"),
        unit: "",
        meaning: "RULE:pattern/replacement/[LU],...,DEFAULT: a client certificate's subject to the principal User:NAME",
        example: "RULE:^CN=([^,]*).*$/$1/L,DEFAULT",
    },
    Setting {
        key: "ssl.enabled.protocols",
        kind: Kind::List,
        default: Default::Value("TLSv1.2,TLSv1.3"),
        unit: "",
        meaning: "TLS listeners: the TLS versions served (TLSv1.2 and TLSv1.3 only)",
        example: "TLSv1.3",
    },
    Setting {
        key: "cluster.ssl.keystore.location",
        kind: Kind::Text,
        default: Default::Derived("unset"),
        unit: "",
        meaning: "mutual TLS among brokers and voters (replication, quorum port): PEM file with this node's key and certificate, named CN=node-<node.id>",
        example: "/etc/shardlog/node-1.pem",
    },
    Setting {
        key: "cluster.ssl.truststore.location",
        kind: Kind::Text,
        default: Default::Derived("unset"),
        unit: "",
        meaning: "mutual TLS among brokers and voters: PEM file of the cluster's authority (set both cluster.ssl files or neither)",
        example: "/etc/shardlog/cluster-ca.pem",
    },
    Setting {
        key: "sasl.enabled.mechanisms",
        kind: Kind::List,
        default: Default::Value("SCRAM-SHA-256,SCRAM-SHA-512"),
        unit: "",
        meaning: "SASL listeners: mechanisms offered: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER",
        example: "PLAIN,SCRAM-SHA-512",
    },
    Setting {
        key: "sasl.server.max.receive.size",
        kind: int(64, I32),
        default: Default::Value("524288"),
        unit: "bytes",
        meaning: "SASL listeners: the largest frame a client may send before it has authenticated",
        example: "65536",
    },
    Setting {
        key: "connection.failed.authentication.delay.ms",
        kind: int(0, 60_000),
        default: Default::Value("100"),
        unit: "ms",
        meaning: "a failed authentication is answered this late, then the connection is closed",
        example: "500",
    },
    Setting {
        key: "connections.max.reauth.ms",
        kind: int(0, FOREVER),
        default: Default::Value("0"),
        unit: "ms",
        meaning: "SASL sessions last at most this long before the client must authenticate again (KIP-368); 0: for ever",
        example: "3600000",
    },
    Setting {
        key: "sasl.oauthbearer.jwks.endpoint.url",
        kind: Kind::Text,
        default: Default::Derived("unset"),
        unit: "",
        meaning: "OAUTHBEARER: the JWKS file (file:///PATH or a path) whose keys sign the tokens; read again when it changes",
        example: "file:///etc/shardlog/jwks.json",
    },
    Setting {
        key: "sasl.oauthbearer.expected.issuer",
        kind: Kind::Text,
        default: Default::Derived("unset: any issuer"),
        unit: "",
        meaning: "OAUTHBEARER: the iss claim tokens must carry",
        example: "https://login.example",
    },
    Setting {
        key: "sasl.oauthbearer.expected.audience",
        kind: Kind::List,
        default: Default::Derived("unset: any audience"),
        unit: "",
        meaning: "OAUTHBEARER: tokens must name one of these in their aud claim",
        example: "shardlog",
    },
    Setting {
        key: "sasl.oauthbearer.sub.claim.name",
        kind: Kind::Text,
        default: Default::Value("sub"),
        unit: "",
        meaning: "OAUTHBEARER: the claim whose value is the principal's name",
        example: "client_id",
    },
    Setting {
        key: "sasl.oauthbearer.clock.skew.seconds",
        kind: int(0, 3600),
        default: Default::Value("30"),
        unit: "s",
        meaning: "OAUTHBEARER: how far the broker's clock and the token issuer's may differ",
        example: "60",
    },
    Setting {
        key: "authorizer.class.name",
        kind: Kind::Text,
        default: Default::Derived("unset: every request is allowed"),
        unit: "",
        meaning: "org.apache.kafka.metadata.authorizer.StandardAuthorizer turns on ACL authorization (the only value)",
        example: "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    },
    Setting {
        key: "super.users",
        kind: Kind::Text,
        default: Default::Derived("none"),
        unit: "",
        meaning: "principals allowed everything, semicolon-separated as in Kafka: User:admin;User:ops",
        example: "User:admin;User:ops",
    },
    Setting {
        key: "allow.everyone.if.no.acl.found",
        kind: Kind::Bool,
        default: Default::Value("false"),
        unit: "",
        meaning: "a resource no ACL names is open to everyone (false: denied to all but super users)",
        example: "true",
    },
    Setting {
        key: "shards",
        kind: int(1, 1024),
        default: Default::Derived("number of CPUs"),
        unit: "",
        meaning: "shard executors, each owning a share of the partitions (pinned one per core when they fit)",
        example: "7",
    },
    Setting {
        key: "controller.quorum.voters",
        kind: Kind::Text,
        default: Default::Derived("unset: its own quorum"),
        unit: "",
        meaning: "quorum voters ID@HOST:PORT,... (1, 3 or 5); a listed node.id runs its voter; unset: a one-voter quorum without a port",
        example: "1@127.0.0.1:9192,2@127.0.0.1:9193,3@127.0.0.1:9194",
    },
    Setting {
        key: "broker.session.timeout.ms",
        kind: int(100, 3_600_000),
        default: Default::Value("9000"),
        unit: "ms",
        meaning: "a broker not heard from for this long is fenced (voters); a broker unanswered this long stops leading",
        example: "12000",
    },
    Setting {
        key: "broker.heartbeat.interval.ms",
        kind: int(10, 3_600_000),
        default: Default::Value("2000"),
        unit: "ms",
        meaning: "how often the broker heartbeats to the quorum (less than broker.session.timeout.ms)",
        example: "1000",
    },
    Setting {
        key: "auto.leader.rebalance.enable",
        kind: Kind::Bool,
        default: Default::Value("true"),
        unit: "",
        meaning: "the quorum voter this broker runs, while it leads, moves leadership back to preferred replicas when a broker leads too few of its own (standalone voters: `shardlog quorum --auto-leader-rebalance-enable`)",
        example: "false",
    },
    Setting {
        key: "leader.imbalance.check.interval.seconds",
        kind: int(1, I32),
        default: Default::Value("300"),
        unit: "s",
        meaning: "how often the quorum's leader looks for leadership to move back (auto.leader.rebalance.enable)",
        example: "30",
    },
    Setting {
        key: "leader.imbalance.per.broker.percentage",
        kind: int(0, 100),
        default: Default::Value("10"),
        unit: "",
        meaning: "a broker not leading more than this percentage of the partitions it is preferred for gets them back",
        example: "20",
    },
    Setting {
        key: "auto.create.topics.enable",
        kind: Kind::Bool,
        default: Default::Value("true"),
        unit: "",
        meaning: "create a topic that Metadata asks for and does not exist",
        example: "false",
    },
    Setting {
        key: "num.partitions",
        kind: int(1, 100_000),
        default: Default::Value("3"),
        unit: "",
        meaning: "partitions of a topic created without a count (auto-created, or -1)",
        example: "6",
    },
    Setting {
        key: "default.replication.factor",
        kind: int(1, I16),
        default: Default::Value("1"),
        unit: "",
        meaning: "replicas of a topic created without a replication factor",
        example: "3",
    },
    Setting {
        key: "socket.request.max.bytes",
        kind: int(1024, I32),
        default: Default::Value("104857600"),
        unit: "bytes",
        meaning: "the largest request frame accepted; a larger one closes the connection",
        example: "1048576",
    },
    Setting {
        key: "queued.max.request.bytes",
        kind: int(1024, FOREVER),
        default: Default::Value("268435456"),
        unit: "bytes",
        meaning: "request bytes all clients together may have being read or waiting for an answer; a frame that does not fit waits unread (at least socket.request.max.bytes)",
        example: "536870912",
    },
    Setting {
        key: "socket.request.timeout.ms",
        kind: int(1, FOREVER),
        default: Default::Value("30000"),
        unit: "ms",
        meaning: "a request frame must arrive whole within this long of its first byte, or the connection is closed",
        example: "10000",
    },
    Setting {
        key: "log.slow.request.ms",
        kind: int(0, FOREVER),
        default: Default::Value("5000"),
        unit: "ms",
        meaning: "a request answered later than this is logged (INFO) with its API, partitions and where the time \
                  went (JoinGroup and SyncGroup, which wait for the group, and a Fetch's max.wait.ms are left \
                  out); 0 logs every request",
        example: "1000",
    },
    Setting {
        key: "connections.max.idle.ms",
        kind: int(1, FOREVER),
        default: Default::Value("600000"),
        unit: "ms",
        meaning: "a client connection with no request in hand and no bytes either way for this long is closed",
        example: "60000",
    },
    Setting {
        key: "max.connections",
        kind: int(1, I32),
        default: Default::Value("10000"),
        unit: "",
        meaning: "client connections open at once; more are closed as they are accepted (lowered to fit the open file limit)",
        example: "1000",
    },
    Setting {
        key: "max.connections.per.ip",
        kind: int(1, I32),
        default: Default::Value("2147483647"),
        unit: "",
        meaning: "client connections open at once from one address; more are closed as they are accepted",
        example: "100",
    },
    Setting {
        key: "max.connection.creation.rate",
        kind: int(1, I32),
        default: Default::Value("2147483647"),
        unit: "",
        meaning: "client connections accepted per second, all listeners but the inter-broker one together, measured \
                  as client quotas are; past it the listeners wait before accepting more (the default: unbounded). \
                  listener.name.<name>.max.connection.creation.rate limits one listener, the inter-broker one too",
        example: "100",
    },
    Setting {
        key: "quota.window.num",
        kind: int(2, 3600),
        default: Default::Value("11"),
        unit: "",
        meaning: "samples a client quota's rate is measured over; after a quiet spell a client may burst to \
                  (quota.window.num - 1) samples' worth of its quota",
        example: "2",
    },
    Setting {
        key: "quota.window.size.seconds",
        kind: int(1, 3600),
        default: Default::Value("1"),
        unit: "s",
        meaning: "the time one sample of a client quota's rate covers",
        example: "2",
    },
    Setting {
        key: "message.max.bytes",
        kind: int(1024, I32),
        default: Default::Value("1048588"),
        unit: "bytes",
        meaning: "default max.message.bytes of topics: the largest record batch accepted",
        example: "2097152",
    },
    Setting {
        key: "compression.type",
        kind: Kind::Text,
        default: Default::Value("producer"),
        unit: "",
        meaning: "default compression.type of topics: producer (store as sent), uncompressed, gzip, snappy, lz4, zstd",
        example: "zstd",
    },
    Setting {
        key: "log.segment.bytes",
        kind: int(61, I32),
        default: Default::Value("1073741824"),
        unit: "bytes",
        meaning: "default segment.bytes: a segment is rolled before it grows past this",
        example: "104857600",
    },
    Setting {
        key: "log.roll.ms",
        kind: int(1, FOREVER),
        default: Default::Value("604800000"),
        unit: "ms",
        meaning: "default segment.ms: a segment older than this is rolled on the next append",
        example: "3600000",
    },
    Setting {
        key: "log.retention.ms",
        kind: int(-1, FOREVER),
        default: Default::Value("604800000"),
        unit: "ms",
        meaning: "default retention.ms: segments whose newest record is older are deleted (-1: keep)",
        example: "-1",
    },
    Setting {
        key: "log.retention.bytes",
        kind: int(-1, FOREVER),
        default: Default::Value("-1"),
        unit: "bytes",
        meaning: "default retention.bytes: oldest segments are deleted while a partition is larger (-1: no limit)",
        example: "1073741824",
    },
    Setting {
        key: "log.flush.interval.messages",
        kind: int(1, FOREVER),
        default: Default::Derived("unset"),
        unit: "",
        meaning: "with it or log.flush.interval.ms set: Kafka's interval flush (acks mean written, not synced)",
        example: "10000",
    },
    Setting {
        key: "log.flush.interval.ms",
        kind: int(1, FOREVER),
        default: Default::Derived("unset"),
        unit: "ms",
        meaning: "see log.flush.interval.messages; unset, every acknowledged batch is fdatasync'ed first",
        example: "1000",
    },
    Setting {
        key: "log.dir.min.free.bytes",
        kind: int(0, FOREVER),
        default: Default::Value("1073741824"),
        unit: "bytes",
        meaning: "produce is refused (KAFKA_STORAGE_ERROR) while the data dir's disk has less free, and the space partitions reserve ahead of their writes never takes it; fetches, deletions and retention go on",
        example: "536870912",
    },
    Setting {
        key: "log.index.interval.bytes",
        kind: int(1, I32),
        default: Default::Value("4096"),
        unit: "bytes",
        meaning: "bytes of log between two entries of the sparse offset and time indexes",
        example: "8192",
    },
    Setting {
        key: "producer.id.expiration.ms",
        kind: int(1, FOREVER),
        default: Default::Value("86400000"),
        unit: "ms",
        meaning: "a partition forgets an idempotent producer whose last batch is this old (its next batch is then accepted at any sequence)",
        example: "3600000",
    },
    Setting {
        key: "min.insync.replicas",
        kind: int(1, I16),
        default: Default::Value("1"),
        unit: "",
        meaning: "default min.insync.replicas: acks=all is refused (NOT_ENOUGH_REPLICAS) with a smaller ISR",
        example: "2",
    },
    Setting {
        key: "offsets.topic.num.partitions",
        kind: int(1, 10_000),
        default: Default::Value("50"),
        unit: "",
        meaning: "partitions of __consumer_offsets, created when the first group asks for its coordinator",
        example: "12",
    },
    Setting {
        key: "offsets.topic.replication.factor",
        kind: int(1, I16),
        default: Default::Value("3"),
        unit: "",
        meaning: "replicas of each __consumer_offsets partition (fewer when fewer brokers are live at its creation)",
        example: "1",
    },
    Setting {
        key: "offsets.topic.segment.bytes",
        kind: int(61, I32),
        default: Default::Value("104857600"),
        unit: "bytes",
        meaning: "segment.bytes of __consumer_offsets (compaction cleans closed segments only)",
        example: "1048576",
    },
    Setting {
        key: "offsets.commit.timeout.ms",
        kind: int(1, I32),
        default: Default::Value("5000"),
        unit: "ms",
        meaning: "how long an offset commit or group change waits for the offsets partition's in-sync replicas",
        example: "10000",
    },
    Setting {
        key: "offset.metadata.max.bytes",
        // The offsets topic's records count a string's bytes in an int16.
        kind: int(0, I16),
        default: Default::Value("4096"),
        unit: "bytes",
        meaning: "the longest metadata string an offset commit may carry (OFFSET_METADATA_TOO_LARGE beyond)",
        example: "1024",
    },
    Setting {
        key: "offsets.retention.minutes",
        kind: int(1, I32),
        default: Default::Value("10080"),
        unit: "min",
        meaning: "how long a group without members keeps its committed offsets (from the later of each commit and the group becoming empty)",
        example: "1440",
    },
    Setting {
        key: "offsets.retention.check.interval.ms",
        kind: int(1, I32),
        default: Default::Value("600000"),
        unit: "ms",
        meaning: "how often committed offsets are checked against offsets.retention.minutes",
        example: "60000",
    },
    Setting {
        key: "transaction.state.log.num.partitions",
        kind: int(1, 10_000),
        default: Default::Value("50"),
        unit: "",
        meaning: "partitions of __transaction_state, created when the first producer asks for its transaction coordinator",
        example: "12",
    },
    Setting {
        key: "transaction.state.log.replication.factor",
        kind: int(1, I16),
        default: Default::Value("3"),
        unit: "",
        meaning: "replicas of each __transaction_state partition (fewer when fewer brokers are live at its creation)",
        example: "1",
    },
    Setting {
        key: "transaction.state.log.min.isr",
        kind: int(1, I16),
        default: Default::Value("2"),
        unit: "",
        meaning: "min.insync.replicas of __transaction_state (at most its replication factor)",
        example: "1",
    },
    Setting {
        key: "transaction.state.log.segment.bytes",
        kind: int(61, I32),
        default: Default::Value("104857600"),
        unit: "bytes",
        meaning: "segment.bytes of __transaction_state (compaction cleans closed segments only)",
        example: "1048576",
    },
    Setting {
        key: "transaction.max.timeout.ms",
        kind: int(1, I32),
        default: Default::Value("900000"),
        unit: "ms",
        meaning: "the longest transaction.timeout.ms a transactional producer may ask for (INVALID_TRANSACTION_TIMEOUT beyond)",
        example: "60000",
    },
    Setting {
        key: "transactional.id.expiration.ms",
        kind: int(1, I32),
        default: Default::Value("604800000"),
        unit: "ms",
        meaning: "how long the transaction coordinator keeps a transactional id that has had no transaction",
        example: "86400000",
    },
    Setting {
        key: "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        kind: int(1, I32),
        default: Default::Value("10000"),
        unit: "ms",
        meaning: "how often the transaction coordinator aborts transactions open longer than their timeout and forgets expired ids",
        example: "1000",
    },
    Setting {
        key: "group.initial.rebalance.delay.ms",
        kind: int(0, I32),
        default: Default::Value("3000"),
        unit: "ms",
        meaning: "how long the first rebalance of an empty group waits for more members to join",
        example: "0",
    },
    Setting {
        key: "group.min.session.timeout.ms",
        kind: int(1, I32),
        default: Default::Value("6000"),
        unit: "ms",
        meaning: "the shortest session.timeout.ms a group member may ask for (INVALID_SESSION_TIMEOUT below)",
        example: "1000",
    },
    Setting {
        key: "group.max.session.timeout.ms",
        kind: int(1, I32),
        default: Default::Value("1800000"),
        unit: "ms",
        meaning: "the longest session.timeout.ms a group member may ask for (INVALID_SESSION_TIMEOUT above)",
        example: "600000",
    },
    Setting {
        key: "group.max.size",
        kind: int(1, I32),
        default: Default::Value("1000"),
        unit: "",
        meaning: "members one consumer group may have (GROUP_MAX_SIZE_REACHED beyond); Kafka leaves it unbounded",
        example: "100",
    },
    Setting {
        key: "group.consumer.session.timeout.ms",
        kind: int(1000, 3_600_000),
        default: Default::Value("45000"),
        unit: "ms",
        meaning: "how long a member of a consumer-protocol group (group.protocol=consumer) may go without a heartbeat before it is removed",
        example: "10000",
    },
    Setting {
        key: "group.consumer.heartbeat.interval.ms",
        kind: int(100, I32),
        default: Default::Value("5000"),
        unit: "ms",
        meaning: "how often members of a consumer-protocol group are told to heartbeat; below group.consumer.session.timeout.ms",
        example: "1000",
    },
    Setting {
        key: "group.consumer.max.size",
        kind: int(1, I32),
        default: Default::Value("1000"),
        unit: "",
        meaning: "members one consumer-protocol group may have (GROUP_MAX_SIZE_REACHED beyond); Kafka leaves it unbounded",
        example: "100",
    },
    Setting {
        key: "group.consumer.assignors",
        kind: Kind::Text,
        default: Default::Value("uniform,range"),
        unit: "",
        meaning: "server-side assignors members may choose with group.remote.assignor (uniform, range), the first the default",
        example: "range",
    },
    Setting {
        key: "replica.lag.time.max.ms",
        // Below a second an idle follower, whose fetches the leader holds for up to 500 ms, could drop out.
        kind: int(1000, FOREVER),
        default: Default::Value("30000"),
        unit: "ms",
        meaning: "a follower that has not caught up with the leader's log end for this long is taken out of the ISR",
        example: "10000",
    },
    Setting {
        key: "shard.open.files.max",
        kind: int(16, 1 << 20),
        default: Default::Value("4096"),
        unit: "",
        meaning: "segment files a shard keeps open; the least recently used are closed beyond it",
        example: "1024",
    },
    Setting {
        key: "shard.producer.ids.max",
        kind: int(1, I32),
        default: Default::Value("500000"),
        unit: "",
        meaning: "idempotent producer ids a shard's partitions remember together (about 250 bytes each); past it a new id's batches are stored but not deduplicated, as if it had expired",
        example: "100000",
    },
    Setting {
        key: "shard.cache.max.bytes",
        kind: int(0, FOREVER),
        default: Default::Value("268435456"),
        unit: "bytes",
        meaning: "memory a shard's partitions may hold in their caches of recent data",
        example: "67108864",
    },
    Setting {
        key: "shard.fetch.readahead.bytes",
        kind: int(0, FOREVER),
        default: Default::Value("67108864"),
        unit: "bytes",
        meaning: "memory a shard may hold in reads made ahead for consumers catching up: when a fetch of a partition comes back full, its next ranges (up to four, ranges behind the first within half of this) are read while the answers are on their way (0: no read-ahead)",
        example: "0",
    },
    Setting {
        key: "log.cleaner.backoff.ms",
        kind: int(1, FOREVER),
        default: Default::Value("15000"),
        unit: "ms",
        meaning: "how often each shard looks for compacted partitions (cleanup.policy=compact) dirty enough to clean",
        example: "1000",
    },
    Setting {
        key: "log.cleaner.dedupe.buffer.size",
        kind: int(1024, FOREVER),
        default: Default::Value("134217728"),
        unit: "bytes",
        meaning: "memory one shard's cleaning pass may take for its map of keys (a pass cleans as many segments \
                  as their keys fit)",
        example: "33554432",
    },
    Setting {
        key: "shard.cache.idle.ms",
        kind: int(1, FOREVER),
        default: Default::Value("10000"),
        unit: "ms",
        meaning: "a partition neither written nor read this long releases its cache and closes its files",
        example: "60000",
    },
    Setting {
        key: "test.acks.all.before.replication",
        kind: Kind::Bool,
        default: Default::Value("false"),
        unit: "",
        meaning: "FOR TESTS ONLY, breaks acks=all: a leader answers acks=all once the batch is on its own disk, without waiting for the in-sync followers (fault campaigns show they catch the lost writes)",
        example: "true",
    },
    Setting {
        key: "test.stall.shard",
        kind: int(-1, 1023),
        default: Default::Value("-1"),
        unit: "",
        meaning: "FOR TESTS ONLY, stalls the broker: a second after it serves, this shard's thread blocks for good \
                  (the systemd watchdog test); -1: none",
        example: "0",
    },
    Setting {
        key: "shard.idle.poll.us",
        kind: int(0, 1_000_000),
        default: Default::Value("0"),
        unit: "us",
        meaning: "how long an idle shard polls for work before it sleeps (shards pinned to a core only)",
        example: "50",
    },
];

/// Keys Kafka users may reach for that shardlog knows but does not implement, refused with the reason
/// rather than accepted and ignored.
pub const UNSUPPORTED: &[(&str, &str)] = &[(
    "unclean.leader.election.enable",
    "leaders are elected by the quorum from each topic's own setting: set it per topic \
         (shardlog topic create ... --config unclean.leader.election.enable=true)",
)];

/// The row for `key`.
pub fn setting(key: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.key == key)
}

/// How [`sample`] marks a line that gives an example value rather than the default.
pub const EXAMPLE_MARK: &str = "# an example";

/// A settings file for `--config` listing every broker setting with its meaning and default, each
/// commented out (`shardlog config sample`; `deploy/shardlog.toml` is its output). Test-only settings
/// are left out.
pub fn sample() -> String {
    let mut out = String::from(
        "# shardlog broker settings: the file `shardlog start --config` reads (Kafka's names, as TOML).\n\
         # Every setting is listed with its default, commented out: uncomment a line to change it.\n\
         # `shardlog start --set KEY=VALUE` wins over this file. Generated by `shardlog config sample`.\n\
         # Keys are quoted: some are prefixes of others (max.connections, max.connections.per.ip), which\n\
         # TOML's dotted keys cannot both hold.\n",
    );
    for setting in SETTINGS.iter().filter(|s| !s.key.starts_with("test.")) {
        let unit = if setting.unit.is_empty() { String::new() } else { format!(" ({})", setting.unit) };
        out.push_str(&format!("\n# {}{unit}\n", setting.meaning));
        let toml_value = |v: &str| match setting.kind {
            Kind::Text | Kind::List => toml::Value::String(v.to_string()).to_string(),
            Kind::Int { .. } | Kind::Bool => v.to_string(),
        };
        // Every setting line is TOML once its `# ` is removed; a default worked out at start has no
        // value to write, so its line gives the example, marked as such in a TOML comment.
        match setting.default {
            Default::Value(v) => out.push_str(&format!("# \"{}\" = {}\n", setting.key, toml_value(v))),
            Default::Derived(how) => out.push_str(&format!(
                "# \"{}\" = {}  {EXAMPLE_MARK} (default: {how})\n",
                setting.key,
                toml_value(setting.example)
            )),
        }
    }
    out
}

/// `shardlog config list`: every broker setting, then every topic setting, as aligned columns.
pub fn render() -> String {
    use crate::topics::configs::TOPIC_SETTINGS;
    let broker: Vec<[&str; 4]> = SETTINGS.iter().map(|s| [s.key, s.default_text(), s.unit, s.meaning]).collect();
    let topic: Vec<[&str; 4]> =
        TOPIC_SETTINGS.iter().map(|s| [s.key, s.broker_key.unwrap_or(s.fixed_default), s.unit, s.meaning]).collect();
    let mut out =
        String::from("Broker settings: keys of the --config TOML file and of `shardlog start --set KEY=VALUE`.\n\n");
    columns(&mut out, ["KEY", "DEFAULT", "UNIT", "MEANING"], &broker);
    out.push_str(
        "\nTopic settings: `shardlog topic create NAME ... --config KEY=VALUE`, AlterConfigs, DescribeConfigs.\n\
         A topic without one takes the broker setting named under DEFAULT.\n\n",
    );
    columns(&mut out, ["KEY", "DEFAULT", "UNIT", "MEANING"], &topic);
    out
}

fn columns(out: &mut String, heading: [&str; 4], rows: &[[&str; 4]]) {
    let mut widths = heading.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    for row in std::iter::once(&heading).chain(rows) {
        let line = format!(
            "{:w0$}  {:w1$}  {:w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
}
