//! A leader's replication answer on its way into a follower's log, as the follower's fetcher takes it:
//! the frame (`fetch_result_frame_pieces`) read by a frame reader that receives bodies in place, its CRC
//! checked through each batch's own CRC (`decode_fetch_result`), the records applied by the follower's
//! replicas (`apply_answer`, whose storage checks every batch). What this proves: a record byte is read
//! once for integrity and yet nothing damaged, out of order or of an older leader epoch reaches the log.

use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use futures_lite::future::block_on;
use shardlog_broker::quorum::state::{NodeId, PartitionEpoch, PartitionRecord};
use shardlog_broker::replication::{FetchPosition, FetchReply};
use shardlog_broker::shard::ShardReplicas;
use shardlog_net::peer::replication::{
    FetchedPartition, NO_EPOCH, ReplicaFetchResult, decode_fetch_result, fetch_result_frame_pieces,
};
use shardlog_net::peer::{IN_PLACE_BYTES, PeerFrameReader};
use shardlog_storage::batch::{build_batch, stamp};
use shardlog_storage::fs::sim::SimFs;
use shardlog_storage::{LeaderEpoch, LogConfig, LogDir, Offset, PartitionLog, SystemClock, TopicPartition};

/// A leader and a follower of partition `t-0`, each with its log and its shard's replicas.
struct Pair {
    tp: TopicPartition,
    _dirs: (LogDir<SimFs>, LogDir<SimFs>),
    leader_log: Rc<PartitionLog<SimFs>>,
    follower_log: Rc<PartitionLog<SimFs>>,
    leader: ShardReplicas,
    follower: ShardReplicas,
}

fn open(fs: &SimFs, dir: &str) -> (LogDir<SimFs>, Rc<PartitionLog<SimFs>>) {
    let config = LogConfig { segment_bytes: 1 << 20, ..LogConfig::default() };
    let (logs, _) =
        block_on(LogDir::open(fs.clone(), Rc::new(SystemClock), Path::new(dir), |_| config.clone())).expect("log dir");
    let log = block_on(logs.get_or_create(&TopicPartition::new("t", 0), config)).expect("log");
    (logs, log)
}

/// The leader's log holds `batches` batches of `epoch` (each 40 records of 2 KiB: an answer of several
/// hundred KiB, received in place); both logs know broker 1 leads at `epoch`.
fn pair(batches: u8, epoch: i32) -> Pair {
    let fs = SimFs::new();
    let tp = TopicPartition::new("t", 0);
    let (l, leader_log) = open(&fs, "/leader");
    let (f, follower_log) = open(&fs, "/follower");
    for i in 0..batches {
        let values: Vec<Vec<u8>> = (0..40).map(|r| vec![i ^ r; 2048]).collect();
        let values: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        block_on(leader_log.append(&build_batch(1_000 + i as i64, &values), LeaderEpoch(epoch))).unwrap();
    }
    block_on(leader_log.flush()).unwrap();
    let record = PartitionRecord {
        replicas: vec![NodeId(1), NodeId(2)],
        isr: vec![NodeId(1), NodeId(2)],
        leader: Some(NodeId(1)),
        leader_epoch: LeaderEpoch(epoch),
        partition_epoch: PartitionEpoch(1),
        adding_replicas: Vec::new(),
        removing_replicas: Vec::new(),
        offline_replicas: Vec::new(),
    };
    let topic_id = uuid::Uuid::from_u128(7);
    let progress = Arc::new(event_listener::Event::new());
    let leader = ShardReplicas::new(NodeId(1), 30_000, || true, progress.clone());
    let follower = ShardReplicas::new(NodeId(2), 30_000, || true, progress);
    leader.apply_record(&tp, topic_id, &record, 2, &leader_log);
    follower.apply_record(&tp, topic_id, &record, 2, &follower_log);
    Pair { tp, _dirs: (l, f), leader_log, follower_log, leader, follower }
}

