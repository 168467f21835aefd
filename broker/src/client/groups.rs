//! Consumer groups for the admin CLI: find a group's coordinator, list, describe and delete groups, read
//! and set committed offsets. Group requests go to the group's coordinator, found with FindCoordinator
//! and found again when it moves (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, ...); versions are
//! negotiated, so any Kafka-compatible broker answers.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::consumer_group_describe_response;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupDescribeRequest, DeleteGroupsRequest, DescribeGroupsRequest, FindCoordinatorRequest, GroupId,
    ListGroupsRequest, OffsetCommitRequest, OffsetFetchRequest, ResponseKind,
};
use kafka_protocol::protocol::{Encodable, StrBytes};

use super::{KafkaClient, RETRY_PAUSE, check, topic_name};

/// The errors that mean "ask the coordinator again, perhaps another one".
const COORDINATOR_MOVING: [ResponseError; 3] =
    [ResponseError::NotCoordinator, ResponseError::CoordinatorNotAvailable, ResponseError::CoordinatorLoadInProgress];

/// Kafka's NON_EMPTY_GROUP: DeleteGroups of a group that still has members.
const NON_EMPTY_GROUP: i16 = 68;

/// A group as `ListGroups` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedGroup {
    pub name: String,
    pub state: String,
    pub protocol_type: String,
}

/// A member as `DescribeGroups` shows it, with its assignment decoded when the group is a consumer group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// (topic, partition) it is assigned.
    pub assigned: Vec<(String, i32)>,
    /// A consumer-protocol (KIP-848) member's epoch.
    pub member_epoch: Option<i32>,
    /// A consumer-protocol member's target assignment (where its assignment is going).
    pub target: Option<Vec<(String, i32)>>,
}

/// A group as `DescribeGroups` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedGroup {
    pub state: String,
    pub protocol_type: String,
    /// The classic protocol's chosen protocol (the client-side assignor), or the consumer protocol's
    /// server-side assignor.
    pub protocol: String,
    pub members: Vec<GroupMember>,
    /// A consumer-protocol group's (group epoch, target assignment epoch).
    pub epochs: Option<(i32, i32)>,
}

fn gid(group: &str) -> GroupId {
    GroupId(StrBytes::from_string(group.to_string()))
}

/// FindCoordinator's key type for a group.
const GROUP_KEY: i8 = 0;

/// Whether an answer's error says the coordinator is moving (ask again, perhaps another one).
pub(super) fn moving(code: i16) -> bool {
    COORDINATOR_MOVING.iter().any(|e| e.code() == code)
}

impl KafkaClient {
    /// The address of `group`'s coordinator now.
    pub fn coordinator(&mut self, group: &str) -> Result<String> {
        self.find_coordinator(GROUP_KEY, group)
    }

    /// The address of the coordinator for `key` of `key_type` ([`GROUP_KEY`], or 1 for a transactional
    /// id) now, asked again while there is none yet.
    pub fn find_coordinator(&mut self, key_type: i8, key: &str) -> Result<String> {
        let deadline = Instant::now() + self.retry_for;
        let kind = if key_type == GROUP_KEY { "group" } else { "transactional id" };
        loop {
            let version = self.connection(&self.home.clone())?.negotiate(ApiKey::FindCoordinator, (1, 3))?;
            let req = FindCoordinatorRequest::default()
                .with_key(StrBytes::from_string(key.to_string()))
                .with_key_type(key_type);
            let ResponseKind::FindCoordinator(r) = self.call_any(ApiKey::FindCoordinator, version, &req)? else {
                bail!("FindCoordinator: unexpected response");
            };
            if r.error_code == 0 {
                return Ok(format!("{}:{}", r.host.as_str(), r.port));
            }
            if !moving(r.error_code) || Instant::now() >= deadline {
                check(r.error_code, &format!("find the coordinator of {kind} {key}"))?;
            }
            std::thread::sleep(RETRY_PAUSE);
        }
    }

