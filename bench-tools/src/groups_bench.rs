//! `shardlog-bench groups`: the group coordinator's own figures, over the Kafka protocol (so any
//! Kafka-compatible broker can be measured), with members written here as a Kafka consumer's group code
//! behaves: JoinGroup (again after MEMBER_ID_REQUIRED), SyncGroup with the leader's range assignment in
//! the `consumer` protocol's format, Heartbeat every `--heartbeat-ms`, and on REBALANCE_IN_PROGRESS a
//! rejoin.
//!
//! 1. Offset commits: `--members` members of one group on a `--partitions` topic each commit their
//!    partitions' offsets, one OffsetCommit after another on their own connection, for `--duration`;
//!    commits/s (requests and offsets) and commit latency.
//! 2. Rebalance: `--rebalance-members` - 1 members are stable; one more joins. The time until every
//!    member has its new assignment (SyncGroup answered in the new generation), and how long each member
//!    that was already there stopped consuming (from the heartbeat answer that told it of the rebalance
//!    to its new assignment). Then the new member leaves, the group settles again, and the next round
//!    begins; `--rounds` rounds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::{BufMut, Bytes, BytesMut};
use hdrhistogram::Histogram;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedTopic;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ApiKey, ConsumerProtocolAssignment, ConsumerProtocolSubscription, GroupId, HeartbeatRequest, JoinGroupRequest,
    LeaveGroupRequest, OffsetCommitRequest, ResponseKind, SyncGroupRequest, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use shardlog_broker::client::{Connection, KafkaClient};

use shardlog_bench::cluster::{Cluster, ClusterArgs};

/// Options of `shardlog-bench groups`.
#[derive(Debug, Clone, clap::Args)]
pub struct GroupsArgs {
    /// Brokers to measure, HOST:PORT[,...]; without it a local single broker is started.
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// Partitions of the topic the groups consume.
    #[arg(long, default_value_t = 100)]
    pub partitions: i32,
    /// Members committing offsets at once.
    #[arg(long, default_value_t = 8)]
    pub members: usize,
    /// How long the commit measurement runs.
    #[arg(long, default_value = "5s", value_parser = crate::stats::duration)]
    pub duration: Duration,
    /// Members of the group once the joining member is in.
    #[arg(long, default_value_t = 10)]
    pub rebalance_members: usize,
    /// Join-and-leave rounds of the rebalance measurement.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// How often members heartbeat (Kafka clients' heartbeat.interval.ms default).
    #[arg(long, default_value_t = 3000)]
    pub heartbeat_ms: u64,
    /// The local broker's data dir (emptied first).
    #[arg(long, default_value = "bench-groups")]
    pub data_dir: std::path::PathBuf,
}

const SESSION_TIMEOUT_MS: i32 = 30_000;
const REBALANCE_TIMEOUT_MS: i32 = 60_000;

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

/// A `consumer` protocol message: version, then the body.
fn versioned<T: Encodable>(message: &T, version: i16) -> Result<Bytes> {
    let mut out = BytesMut::new();
    out.put_i16(version);
    message.encode(&mut out, version)?;
    Ok(out.freeze())
}

/// One group member on its own connection to the coordinator.
struct Member {
    conn: Connection,
    group: String,
    topic: String,
    partitions: i32,
    id: String,
    generation: i32,
    assigned: Vec<i32>,
}

impl Member {
    fn connect(coordinator: &str, group: &str, topic: &str, partitions: i32) -> Result<Member> {
        Ok(Member {
            conn: Connection::open(coordinator)?,
            group: group.to_string(),
            topic: topic.to_string(),
            partitions,
            id: String::new(),
            generation: -1,
            assigned: Vec::new(),
        })
    }