/// The frame a leader sends for one partition's `records`.
fn frame(records: &Bytes) -> Vec<u8> {
    let control = ReplicaFetchResult {
        correlation: 1,
        partitions: vec![FetchedPartition {
            topic: "t".into(),
            partition: 0,
            error: 0,
            high_watermark: 0,
            log_start: 0,
            diverging_epoch: NO_EPOCH,
            diverging_end: 0,
            records_len: records.len() as u32,
        }],
    };
    fetch_result_frame_pieces(&control, std::slice::from_ref(records)).concat()
}

impl Pair {
    /// What the follower asks for now, and the leader's answer: its reply and the frame carrying it.
    fn ask(&self) -> (FetchPosition, FetchReply, Bytes) {
        let (to, position) = self.follower.fetch_position(&self.tp, &self.follower_log).expect("follows");
        assert_eq!(to, NodeId(1));
        let (reply, records) = block_on(self.leader.serve_fetch(&self.tp, &position, 10 << 20, &self.leader_log));
        (position, reply, records)
    }

    /// The follower's fetcher taking `frame`: received in place, its CRC checked, its records applied.
    fn take(&self, position: &FetchPosition, reply: &FetchReply, frame: &[u8]) -> Result<(), String> {
        let mut reader = PeerFrameReader::with_frame_buffers(64 << 20);
        let mut at = frame.len().min(100);
        reader.extend(&frame[..at]);
        // The header is judged, and the body's own buffer taken, when the reader is asked for a frame.
        assert!(reader.next_unchecked().map_err(|e| e.to_string())?.is_none());
        while let Some(space) = reader.frame_space() {
            let n = space.len().min(64 << 10);
            space[..n].copy_from_slice(&frame[at..at + n]);
            reader.frame_filled(n);
            at += n;
        }
        assert!(frame.len() < 16 + IN_PLACE_BYTES || at == frame.len(), "a large body is read in place");
        reader.extend(&frame[at..]);
        let frame = reader.next_unchecked().map_err(|e| e.to_string())?.expect("the whole frame");
        let (_, records) = decode_fetch_result(&frame).map_err(|e| format!("frame: {e}"))?;
        let applied = block_on(self.follower.apply_answer(&self.tp, position, reply, records[0], &self.follower_log));
        applied.map(|_| ()).map_err(|e| format!("log: {e}"))
    }

    fn everything(log: &PartitionLog<SimFs>) -> Vec<u8> {
        block_on(log.read(log.log_start_offset(), usize::MAX)).expect("read").bytes.to_vec()
    }
}

#[test]
fn an_answer_received_in_place_is_appended_byte_for_byte() {
    let pair = pair(12, 0);
    let (position, reply, records) = pair.ask();
    assert!(records.len() > 512 << 10, "an answer received in place: {}", records.len());
    pair.take(&position, &reply, &frame(&records)).unwrap();
    assert_eq!(pair.follower_log.log_end_offset(), pair.leader_log.log_end_offset());
    assert_eq!(Pair::everything(&pair.follower_log), Pair::everything(&pair.leader_log));
    assert_eq!(pair.follower_log.leader_epochs(), pair.leader_log.leader_epochs());
}

#[test]
fn a_batch_whose_bytes_fail_its_crc_passes_the_frame_and_is_refused_whole_by_the_log() {
    let pair = pair(6, 0);
    let (position, reply, records) = pair.ask();
    // A byte deep inside the last batch: the frame's CRC takes the batch at its CRC field's word, and the
    // log's check of every batch finds it before anything is appended.
    let mut bad = frame(&records);
    let at = bad.len() - 100;
    bad[at] ^= 0x20;
    let refused = pair.take(&position, &reply, &bad).unwrap_err();
    assert!(refused.starts_with("log: ") && refused.contains("CRC"), "{refused}");
    assert_eq!(pair.follower_log.log_end_offset(), Offset::ZERO, "nothing of the answer was appended");
    pair.take(&position, &reply, &frame(&records)).unwrap();
    assert_eq!(Pair::everything(&pair.follower_log), Pair::everything(&pair.leader_log));
}