    /// Sends a request to `group`'s coordinator at the highest version both sides speak within `ours`,
    /// built by `body` for that version; asked again (of a coordinator found again) while `error` of the
    /// answer says the coordinator is moving.
    fn call_coordinator<T: Encodable>(
        &mut self,
        group: &str,
        api: ApiKey,
        ours: (i16, i16),
        body: impl Fn(i16) -> T,
        error: impl Fn(&ResponseKind) -> i16,
    ) -> Result<(i16, ResponseKind)> {
        let deadline = Instant::now() + self.retry_for;
        loop {
            let addr = self.coordinator(group)?;
            let outcome = self.connection(&addr).and_then(|conn| {
                let version = conn.negotiate(api, ours)?;
                Ok((version, conn.call(api, version, &body(version))?))
            });
            match outcome {
                Ok((version, answer)) if !moving(error(&answer)) => return Ok((version, answer)),
                Ok((_, answer)) if Instant::now() >= deadline => {
                    check(error(&answer), &format!("{api:?} for group {group}"))?;
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => self.forget(&addr),
                Ok(_) => {}
            }
            std::thread::sleep(RETRY_PAUSE);
        }
    }

    /// Every group of the cluster (ListGroups asks each broker for the groups it coordinates), by name.
    pub fn list_groups(&mut self) -> Result<Vec<ListedGroup>> {
        self.metadata(Some(&[]))?;
        let brokers: Vec<String> = self.brokers.values().cloned().collect();
        let mut out = BTreeMap::new();
        for addr in brokers {
            let deadline = Instant::now() + self.retry_for;
            loop {
                let conn = self.connection(&addr)?;
                let version = conn.negotiate(ApiKey::ListGroups, (0, 4))?;
                let ResponseKind::ListGroups(r) =
                    conn.call(ApiKey::ListGroups, version, &ListGroupsRequest::default())?
                else {
                    bail!("ListGroups: unexpected response");
                };
                if moving(r.error_code) && Instant::now() < deadline {
                    std::thread::sleep(RETRY_PAUSE);
                    continue;
                }
                check(r.error_code, &format!("list the groups of {addr}"))?;
                for g in r.groups {
                    let name = g.group_id.0.as_str().to_string();
                    let state = if g.group_state.is_empty() { "-".to_string() } else { g.group_state.to_string() };
                    out.insert(name.clone(), ListedGroup { name, state, protocol_type: g.protocol_type.to_string() });
                }
                break;
            }
        }
        Ok(out.into_values().collect())
    }

    /// The group's state and members; `None` if there is no such group.
    pub fn describe_group(&mut self, group: &str) -> Result<Option<DescribedGroup>> {
        let (_, answer) = self.call_coordinator(
            group,
            ApiKey::DescribeGroups,
            (1, 5),
            |_| DescribeGroupsRequest::default().with_groups(vec![gid(group)]),
            |r| match r {
                ResponseKind::DescribeGroups(r) => r.groups.first().map_or(0, |g| g.error_code),
                _ => 0,
            },
        )?;
        let ResponseKind::DescribeGroups(r) = answer else { bail!("DescribeGroups: unexpected response") };
        let g = r.groups.into_iter().next().context("DescribeGroups: no group in the answer")?;
        if g.error_code == ResponseError::GroupIdNotFound.code() || g.group_state.as_str() == "Dead" {
            // DescribeGroups describes classic groups only.
            return self.describe_consumer_group(group);
        }
        check(g.error_code, &format!("describe group {group}"))?;
        let consumer = g.protocol_type.as_str() == "consumer";
        let members = g
            .members
            .into_iter()
            .map(|m| GroupMember {
                member_id: m.member_id.to_string(),
                instance_id: m.group_instance_id.map(|i| i.to_string()),
                client_id: m.client_id.to_string(),
                client_host: m.client_host.to_string(),
                assigned: if consumer { consumer_assignment(&m.member_assignment) } else { Vec::new() },
                member_epoch: None,
                target: None,
            })
            .collect();
        Ok(Some(DescribedGroup {
            state: g.group_state.to_string(),
            protocol_type: g.protocol_type.to_string(),
            protocol: g.protocol_data.to_string(),
            members,
            epochs: None,
        }))
    }

    /// A group of the consumer protocol (KIP-848) with ConsumerGroupDescribe; `None` if there is no such
    /// group, or the broker does not serve that API.
    fn describe_consumer_group(&mut self, group: &str) -> Result<Option<DescribedGroup>> {
        let home = self.home.clone();
        if self.connection(&home)?.negotiate(ApiKey::ConsumerGroupDescribe, (0, 0)).is_err() {
            return Ok(None);
        }
        let (_, answer) = self.call_coordinator(
            group,
            ApiKey::ConsumerGroupDescribe,
            (0, 0),
            |_| ConsumerGroupDescribeRequest::default().with_group_ids(vec![gid(group)]),
            |r| match r {
                ResponseKind::ConsumerGroupDescribe(r) => r.groups.first().map_or(0, |g| g.error_code),
                _ => 0,
            },
        )?;
        let ResponseKind::ConsumerGroupDescribe(r) = answer else {
            bail!("ConsumerGroupDescribe: unexpected response")
        };
        let g = r.groups.into_iter().next().context("ConsumerGroupDescribe: no group in the answer")?;
        if g.error_code == ResponseError::GroupIdNotFound.code() {
            return Ok(None);
        }
        check(g.error_code, &format!("describe group {group}"))?;
        let partitions = |a: &consumer_group_describe_response::Assignment| -> Vec<(String, i32)> {
            a.topic_partitions
                .iter()
                .flat_map(|t| t.partitions.iter().map(|p| (t.topic_name.0.to_string(), *p)))
                .collect()
        };
        let members = g
            .members
            .iter()
            .map(|m| GroupMember {
                member_id: m.member_id.to_string(),
                instance_id: m.instance_id.as_ref().map(|i| i.to_string()),
                client_id: m.client_id.to_string(),
                client_host: m.client_host.to_string(),
                assigned: partitions(&m.assignment),
                member_epoch: Some(m.member_epoch),
                target: Some(partitions(&m.target_assignment)),
            })
            .collect();
        Ok(Some(DescribedGroup {
            state: g.group_state.to_string(),
            protocol_type: "consumer".to_string(),
            protocol: g.assignor_name.to_string(),
            members,
            epochs: Some((g.group_epoch, g.assignment_epoch)),
        }))
    }

    /// Every offset the group has committed, by (topic, partition).
    pub fn committed_offsets(&mut self, group: &str) -> Result<BTreeMap<(String, i32), i64>> {
        let (_, answer) = self.call_coordinator(
            group,
            ApiKey::OffsetFetch,
            // v2 is the first with "all topics" (null) and a group-level error.
            (2, 7),
            |_| OffsetFetchRequest::default().with_group_id(gid(group)).with_topics(None),
            |r| match r {
                ResponseKind::OffsetFetch(r) => r.error_code,
                _ => 0,
            },
        )?;
        let ResponseKind::OffsetFetch(r) = answer else { bail!("OffsetFetch: unexpected response") };
        check(r.error_code, &format!("committed offsets of group {group}"))?;
        let mut out = BTreeMap::new();
        for t in r.topics {
            for p in t.partitions {
                check(p.error_code, &format!("committed offset of {}-{}", t.name.0.as_str(), p.partition_index))?;
                if p.committed_offset >= 0 {
                    out.insert((t.name.0.to_string(), p.partition_index), p.committed_offset);
                }
            }
        }
        Ok(out)
    }

    /// Commits offsets for the group from outside it (generation -1, no member id), as a consumer that
    /// assigns partitions itself does; refused while the group has members.
    pub fn commit_offsets(&mut self, group: &str, topic: &str, offsets: &BTreeMap<i32, i64>) -> Result<()> {
        let partitions: Vec<OffsetCommitRequestPartition> = offsets
            .iter()
            .map(|(p, o)| {
                OffsetCommitRequestPartition::default()
                    .with_partition_index(*p)
                    .with_committed_offset(*o)
                    .with_committed_leader_epoch(-1)
            })
            .collect();
        let request = OffsetCommitRequest::default()
            .with_group_id(gid(group))
            .with_generation_id_or_member_epoch(-1)
            .with_retention_time_ms(-1)
            .with_topics(vec![
                OffsetCommitRequestTopic::default().with_name(topic_name(topic)).with_partitions(partitions),
            ]);
        let (_, answer) = self.call_coordinator(
            group,
            ApiKey::OffsetCommit,
            (2, 8),
            |_| request.clone(),
            |r| match r {
                ResponseKind::OffsetCommit(r) => {
                    r.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code).find(|c| moving(*c)).unwrap_or(0)
                }
                _ => 0,
            },
        )?;
        let ResponseKind::OffsetCommit(r) = answer else { bail!("OffsetCommit: unexpected response") };
        for t in r.topics {
            for p in t.partitions {
                check(p.error_code, &format!("commit group {group}'s offset of {topic}-{}", p.partition_index))?;
            }
        }
        Ok(())
    }