    /// JoinGroup then SyncGroup until the member has an assignment in a generation.
    fn join(&mut self) -> Result<()> {
        loop {
            let subscription = ConsumerProtocolSubscription::default().with_topics(vec![s(&self.topic)]);
            let request = JoinGroupRequest::default()
                .with_group_id(GroupId(s(&self.group)))
                .with_session_timeout_ms(SESSION_TIMEOUT_MS)
                .with_rebalance_timeout_ms(REBALANCE_TIMEOUT_MS)
                .with_member_id(s(&self.id))
                .with_protocol_type(s("consumer"))
                .with_protocols(vec![
                    JoinGroupRequestProtocol::default()
                        .with_name(s("range"))
                        .with_metadata(versioned(&subscription, 0)?),
                ]);
            let ResponseKind::JoinGroup(joined) = self.conn.call(ApiKey::JoinGroup, 5, &request)? else {
                bail!("JoinGroup: unexpected response");
            };
            match ResponseError::try_from_code(joined.error_code) {
                None => {}
                Some(ResponseError::MemberIdRequired) => {
                    self.id = joined.member_id.to_string();
                    continue;
                }
                Some(ResponseError::CoordinatorLoadInProgress | ResponseError::RebalanceInProgress) => {
                    thread::sleep(Duration::from_millis(20));
                    continue;
                }
                Some(e) => bail!("JoinGroup: {e}"),
            }
            self.id = joined.member_id.to_string();
            self.generation = joined.generation_id;
            let assignments = if joined.leader == joined.member_id {
                let mut ids: Vec<String> = joined.members.iter().map(|m| m.member_id.to_string()).collect();
                ids.sort();
                self.range_assignment(&ids)?
            } else {
                Vec::new()
            };
            let sync = SyncGroupRequest::default()
                .with_group_id(GroupId(s(&self.group)))
                .with_generation_id(self.generation)
                .with_member_id(s(&self.id))
                .with_assignments(assignments);
            let ResponseKind::SyncGroup(synced) = self.conn.call(ApiKey::SyncGroup, 3, &sync)? else {
                bail!("SyncGroup: unexpected response");
            };
            match ResponseError::try_from_code(synced.error_code) {
                None => {
                    self.assigned = decode_assignment(&synced.assignment)?;
                    return Ok(());
                }
                // Another member joined meanwhile: join again.
                Some(ResponseError::RebalanceInProgress | ResponseError::IllegalGeneration) => continue,
                Some(e) => bail!("SyncGroup: {e}"),
            }
        }
    }

    /// The range assignor: partitions split into consecutive runs, the first members getting one more.
    fn range_assignment(&self, ids: &[String]) -> Result<Vec<SyncGroupRequestAssignment>> {
        let (each, extra) = (self.partitions as usize / ids.len(), self.partitions as usize % ids.len());
        let mut next = 0i32;
        let mut out = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            let count = (each + usize::from(i < extra)) as i32;
            let partitions: Vec<i32> = (next..next + count).collect();
            next += count;
            let assignment = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
                AssignedTopic::default().with_topic(TopicName(s(&self.topic))).with_partitions(partitions),
            ]);
            out.push(
                SyncGroupRequestAssignment::default().with_member_id(s(id)).with_assignment(versioned(&assignment, 0)?),
            );
        }
        Ok(out)
    }

    /// One heartbeat: `true` if the group is rebalancing (the member must join again).
    fn heartbeat(&mut self) -> Result<bool> {
        let request = HeartbeatRequest::default()
            .with_group_id(GroupId(s(&self.group)))
            .with_generation_id(self.generation)
            .with_member_id(s(&self.id));
        let ResponseKind::Heartbeat(r) = self.conn.call(ApiKey::Heartbeat, 3, &request)? else {
            bail!("Heartbeat: unexpected response");
        };
        match ResponseError::try_from_code(r.error_code) {
            None => Ok(false),
            Some(ResponseError::RebalanceInProgress | ResponseError::IllegalGeneration) => Ok(true),
            Some(e) => bail!("Heartbeat: {e}"),
        }
    }

    /// Commits `offset` for every assigned partition; returns how many offsets it committed.
    fn commit(&mut self, offset: i64) -> Result<usize> {
        let partitions: Vec<OffsetCommitRequestPartition> = self
            .assigned
            .iter()
            .map(|p| OffsetCommitRequestPartition::default().with_partition_index(*p).with_committed_offset(offset))
            .collect();
        let count = partitions.len();
        let request = OffsetCommitRequest::default()
            .with_group_id(GroupId(s(&self.group)))
            .with_generation_id_or_member_epoch(self.generation)
            .with_member_id(s(&self.id))
            .with_topics(vec![
                OffsetCommitRequestTopic::default().with_name(TopicName(s(&self.topic))).with_partitions(partitions),
            ]);
        let ResponseKind::OffsetCommit(r) = self.conn.call(ApiKey::OffsetCommit, 8, &request)? else {
            bail!("OffsetCommit: unexpected response");
        };
        if let Some(code) = r.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code).find(|c| *c != 0) {
            bail!("OffsetCommit: error code {code}");
        }
        Ok(count)
    }

    fn leave(&mut self) -> Result<()> {
        let request = LeaveGroupRequest::default().with_group_id(GroupId(s(&self.group))).with_member_id(s(&self.id));
        self.conn.call(ApiKey::LeaveGroup, 1, &request)?;
        Ok(())
    }
}

