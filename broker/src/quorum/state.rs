//! The cluster metadata the quorum replicates, and the commands that change it.
//!
//! [`ClusterState::apply`] is the whole state machine: deterministic, without I/O and without a clock.
//! Times arrive inside commands (the controller that proposes a command stamps it), so every voter that
//! applies the same log reaches the same state. A refused command changes nothing and says why with an
//! error that maps to a Kafka error code.
//!
//! Rules (the seeds' Kafka model, with KRaft's fencing):
//! - A broker registers with a new incarnation each time its process starts and then heartbeats. A broker
//!   whose heartbeats stop is fenced by the controller (`FenceBroker`); a controlled shutdown fences it at
//!   once. A fenced broker leads nothing and leaves every ISR it was in, unless it was the last member:
//!   the last member stays, so the partition can come back with all its committed records when it does.
//! - Leaders come from [`election::choose_leader`]. Every change of leader bumps the leader epoch; every
//!   change of leader or ISR bumps the partition epoch.
//! - `AlterPartition` (an ISR change from the current leader) is accepted only with the current leader
//!   epoch and partition epoch: a deposed leader or a stale proposal is fenced.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use shardlog_storage::LeaderEpoch;
use uuid::Uuid;

pub use super::command_error::CommandError;
use super::election::{self, Choice};
use super::reassignment::complete_reassignment;
pub use super::security::{
    AclFilter, AclRecord, QuotaEntity, QuotaEntry, QuotaOp, ScramCredentialRecord, ScramDeletion, ScramUpsertion,
    SecurityState,
};

/// A broker's (and voter's) id: Kafka's `node.id`.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Debug,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(PartialEq, Eq, PartialOrd, Ord))]
#[serde(transparent)]
pub struct NodeId(pub u32);

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Bumped on every change of a partition's leader or ISR (Kafka's partition epoch); an ISR change must
/// name the current one.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Debug,
    Default,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[serde(transparent)]
pub struct PartitionEpoch(pub i32);

/// The topic setting that lets an out-of-sync replica lead.
pub const UNCLEAN_ELECTION_KEY: &str = "unclean.leader.election.enable";

/// Where clients reach a broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct BrokerEndpoint {
    pub host: String,
    pub port: u16,
}

/// One of a broker's named Kafka listeners, as clients reach it (Kafka's advertised listener).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ListenerEndpoint {
    /// The listener's name (`PLAINTEXT`, `SASL_SSL`, or any name the listener map gives).
    pub name: String,
    pub host: String,
    pub port: u16,
}

/// The name of the one listener a broker registered before it had several.
pub const DEFAULT_LISTENER_NAME: &str = "PLAINTEXT";
/// The most listeners one broker may register.
pub const MAX_LISTENERS: usize = 64;

/// A registered broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct BrokerRecord {
    /// The address peers replicate from (and the client address of brokers registered before listeners).
    pub endpoint: BrokerEndpoint,
    /// The broker's Kafka listeners: Metadata answers a client with those of the listener it connected
    /// to. Registrations without listeners have one, `PLAINTEXT` at `endpoint`.
    #[serde(default)]
    pub listeners: Vec<ListenerEndpoint>,
    /// Chosen by the broker process at start; a heartbeat from another incarnation is stale.
    pub incarnation: u64,
    pub fenced: bool,
    /// The proposer's clock at the last registration or heartbeat.
    pub last_heartbeat_ms: i64,
}

impl BrokerRecord {
    /// The host and port of the listener named `name`.
    pub fn listener(&self, name: &str) -> Option<(&str, u16)> {
        self.listeners.iter().find(|l| l.name == name).map(|l| (l.host.as_str(), l.port))
    }
}

/// One partition's replicas and leadership.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct PartitionRecord {
    /// In preference order: the first is the preferred leader.
    pub replicas: Vec<NodeId>,
    /// In-sync replicas, a subset of `replicas`, never empty.
    pub isr: Vec<NodeId>,
    pub leader: Option<NodeId>,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
    /// The replicas a reassignment in progress adds (members of `replicas`); empty when none is.
    #[serde(default)]
    pub adding_replicas: Vec<NodeId>,
    /// The replicas a reassignment in progress removes once every added one is in sync (members of
    /// `replicas`).
    #[serde(default)]
    pub removing_replicas: Vec<NodeId>,
    /// Replicas whose brokers reported their logs offline (damaged; members of `replicas`): they never
    /// lead and never join the ISR, and one leaves the ISR when reported unless it is the last member,
    /// until its broker reports the log back (rebuilt or repaired). Kafka's offline replicas.
    #[serde(default)]
    pub offline_replicas: Vec<NodeId>,
}