#[test]
fn a_flipped_base_offset_length_or_epoch_fails_the_frame_crc() {
    let pair = pair(3, 0);
    let (position, reply, records) = pair.ask();
    let good = frame(&records);
    let records_at = good.len() - records.len();
    // The fields a batch's own CRC does not cover: base offset, length, leader epoch, magic, the CRC.
    for at in (0..21).map(|i| records_at + i) {
        let mut bad = good.clone();
        bad[at] ^= 0x01;
        let refused = pair.take(&position, &reply, &bad).unwrap_err();
        assert!(refused.starts_with("frame: CRC32C mismatch"), "byte {at}: {refused}");
    }
    assert_eq!(pair.follower_log.log_end_offset(), Offset::ZERO);
}

#[test]
fn an_answer_whose_batches_go_back_in_offsets_is_refused_whole() {
    let pair = pair(4, 0);
    let (position, reply, records) = pair.ask();
    // The leader's batches, then its second one again: offsets that do not follow on. The frame's CRC is
    // right (the leader computed it); the log's offset-continuity check refuses all of it.
    let second = block_on(pair.leader_log.read_until(Offset(40), usize::MAX, Offset(80))).unwrap().bytes;
    let replayed = Bytes::from([records.as_ref(), second.as_ref()].concat());
    let refused = pair.take(&position, &reply, &frame(&replayed)).unwrap_err();
    assert!(refused.starts_with("log: "), "{refused}");
    assert_eq!(pair.follower_log.log_end_offset(), Offset::ZERO, "nothing of the answer was appended");
}

#[test]
fn an_answer_cut_inside_a_batch_is_refused_whole() {
    let pair = pair(4, 0);
    let (position, reply, records) = pair.ask();
    let cut = records.slice(..records.len() - 1000);
    let refused = pair.take(&position, &reply, &frame(&cut)).unwrap_err();
    assert!(refused.starts_with("log: "), "{refused}");
    assert_eq!(pair.follower_log.log_end_offset(), Offset::ZERO);
}

#[test]
fn an_answer_of_an_older_leader_epoch_than_the_followers_last_is_refused() {
    let pair = pair(2, 3);
    let (position, reply, records) = pair.ask();
    pair.take(&position, &reply, &frame(&records)).unwrap();
    let end = pair.follower_log.log_end_offset();
    // A batch that follows on in offsets but carries an epoch older than the follower's last (3): the
    // leader's own bytes restamped, CRC intact (the epoch is outside what it covers), frame CRC right.
    let mut older = block_on(pair.leader_log.read_until(Offset(40), usize::MAX, end)).unwrap().bytes.to_vec();
    stamp(&mut older, end, LeaderEpoch(2));
    let (position, reply, _) = pair.ask();
    let refused = pair.take(&position, &reply, &frame(&Bytes::from(older))).unwrap_err();
    assert!(refused.starts_with("log: ") && refused.contains("epoch"), "{refused}");
    assert_eq!(pair.follower_log.log_end_offset(), end);
}

#[test]
fn a_frame_cut_short_is_never_taken() {
    let pair = pair(3, 0);
    let (_, _, records) = pair.ask();
    let whole = frame(&records);
    let mut reader = PeerFrameReader::with_frame_buffers(64 << 20);
    reader.extend(&whole[..100]);
    assert!(reader.next_unchecked().unwrap().is_none());
    let (mut at, short) = (100, whole.len() - 1);
    while let Some(space) = reader.frame_space() {
        let n = space.len().min(64 << 10).min(short - at);
        if n == 0 {
            break;
        }
        space[..n].copy_from_slice(&whole[at..at + n]);
        reader.frame_filled(n);
        at += n;
    }
    assert_eq!(reader.buffered(), whole.len() - 1);
    assert!(reader.next_unchecked().unwrap().is_none(), "one byte short is no frame");
    assert_eq!(reader.announced(), Some(whole.len() - 16));
}