fn decode_assignment(bytes: &[u8]) -> Result<Vec<i32>> {
    if bytes.len() < 2 {
        return Ok(Vec::new());
    }
    let version = i16::from_be_bytes([bytes[0], bytes[1]]);
    let mut body = Bytes::copy_from_slice(&bytes[2..]);
    let assignment = ConsumerProtocolAssignment::decode(&mut body, version)?;
    Ok(assignment.assigned_partitions.iter().flat_map(|t| t.partitions.iter().copied()).collect())
}

/// What one run measured.
#[derive(Debug)]
pub struct GroupsReport {
    pub commit_requests: u64,
    pub committed_offsets: u64,
    pub commit_elapsed: Duration,
    pub commit_latency_us: Histogram<u64>,
    /// Per round: (time until every member had its new assignment, each old member's pause).
    pub rounds: Vec<(Duration, Vec<Duration>)>,
    pub args: GroupsArgs,
}

pub(crate) fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

impl GroupsReport {
    pub fn render(&self) -> String {
        let a = &self.args;
        let secs = self.commit_elapsed.as_secs_f64().max(1e-9);
        let h = &self.commit_latency_us;
        let ms = |us: u64| us as f64 / 1000.0;
        let mut out = format!(
            "offset commits: {} members of one group, {} partitions, {:.1} s\n  {:.0} commits/s ({:.0} offsets/s); latency (ms): p50 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}\n",
            a.members,
            a.partitions,
            secs,
            self.commit_requests as f64 / secs,
            self.committed_offsets as f64 / secs,
            ms(h.value_at_quantile(0.5)),
            ms(h.value_at_quantile(0.99)),
            ms(h.value_at_quantile(0.999)),
            ms(h.max()),
        );
        out.push_str(&format!(
            "rebalance: a member joins a group of {} on {} partitions (heartbeat every {} ms), {} rounds\n",
            a.rebalance_members - 1,
            a.partitions,
            a.heartbeat_ms,
            self.rounds.len()
        ));
        for (i, (settle, pauses)) in self.rounds.iter().enumerate() {
            out.push_str(&format!(
                "  round {}: settled in {} ms; old members paused: median {} ms, max {} ms\n",
                i + 1,
                settle.as_millis(),
                median(pauses.clone()).as_millis(),
                pauses.iter().max().copied().unwrap_or_default().as_millis()
            ));
        }
        let settles: Vec<Duration> = self.rounds.iter().map(|r| r.0).collect();
        let pauses: Vec<Duration> = self.rounds.iter().flat_map(|r| r.1.iter().copied()).collect();
        out.push_str(&format!(
            "  median: settled in {} ms, old members paused {} ms\n",
            median(settles).as_millis(),
            median(pauses).as_millis()
        ));
        out
    }
}

/// The brokers to measure: `bootstrap`, or a local single broker started in `data_dir` (emptied first)
/// with `settings`, which runs until the returned cluster is dropped.
pub(crate) fn local_or(
    bootstrap: &Option<String>,
    data_dir: &std::path::Path,
    settings: Vec<String>,
) -> Result<(String, Option<Cluster>)> {
    if let Some(b) = bootstrap {
        return Ok((b.clone(), None));
    }
    let _ = std::fs::remove_dir_all(data_dir);
    let cluster = Cluster::start(&ClusterArgs {
        brokers: 1,
        base_port: 0,
        quorum_base_port: None,
        metrics_base_port: None,
        data_dir: data_dir.to_path_buf(),
        shards: None,
        shardlog: None,
        settings,
        log_dir: None,
        die_with_parent: true,
        broker_args: Vec::new(),
        client_security: None,
    })?;
    Ok((cluster.bootstrap.clone(), Some(cluster)))
}