impl PartitionRecord {
    /// A new partition's record: epochs at 0, no reassignment.
    pub fn new(replicas: Vec<NodeId>, isr: Vec<NodeId>, leader: Option<NodeId>) -> PartitionRecord {
        PartitionRecord {
            replicas,
            isr,
            leader,
            leader_epoch: LeaderEpoch(0),
            partition_epoch: PartitionEpoch(0),
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
            offline_replicas: Vec::new(),
        }
    }

    pub fn reassigning(&self) -> bool {
        !self.adding_replicas.is_empty() || !self.removing_replicas.is_empty()
    }

    /// The replicas before the reassignment in progress (all of them when none is).
    pub fn original_replicas(&self) -> Vec<NodeId> {
        self.replicas.iter().copied().filter(|id| !self.adding_replicas.contains(id)).collect()
    }

    /// The replicas the reassignment in progress leads to (all of them when none is), in preference order.
    pub fn target_replicas(&self) -> Vec<NodeId> {
        self.replicas.iter().copied().filter(|id| !self.removing_replicas.contains(id)).collect()
    }
}

/// A topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct TopicRecord {
    pub id: Uuid,
    /// Settings set explicitly, with Kafka's names (validated by the broker before it proposes them).
    pub configs: BTreeMap<String, String>,
    pub partitions: Vec<PartitionRecord>,
}

impl TopicRecord {
    pub(super) fn unclean_election(&self) -> bool {
        self.configs.get(UNCLEAN_ELECTION_KEY).is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }
}