    /// Deletes a group without members, with its committed offsets.
    pub fn delete_group(&mut self, group: &str) -> Result<()> {
        let (_, answer) = self.call_coordinator(
            group,
            ApiKey::DeleteGroups,
            (0, 2),
            |_| DeleteGroupsRequest::default().with_groups_names(vec![gid(group)]),
            |r| match r {
                ResponseKind::DeleteGroups(r) => r.results.first().map_or(0, |g| g.error_code),
                _ => 0,
            },
        )?;
        let ResponseKind::DeleteGroups(r) = answer else { bail!("DeleteGroups: unexpected response") };
        let result = r.results.first().context("DeleteGroups: no group in the answer")?;
        if result.error_code == NON_EMPTY_GROUP {
            bail!(
                "delete group {group}: it has members (NonEmptyGroup, error code {NON_EMPTY_GROUP}): stop its \
                 consumers first (`shardlog group describe {group}` lists them); a group is deleted only once empty"
            );
        }
        check(result.error_code, &format!("delete group {group}"))
    }
}

/// The (topic, partition) list of a `consumer` protocol assignment (empty if it does not decode).
fn consumer_assignment(bytes: &[u8]) -> Vec<(String, i32)> {
    use kafka_protocol::messages::ConsumerProtocolAssignment;
    use kafka_protocol::protocol::Decodable;
    if bytes.len() < 2 {
        return Vec::new();
    }
    let version = i16::from_be_bytes([bytes[0], bytes[1]]);
    let mut body = bytes::Bytes::copy_from_slice(&bytes[2..]);
    // Fields are only ever added: a newer version than 3 reads as 3.
    match ConsumerProtocolAssignment::decode(&mut body, version.clamp(0, 3)) {
        Ok(a) => a
            .assigned_partitions
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| (t.topic.0.to_string(), *p)))
            .collect(),
        Err(_) => Vec::new(),
    }
}