pub fn run(args: &GroupsArgs) -> Result<GroupsReport> {
    if args.rebalance_members < 2 || args.members == 0 || args.partitions <= 0 {
        bail!("--members and --partitions must be positive and --rebalance-members at least 2");
    }
    let settings = vec!["group.initial.rebalance.delay.ms=0".into()];
    let (bootstrap, local) = local_or(&args.bootstrap, &args.data_dir, settings)?;
    let run_id = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let topic = format!("bench-groups-{run_id}");
    let mut client = KafkaClient::connect(&bootstrap)?;
    client.create_topic(&topic, args.partitions, 1, &[])?;
    let (requests, offsets, elapsed, latency) = measure_commits(&mut client, args, &topic, run_id)?;
    let rounds = measure_rebalances(&mut client, args, &topic, run_id)?;
    drop(local);
    Ok(GroupsReport {
        commit_requests: requests,
        committed_offsets: offsets,
        commit_elapsed: elapsed,
        commit_latency_us: latency,
        rounds,
        args: args.clone(),
    })
}

/// `members` members join one group, then commit in a loop until `duration` has passed.
fn measure_commits(
    client: &mut KafkaClient,
    args: &GroupsArgs,
    topic: &str,
    run_id: u64,
) -> Result<(u64, u64, Duration, Histogram<u64>)> {
    let group = format!("bench-commits-{run_id}");
    let coordinator = client.coordinator(&group)?;
    let generations = Arc::new(Mutex::new(vec![-1; args.members]));
    let ready = Arc::new(std::sync::Barrier::new(args.members));
    let mut threads = Vec::new();
    for i in 0..args.members {
        let (coordinator, group, topic) = (coordinator.clone(), group.clone(), topic.to_string());
        let (generations, ready) = (generations.clone(), ready.clone());
        let (partitions, duration) = (args.partitions, args.duration);
        threads.push(thread::spawn(move || -> Result<(u64, u64, Histogram<u64>)> {
            let mut member = Member::connect(&coordinator, &group, &topic, partitions)?;
            member.join()?;
            // Every member in one generation before anyone measures (a late join would stop the others).
            settle(&mut member, &generations, i)?;
            ready.wait();
            let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            let (mut requests, mut offsets) = (0u64, 0u64);
            let start = Instant::now();
            while start.elapsed() < duration {
                let sent = Instant::now();
                offsets += member.commit(requests as i64)? as u64;
                latency.record((sent.elapsed().as_micros() as u64).max(1))?;
                requests += 1;
            }
            member.leave()?;
            Ok((requests, offsets, latency))
        }));
    }
    let start = Instant::now();
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let (mut requests, mut offsets) = (0, 0);
    for t in threads {
        let (r, o, h) = t.join().map_err(|_| anyhow::anyhow!("a member thread panicked"))??;
        requests += r;
        offsets += o;
        latency.add(&h)?;
    }
    // The threads measured for `duration` each, after joining; the wall time includes the joins.
    let elapsed = args.duration.min(start.elapsed());
    Ok((requests, offsets, elapsed, latency))
}

/// Heartbeats (joining again when told to) until every member has reported the same generation as
/// this one, `generations[me]` being this member's report.
fn settle(member: &mut Member, generations: &Mutex<Vec<i32>>, me: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        generations.lock().expect("not poisoned")[me] = member.generation;
        if generations.lock().expect("not poisoned").iter().all(|g| *g == member.generation) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the members did not settle into one generation within 120 s");
        }
        thread::sleep(Duration::from_millis(100));
        if member.heartbeat()? {
            member.join()?;
        }
    }
}

/// A stable member heartbeating on its own thread; on a rebalance it joins again and records how long it
/// had no assignment.
struct Stable {
    stop: Arc<AtomicBool>,
    /// (when it learned of a rebalance, when it had its new assignment), per rebalance.
    pauses: Arc<Mutex<Vec<(Instant, Instant)>>>,
    thread: thread::JoinHandle<Result<()>>,
}