/// A change to the cluster metadata. Each is applied atomically, in log order, on every voter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum Command {
    /// A broker process started. Refused while another incarnation of the same id is unfenced and its
    /// session (`session_timeout_ms`, the controller's setting) has not expired, unless that incarnation
    /// is `previous_incarnation`: the one this broker recorded in its data dir when it last started, so
    /// a process restarted on the same data (after kill -9) need not wait out its own old session.
    RegisterBroker {
        id: NodeId,
        endpoint: BrokerEndpoint,
        incarnation: u64,
        previous_incarnation: Option<u64>,
        now_ms: i64,
        session_timeout_ms: i64,
    },
    /// A registered broker is alive; unfences it if it was fenced.
    BrokerHeartbeat {
        id: NodeId,
        incarnation: u64,
        now_ms: i64,
    },
    /// The controller saw no heartbeat from this incarnation within the session timeout since
    /// `last_heartbeat_ms`. Refused if a heartbeat was applied since (the controller looked at an old state).
    FenceBroker {
        id: NodeId,
        incarnation: u64,
        last_heartbeat_ms: i64,
    },
    /// The broker is stopping: move leadership away and fence it now.
    ControlledShutdown {
        id: NodeId,
        incarnation: u64,
    },
    /// `assignment`: each partition's replicas, in preference order (a topic imported from a broker's
    /// own record); `None`: placed over the live brokers by [`election::assign_replicas`].
    CreateTopic {
        name: String,
        id: Uuid,
        partitions: u32,
        replication_factor: u16,
        configs: BTreeMap<String, String>,
        assignment: Option<Vec<Vec<NodeId>>>,
    },
    DeleteTopic {
        name: String,
    },
    /// Grows a topic to `count` partitions.
    CreatePartitions {
        name: String,
        count: u32,
    },
    /// Replaces a topic's explicit settings.
    AlterConfigs {
        name: String,
        configs: BTreeMap<String, String>,
    },
    /// A leader proposes a new ISR for its partition.
    AlterPartition {
        topic: String,
        partition: u32,
        leader: NodeId,
        leader_epoch: LeaderEpoch,
        partition_epoch: PartitionEpoch,
        isr: Vec<NodeId>,
    },
    /// Moves leadership back to the preferred (first) replica.
    ElectPreferredLeader {
        topic: String,
        partition: u32,
    },
    // New variants go last: entries and frames are rkyv archives, whose enum tags are positions.
    /// Sets some of a topic's settings and returns others to their defaults, leaving the rest as they
    /// are when applied (Kafka's IncrementalAlterConfigs: concurrent edits of different keys all stay).
    EditConfigs {
        name: String,
        set: BTreeMap<String, String>,
        delete: Vec<String>,
    },
    /// A broker takes the next `count` producer ids for InitProducerId (Kafka's AllocateProducerIds): the
    /// block is reported by [`Event::ProducerIdsAllocated`], and no other broker ever gets those ids.
    AllocateProducerIds {
        broker: NodeId,
        count: u32,
    },
    /// Grows a topic to `count` partitions whose replicas are `assignment` (one list per new partition, in
    /// preference order; Kafka's CreatePartitions with an assignment).
    CreatePartitionsAssigned {
        name: String,
        count: u32,
        assignment: Vec<Vec<NodeId>>,
    },
    /// Kafka's unclean ElectLeaders: a partition without a leader gets the first live ISR member, or
    /// failing that the first live replica (records committed while it was out of sync may be lost).
    ElectUncleanLeader {
        topic: String,
        partition: u32,
    },
    /// Kafka's AlterPartitionReassignments for one partition. `Some(target)`: move the partition to these
    /// replicas (in preference order). The record's replicas become the target followed by the current
    /// replicas that are leaving; the new ones catch up and join the ISR through the leader's
    /// `AlterPartition`, and once every target replica is in sync the leaving ones are dropped (and
    /// leadership moves into the target if it was outside). A new target replaces one in progress.
    /// `None`: cancel the reassignment in progress, back to the replicas the partition had before it.
    AlterReassignment {
        topic: String,
        partition: u32,
        target: Option<Vec<NodeId>>,
    },
    /// A broker reports its replica of a partition offline (`offline`: its log is damaged) or back
    /// (rebuilt or repaired). Offline, the replica leaves the ISR and its leadership moves to an eligible
    /// replica at a new epoch; as the ISR's last member it stays, and leads read-only if nobody else may
    /// (see [`election::Choice::ReadOnly`]). Back, it may lead or join the ISR again as the rules allow.
    /// Reporting what the state already says changes nothing.
    SetReplicaOffline {
        id: NodeId,
        incarnation: u64,
        topic: String,
        partition: u32,
        offline: bool,
    },
    /// [`Command::RegisterBroker`] with the broker's named Kafka listeners (non-empty, names distinct);
    /// the same rules.
    RegisterBrokerListeners {
        id: NodeId,
        endpoint: BrokerEndpoint,
        listeners: Vec<ListenerEndpoint>,
        incarnation: u64,
        previous_incarnation: Option<u64>,
        now_ms: i64,
        session_timeout_ms: i64,
    },
    /// KIP-554's AlterUserScramCredentials: adds or replaces credentials and removes others, all or none
    /// (see [`security`](super::security) for the rules).
    AlterScramCredentials {
        upsertions: Vec<ScramUpsertion>,
        deletions: Vec<ScramDeletion>,
    },
    /// Adds ACL bindings (those present already stay as they are), all or none.
    CreateAcls {
        acls: Vec<AclRecord>,
    },
    /// Removes the bindings each filter matches: reported by [`Event::AclsDeleted`].
    DeleteAcls {
        filters: Vec<AclFilter>,
    },
    /// KIP-546's AlterClientQuotas: sets and removes quota keys of entities, all or none.
    AlterClientQuotas {
        entries: Vec<QuotaEntry>,
    },
}

/// Something worth a log line that a command caused (the state machine logs nothing itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum Event {
    /// A partition got a leader that was not in its ISR: committed records may be lost.
    UncleanElection { topic: String, partition: u32, leader: NodeId },
    /// A partition has no leader (no ISR member is live).
    Offline { topic: String, partition: u32 },
    /// The answer to [`Command::AllocateProducerIds`]: ids `first .. first + count` are the proposer's.
    ProducerIdsAllocated { broker: NodeId, first: i64, count: u32 },
    /// Every replica of a reassignment's target is in sync: the partition now has exactly those.
    ReassignmentCompleted { topic: String, partition: u32, replicas: Vec<NodeId> },
    /// The answer to [`Command::DeleteAcls`]: the bindings each filter removed, in filter order.
    AclsDeleted { removed: Vec<Vec<AclRecord>> },
}

/// Cluster metadata: brokers, topics and the security metadata.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct ClusterState {
    pub brokers: BTreeMap<NodeId, BrokerRecord>,
    pub topics: BTreeMap<String, TopicRecord>,
    /// The first producer id not yet given to a broker.
    pub next_producer_id: i64,
    /// SCRAM credentials, ACLs and client quotas.
    #[serde(default)]
    pub security: SecurityState,
}

impl ClusterState {
    /// Applies one command. On error the state is unchanged. The events tell what the command left: a
    /// partition that lost its leader and got one again within it (a broker's new process taking over
    /// its registration) is not reported offline.
    pub fn apply(&mut self, command: &Command) -> Result<Vec<Event>, CommandError> {
        let mut events = self.apply_inner(command)?;
        events.retain(|event| match event {
            Event::Offline { topic, partition } => self
                .topics
                .get(topic)
                .and_then(|t| t.partitions.get(*partition as usize))
                .is_none_or(|p| p.leader.is_none()),
            Event::UncleanElection { .. }
            | Event::ProducerIdsAllocated { .. }
            | Event::ReassignmentCompleted { .. }
            | Event::AclsDeleted { .. } => true,
        });
        Ok(events)
    }

    fn apply_inner(&mut self, command: &Command) -> Result<Vec<Event>, CommandError> {
        let mut events = Vec::new();
        match command {
            Command::RegisterBroker { id, endpoint, incarnation, previous_incarnation, now_ms, session_timeout_ms } => {
                let listeners = vec![ListenerEndpoint {
                    name: DEFAULT_LISTENER_NAME.to_string(),
                    host: endpoint.host.clone(),
                    port: endpoint.port,
                }];
                let registration = Registration {
                    id: *id,
                    endpoint,
                    listeners,
                    incarnation: *incarnation,
                    previous_incarnation: *previous_incarnation,
                    now_ms: *now_ms,
                    session_timeout_ms: *session_timeout_ms,
                };
                self.register(registration, &mut events)?;
            }
            Command::RegisterBrokerListeners {
                id,
                endpoint,
                listeners,
                incarnation,
                previous_incarnation,
                now_ms,
                session_timeout_ms,
            } => {
                check_listeners(listeners)?;
                let registration = Registration {
                    id: *id,
                    endpoint,
                    listeners: listeners.clone(),
                    incarnation: *incarnation,
                    previous_incarnation: *previous_incarnation,
                    now_ms: *now_ms,
                    session_timeout_ms: *session_timeout_ms,
                };
                self.register(registration, &mut events)?;
            }
            Command::BrokerHeartbeat { id, incarnation, now_ms } => {
                let broker = self.registered(*id, *incarnation)?;
                broker.last_heartbeat_ms = *now_ms;
                if broker.fenced {
                    broker.fenced = false;
                    self.elect_leaderless(&mut events);
                }
            }
            Command::FenceBroker { id, incarnation, last_heartbeat_ms } => {
                let broker = self.registered(*id, *incarnation)?;
                if broker.last_heartbeat_ms != *last_heartbeat_ms {
                    return Err(CommandError::SessionRenewed(*id));
                }
                self.fence(*id, &mut events);
            }
            Command::ControlledShutdown { id, incarnation } => {
                self.registered(*id, *incarnation)?;
                self.fence(*id, &mut events);
            }
            Command::CreateTopic { name, id, partitions, replication_factor, configs, assignment } => {
                if self.topics.contains_key(name) {
                    return Err(CommandError::TopicAlreadyExists(name.clone()));
                }
                check_partition_count(*partitions)?;
                let records = match assignment {
                    None => self.new_partitions(*partitions, *replication_factor)?,
                    Some(lists) => self.assigned_partitions(*partitions, *replication_factor, lists)?,
                };
                let topic = TopicRecord { id: *id, configs: configs.clone(), partitions: records };
                self.topics.insert(name.clone(), topic);
            }
            Command::DeleteTopic { name } => {
                self.topics.remove(name).ok_or_else(|| CommandError::UnknownTopic(name.clone()))?;
            }
            Command::CreatePartitions { name, count } => {
                let topic = self.topics.get(name).ok_or_else(|| CommandError::UnknownTopic(name.clone()))?;
                let current = topic.partitions.len() as u32;
                check_partition_count(*count)?;
                if *count <= current {
                    return Err(CommandError::InvalidPartitions(format!(
                        "topic {name:?} has {current} partitions; the count can only grow"
                    )));
                }
                // Every topic has a partition (commands never make one without); a state from a faulty
                // peer that breaks that refuses the command rather than stop the voter.
                let factor = topic.partitions.first().map_or(0, |p| p.target_replicas().len() as u16);
                let records = self.new_partitions(count - current, factor)?;
                self.topics.get_mut(name).expect("checked above").partitions.extend(records);
            }
            Command::CreatePartitionsAssigned { name, count, assignment } => {
                let topic = self.topics.get(name).ok_or_else(|| CommandError::UnknownTopic(name.clone()))?;
                let current = topic.partitions.len() as u32;
                check_partition_count(*count)?;
                if *count <= current {
                    return Err(CommandError::InvalidPartitions(format!(
                        "topic {name:?} has {current} partitions; the count can only grow"
                    )));
                }
                let factor = topic.partitions.first().map_or(0, |p| p.target_replicas().len() as u16);
                let records = self.assigned_partitions(count - current, factor, assignment)?;
                self.topics.get_mut(name).expect("checked above").partitions.extend(records);
            }
            Command::AlterConfigs { name, configs } => {
                let topic = self.topics.get_mut(name).ok_or_else(|| CommandError::UnknownTopic(name.clone()))?;
                topic.configs = configs.clone();
                // Turning unclean election on may bring offline partitions back.
                self.elect_leaderless(&mut events);
            }
            Command::EditConfigs { name, set, delete } => {
                let topic = self.topics.get_mut(name).ok_or_else(|| CommandError::UnknownTopic(name.clone()))?;
                for key in delete {
                    topic.configs.remove(key);
                }
                topic.configs.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
                self.elect_leaderless(&mut events);
            }
            Command::AlterPartition { topic, partition, leader, leader_epoch, partition_epoch, isr } => {
                let live = self.live();
                let p = self.partition_mut(topic, *partition)?;
                if *leader_epoch != p.leader_epoch || p.leader != Some(*leader) {
                    return Err(CommandError::FencedLeaderEpoch { given: *leader_epoch, current: p.leader_epoch });
                }
                if *partition_epoch != p.partition_epoch {
                    return Err(CommandError::InvalidUpdateVersion {
                        given: *partition_epoch,
                        current: p.partition_epoch,
                    });
                }
                let invalid =
                    |reason: &str| Err(CommandError::InvalidIsr { isr: isr.clone(), reason: reason.to_string() });
                if !isr.contains(leader) {
                    return invalid("the leader must stay in its ISR");
                }
                if isr.iter().any(|id| !p.replicas.contains(id)) {
                    return invalid("every ISR member must be a replica");
                }
                if isr.iter().collect::<BTreeSet<_>>().len() != isr.len() {
                    return invalid("a replica appears twice");
                }
                let joining_fenced = isr.iter().any(|id| !p.isr.contains(id) && !live.contains(id));
                if joining_fenced {
                    return invalid("a fenced broker cannot join the ISR");
                }
                if isr.iter().any(|id| !p.isr.contains(id) && p.offline_replicas.contains(id)) {
                    return invalid("an offline replica cannot join the ISR");
                }
                if p.offline_replicas.contains(leader) {
                    // It leads read-only, below its damage: a follower it counted in sync may lack the
                    // records above it, and would then be elected cleanly without them.
                    return invalid("a leader whose log is offline cannot change its ISR");
                }
                p.isr = isr.clone();
                p.partition_epoch.0 += 1;
                complete_reassignment(topic, *partition, p, &live, &mut events);
            }
            Command::AllocateProducerIds { broker, count } => {
                let first = self.next_producer_id;
                let next = first.checked_add(i64::from(*count)).filter(|_| *count > 0);
                let Some(next) = next else { return Err(CommandError::ProducerIdsExhausted(*count)) };
                self.next_producer_id = next;
                events.push(Event::ProducerIdsAllocated { broker: *broker, first, count: *count });
            }
            Command::ElectPreferredLeader { topic, partition } => {
                let live = self.live();
                let p = self.partition_mut(topic, *partition)?;
                let Some(&preferred) = p.replicas.first() else {
                    return Err(CommandError::PreferredLeaderNotAvailable);
                };
                if p.leader == Some(preferred) {
                    return Err(CommandError::ElectionNotNeeded);
                }
                if !live.contains(&preferred) || !p.isr.contains(&preferred) || p.offline_replicas.contains(&preferred)
                {
                    return Err(CommandError::PreferredLeaderNotAvailable);
                }
                set_leader(p, Some(preferred));
            }
            Command::ElectUncleanLeader { topic, partition } => {
                let live = self.live();
                let p = self.partition_mut(topic, *partition)?;
                // A leader whose log is offline serves only reads: an unclean election may replace it.
                let read_only = p.leader.is_some_and(|l| p.offline_replicas.contains(&l));
                if p.leader.is_some() && !read_only {
                    return Err(CommandError::ElectionNotNeeded);
                }
                match election::choose_leader(p, |id| live.contains(&id), true, None) {
                    Choice::Clean(leader) => set_leader(p, Some(leader)),
                    Choice::Unclean(leader) => {
                        p.isr = vec![leader];
                        set_leader(p, Some(leader));
                        events.push(Event::UncleanElection { topic: topic.clone(), partition: *partition, leader });
                    }
                    Choice::ReadOnly(leader) if p.leader != Some(leader) => set_leader(p, Some(leader)),
                    Choice::ReadOnly(_) | Choice::None => return Err(CommandError::EligibleLeadersNotAvailable),
                }
                let live = self.live();
                let p = self.partition_mut(topic, *partition)?;
                complete_reassignment(topic, *partition, p, &live, &mut events);
            }
            Command::AlterReassignment { topic, partition, target } => {
                self.alter_reassignment(topic, *partition, target.as_deref(), &mut events)?;
            }
            Command::SetReplicaOffline { id, incarnation, topic, partition, offline } => {
                self.registered(*id, *incarnation)?;
                self.set_replica_offline(*id, topic, *partition, *offline, &mut events)?;
            }
            Command::AlterScramCredentials { upsertions, deletions } => {
                self.security.alter_scram(upsertions, deletions)?;
            }
            Command::CreateAcls { acls } => self.security.create_acls(acls)?,
            Command::DeleteAcls { filters } => {
                let removed = self.security.delete_acls(filters)?;
                events.push(Event::AclsDeleted { removed });
            }
            Command::AlterClientQuotas { entries } => self.security.alter_quotas(entries)?,
        }
        Ok(events)
    }