/// Joins `member` (on its own thread, beside the others: each join makes the earlier members join
/// again), settles the group, and keeps heartbeating.
fn stable_member(
    mut member: Member,
    heartbeat: Duration,
    generations: Arc<Mutex<Vec<i32>>>,
    me: usize,
    settled: Arc<std::sync::atomic::AtomicUsize>,
) -> Stable {
    let stop = Arc::new(AtomicBool::new(false));
    let pauses = Arc::new(Mutex::new(Vec::new()));
    let (stop2, pauses2) = (stop.clone(), pauses.clone());
    let thread = thread::spawn(move || -> Result<()> {
        member.join()?;
        settle(&mut member, &generations, me)?;
        settled.fetch_add(1, Ordering::SeqCst);
        // Real members' heartbeats are not in step: each one's fall at its own point of the interval
        // (here spread evenly), so the first to hear of a rebalance waits for the last, as it would.
        let members = generations.lock().expect("not poisoned").len() as u32;
        let phase = heartbeat * (me as u32 + 1) / members.max(1);
        let mut next_beat = Instant::now() + phase;
        while !stop2.load(Ordering::SeqCst) {
            thread::sleep(next_beat.saturating_duration_since(Instant::now()));
            next_beat += heartbeat;
            if member.heartbeat()? {
                let told = Instant::now();
                member.join()?;
                let done = Instant::now();
                pauses2.lock().expect("not poisoned").push((told, done));
                // Out of step again after the rejoin, as members of a real group are.
                next_beat = done + phase;
            }
        }
        member.leave()
    });
    Stable { stop, pauses, thread }
}

fn measure_rebalances(
    client: &mut KafkaClient,
    args: &GroupsArgs,
    topic: &str,
    run_id: u64,
) -> Result<Vec<(Duration, Vec<Duration>)>> {
    let group = format!("bench-rebalance-{run_id}");
    let coordinator = client.coordinator(&group)?;
    let heartbeat = Duration::from_millis(args.heartbeat_ms);
    // The members that stay, joined all at once, settled into one generation before the measurement.
    let stayers = args.rebalance_members - 1;
    let generations = Arc::new(Mutex::new(vec![-1; stayers]));
    let settled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut stable = Vec::new();
    for me in 0..stayers {
        let member = Member::connect(&coordinator, &group, topic, args.partitions)?;
        stable.push(stable_member(member, heartbeat, generations.clone(), me, settled.clone()));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while settled.load(Ordering::SeqCst) < stayers {
        if Instant::now() > deadline {
            bail!("the members did not settle within 120 s");
        }
        thread::sleep(Duration::from_millis(10));
    }
    let generation_settled = |stable: &[Stable], after: Instant, count: usize| {
        stable
            .iter()
            .all(|s| s.pauses.lock().expect("not poisoned").iter().filter(|(t, _)| *t >= after).count() >= count)
    };
    let mut rounds = Vec::new();
    for _ in 0..args.rounds {
        let start = Instant::now();
        let mut newcomer = Member::connect(&coordinator, &group, topic, args.partitions)?;
        // Its JoinGroup answer comes once every stable member has joined again; then each syncs.
        let joining = thread::spawn(move || -> Result<Member> {
            newcomer.join()?;
            Ok(newcomer)
        });
        let deadline = start + Duration::from_secs(120);
        while !generation_settled(&stable, start, 1) {
            if Instant::now() > deadline {
                bail!("the group did not settle within 120 s of a member joining");
            }
            thread::sleep(Duration::from_millis(5));
        }
        let mut newcomer = joining.join().map_err(|_| anyhow::anyhow!("the joining member panicked"))??;
        let settled = stable
            .iter()
            .filter_map(|s| {
                s.pauses.lock().expect("not poisoned").iter().rev().find(|(t, _)| *t >= start).map(|(_, done)| *done)
            })
            .chain(std::iter::once(Instant::now()))
            .max()
            .context("members")?;
        let pauses: Vec<Duration> = stable
            .iter()
            .filter_map(|s| {
                s.pauses.lock().expect("not poisoned").iter().rev().find(|(t, _)| *t >= start).map(|(t, d)| *d - *t)
            })
            .collect();
        rounds.push((settled - start, pauses));
        // The newcomer leaves; the rest settle again before the next round.
        newcomer.leave()?;
        let left = Instant::now();
        while !generation_settled(&stable, left, 1) {
            if left.elapsed() > Duration::from_secs(120) {
                bail!("the group did not settle within 120 s of a member leaving");
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
    for s in &stable {
        s.stop.store(true, Ordering::SeqCst);
    }
    for s in stable {
        s.thread.join().map_err(|_| anyhow::anyhow!("a member thread panicked"))??;
    }
    Ok(rounds)
}