    /// Registers a broker process (the rules of [`Command::RegisterBroker`]).
    fn register(&mut self, r: Registration<'_>, events: &mut Vec<Event>) -> Result<(), CommandError> {
        if let Some(existing) = self.brokers.get(&r.id) {
            let session_alive = r.now_ms.saturating_sub(existing.last_heartbeat_ms) < r.session_timeout_ms;
            let own_predecessor = r.previous_incarnation == Some(existing.incarnation);
            if existing.incarnation != r.incarnation && !existing.fenced && session_alive && !own_predecessor {
                return Err(CommandError::DuplicateBrokerRegistration(r.id));
            }
            if existing.incarnation != r.incarnation && !existing.fenced {
                // The old process died without a shutdown: its leaderships move before the new
                // incarnation, whose log may be behind, takes any.
                self.fence(r.id, events);
            }
        }
        let record = BrokerRecord {
            endpoint: r.endpoint.clone(),
            listeners: r.listeners,
            incarnation: r.incarnation,
            fenced: false,
            last_heartbeat_ms: r.now_ms,
        };
        self.brokers.insert(r.id, record);
        self.elect_leaderless(events);
        Ok(())
    }

    /// Kafka's auto leader rebalance: for every live broker that does not lead more than
    /// `imbalance_percent`% of the partitions whose preferred (first) replica it is, `ElectPreferredLeader`
    /// for those of them where it is in sync.
    pub fn preferred_elections(&self, imbalance_percent: u32) -> Vec<Command> {
        #[derive(Default)]
        struct Preferred {
            total: usize,
            missed: usize,
            movable: Vec<Command>,
        }
        let live = self.live();
        let mut preferred: BTreeMap<NodeId, Preferred> = BTreeMap::new();
        for (name, topic) in &self.topics {
            for (index, p) in topic.partitions.iter().enumerate() {
                let Some(&first) = p.replicas.first() else { continue };
                let entry = preferred.entry(first).or_default();
                entry.total += 1;
                if p.leader != Some(first) {
                    entry.missed += 1;
                    if p.isr.contains(&first) && !p.offline_replicas.contains(&first) {
                        entry
                            .movable
                            .push(Command::ElectPreferredLeader { topic: name.clone(), partition: index as u32 });
                    }
                }
            }
        }
        preferred
            .into_iter()
            .filter(|(id, p)| live.contains(id) && p.missed * 100 > p.total * imbalance_percent as usize)
            .flat_map(|(_, p)| p.movable)
            .collect()
    }

    /// Unfenced brokers.
    pub fn live(&self) -> BTreeSet<NodeId> {
        self.brokers.iter().filter(|(_, b)| !b.fenced).map(|(id, _)| *id).collect()
    }

    /// `FenceBroker` commands for the brokers whose session expired at `now_ms`.
    pub fn expired_sessions(&self, now_ms: i64, session_timeout_ms: i64) -> Vec<Command> {
        self.brokers
            .iter()
            .filter(|(_, b)| !b.fenced && now_ms.saturating_sub(b.last_heartbeat_ms) >= session_timeout_ms)
            .map(|(id, b)| Command::FenceBroker {
                id: *id,
                incarnation: b.incarnation,
                last_heartbeat_ms: b.last_heartbeat_ms,
            })
            .collect()
    }

    fn registered(&mut self, id: NodeId, incarnation: u64) -> Result<&mut BrokerRecord, CommandError> {
        let broker = self.brokers.get_mut(&id).ok_or(CommandError::BrokerNotRegistered(id))?;
        if broker.incarnation != incarnation {
            return Err(CommandError::StaleBrokerEpoch { id, incarnation });
        }
        Ok(broker)
    }

    pub(super) fn partition_mut(&mut self, topic: &str, partition: u32) -> Result<&mut PartitionRecord, CommandError> {
        let unknown = || CommandError::UnknownPartition { topic: topic.to_string(), partition };
        let t = self.topics.get_mut(topic).ok_or_else(|| CommandError::UnknownTopic(topic.to_string()))?;
        t.partitions.get_mut(partition as usize).ok_or_else(unknown)
    }

    /// Records for `count` new partitions over the live brokers, continuing the round robin from the
    /// number of partitions already in the cluster so leaders stay balanced across topics.
    fn new_partitions(&self, count: u32, replication_factor: u16) -> Result<Vec<PartitionRecord>, CommandError> {
        let live: Vec<NodeId> = self.live().into_iter().collect();
        if replication_factor == 0 || replication_factor as usize > live.len() {
            return Err(CommandError::InvalidReplicationFactor { wanted: replication_factor, available: live.len() });
        }
        let existing: usize = self.topics.values().map(|t| t.partitions.len()).sum();
        let assigned = election::assign_replicas(&live, count, replication_factor as usize, existing);
        Ok(assigned
            .into_iter()
            .map(|replicas| PartitionRecord::new(replicas.clone(), replicas.clone(), Some(replicas[0])))
            .collect())
    }

    /// Records for partitions whose replicas are given: one non-empty list of distinct registered brokers
    /// per partition, each `replication_factor` long. The first live replica leads.
    fn assigned_partitions(
        &self,
        count: u32,
        replication_factor: u16,
        lists: &[Vec<NodeId>],
    ) -> Result<Vec<PartitionRecord>, CommandError> {
        let invalid = |reason: String| Err(CommandError::InvalidReplicaAssignment(reason));
        if lists.len() != count as usize {
            return invalid(format!("{} replica lists for {count} partitions", lists.len()));
        }
        let live = self.live();
        let mut records = Vec::with_capacity(lists.len());
        for replicas in lists {
            if replicas.len() != replication_factor as usize {
                return invalid(format!("{} replicas, {replication_factor} expected", replicas.len()));
            }
            self.check_replica_list(replicas)?;
            // In sync: the live replicas (all empty logs); with none live, the first one alone, which the
            // partition then waits for, as for a partition whose last ISR member was fenced.
            let mut isr: Vec<NodeId> = replicas.iter().copied().filter(|id| live.contains(id)).collect();
            if isr.is_empty() {
                isr.push(replicas[0]);
            }
            let leader = live.contains(&isr[0]).then_some(isr[0]);
            records.push(PartitionRecord::new(replicas.clone(), isr, leader));
        }
        Ok(records)
    }

    /// A partition's replica list must be non-empty, without duplicates, of registered brokers.
    pub(super) fn check_replica_list(&self, replicas: &[NodeId]) -> Result<(), CommandError> {
        let invalid = |reason: String| Err(CommandError::InvalidReplicaAssignment(reason));
        if replicas.is_empty() {
            return invalid("a partition needs at least one replica".to_string());
        }
        if replicas.iter().collect::<BTreeSet<_>>().len() != replicas.len() {
            return invalid("a broker appears twice in a partition's replicas".to_string());
        }
        if let Some(unknown) = replicas.iter().find(|id| !self.brokers.contains_key(id)) {
            return invalid(format!("broker {unknown} is not registered"));
        }
        Ok(())
    }

    /// Fences a broker: it leaves every ISR it is in (unless it is the last member) and its leaderships
    /// go to the next eligible replica.
    fn fence(&mut self, id: NodeId, events: &mut Vec<Event>) {
        if let Some(broker) = self.brokers.get_mut(&id) {
            broker.fenced = true;
        }
        let live = self.live();
        for (name, topic) in &mut self.topics {
            let unclean = topic.unclean_election();
            for (index, p) in topic.partitions.iter_mut().enumerate() {
                if !p.replicas.contains(&id) {
                    continue;
                }
                if p.leader == Some(id) {
                    elect(name, index as u32, p, &live, unclean, events);
                } else if p.isr.contains(&id) && p.isr.len() > 1 {
                    p.isr.retain(|r| *r != id);
                    p.partition_epoch.0 += 1;
                }
            }
        }
    }

    /// Gives a leader to every partition without one where the rules allow it, and completes the
    /// reassignments that waited for a live target replica to lead.
    fn elect_leaderless(&mut self, events: &mut Vec<Event>) {
        let live = self.live();
        for (name, topic) in &mut self.topics {
            let unclean = topic.unclean_election();
            for (index, p) in topic.partitions.iter_mut().enumerate() {
                if p.leader.is_none()
                    && !matches!(election::choose_leader(p, |id| live.contains(&id), unclean, None), Choice::None)
                {
                    elect(name, index as u32, p, &live, unclean, events);
                }
            }
        }
        self.complete_reassignments(events);
    }
}

/// What a registration carries, from either registration command.
struct Registration<'a> {
    id: NodeId,
    endpoint: &'a BrokerEndpoint,
    listeners: Vec<ListenerEndpoint>,
    incarnation: u64,
    previous_incarnation: Option<u64>,
    now_ms: i64,
    session_timeout_ms: i64,
}

/// A registration's listeners: at least one, at most [`MAX_LISTENERS`], each named, names distinct.
fn check_listeners(listeners: &[ListenerEndpoint]) -> Result<(), CommandError> {
    let invalid = |reason: &str| Err(CommandError::InvalidListeners(reason.to_string()));
    if listeners.is_empty() || listeners.len() > MAX_LISTENERS {
        return invalid(&format!("a broker registers 1 to {MAX_LISTENERS} listeners"));
    }
    if listeners.iter().any(|l| l.name.is_empty() || l.host.is_empty()) {
        return invalid("a listener needs a name and a host");
    }
    if listeners.iter().map(|l| &l.name).collect::<BTreeSet<_>>().len() != listeners.len() {
        return invalid("two listeners have one name");
    }
    Ok(())
}

/// The most partitions one topic may have (the brokers refuse more before proposing; this bounds what a
/// peer can make every voter and broker allocate).
pub const MAX_PARTITIONS_PER_TOPIC: u32 = crate::topics::MAX_PARTITIONS;

fn check_partition_count(count: u32) -> Result<(), CommandError> {
    if count == 0 || count > MAX_PARTITIONS_PER_TOPIC {
        return Err(CommandError::InvalidPartitions(format!("{count}: must be in [1, {MAX_PARTITIONS_PER_TOPIC}]")));
    }
    Ok(())
}

/// Elects a new leader for `p` among the live brokers (the current leader is going away or absent).
pub(super) fn elect(
    topic: &str,
    index: u32,
    p: &mut PartitionRecord,
    live: &BTreeSet<NodeId>,
    unclean: bool,
    events: &mut Vec<Event>,
) {
    let outgoing = p.leader;
    match election::choose_leader(p, |id| live.contains(&id), unclean, outgoing) {
        Choice::Clean(leader) => {
            if let Some(old) = outgoing
                && p.isr.len() > 1
            {
                p.isr.retain(|r| *r != old);
            }
            set_leader(p, Some(leader));
        }
        Choice::Unclean(leader) => {
            // Only the new leader's log counts now: the ISR restarts from it.
            p.isr = vec![leader];
            set_leader(p, Some(leader));
            events.push(Event::UncleanElection { topic: topic.to_string(), partition: index, leader });
        }
        Choice::ReadOnly(leader) => {
            if outgoing != Some(leader) {
                set_leader(p, Some(leader));
            }
        }
        Choice::None => {
            if outgoing.is_some() {
                // The ISR keeps its last members: one of them must come back for the partition to.
                set_leader(p, None);
                events.push(Event::Offline { topic: topic.to_string(), partition: index });
            }
        }
    }
}

pub(super) fn set_leader(p: &mut PartitionRecord, leader: Option<NodeId>) {
    p.leader = leader;
    p.leader_epoch.0 += 1;
    p.partition_epoch.0 += 1;
}
