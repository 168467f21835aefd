use super::metadata::EXHAUSTED_EPOCH;
use super::record::encode_value_v0;
use super::*;

struct Ids(i64);

impl ProducerIdSource for Ids {
    fn next_producer_id(&mut self) -> Option<i64> {
        self.0 += 1;
        Some(self.0)
    }
}

/// A coordinator with a log: writes are committed (appended) or failed by hand, or all at once by `run`.
struct Harness {
    c: TxnCoordinator,
    ids: Ids,
    next_request: u64,
    now_ms: i64,
    log: Vec<TxnLogRecord>,
}

fn tp(topic: &str, partition: u32) -> TopicPartition {
    TopicPartition::new(topic, partition)
}

fn pe(producer_id: i64, epoch: i16) -> ProducerIdAndEpoch {
    ProducerIdAndEpoch { producer_id, epoch }
}

fn writes(effects: &[Effect]) -> Vec<(WriteId, TxnLogRecord)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Write { write, record } => Some((*write, record.clone())),
            _ => None,
        })
        .collect()
}

fn answers(effects: &[Effect]) -> Vec<Result<Reply, ResponseError>> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Answer { reply, .. } => Some(*reply),
            _ => None,
        })
        .collect()
}

fn markers(effects: &[Effect]) -> Vec<TxnMarkers> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::SendMarkers(m) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

impl Harness {
    fn new() -> Self {
        Self::with(TxnSettings::default())
    }

    fn with(settings: TxnSettings) -> Self {
        let mut c = TxnCoordinator::loading(settings, 3);
        assert!(c.finish_loading().is_empty());
        Harness { c, ids: Ids(999), next_request: 0, now_ms: 1_000, log: Vec::new() }
    }

    fn request(&mut self) -> RequestToken {
        self.next_request += 1;
        RequestToken(self.next_request)
    }

    /// Commits every write in `effects` (and in what committing them produces); returns the other effects.
    fn run(&mut self, effects: Vec<Effect>) -> Vec<Effect> {
        let mut out = Vec::new();
        for effect in effects {
            match effect {
                Effect::Write { write, record } => {
                    self.log.push(record);
                    let more = self.c.write_committed(write, self.now_ms);
                    out.extend(self.run(more));
                }
                other => out.push(other),
            }
        }
        out
    }

    fn init_raw(&mut self, id: &str, expected: Option<ProducerIdAndEpoch>) -> Vec<Effect> {
        let request = self.request();
        let req = InitProducerId { transactional_id: id.into(), txn_timeout_ms: 60_000, expected };
        self.c.init_producer_id(request, &req, self.now_ms, &mut self.ids)
    }

    fn init(&mut self, id: &str, expected: Option<ProducerIdAndEpoch>) -> Result<Reply, ResponseError> {
        let effects = self.init_raw(id, expected);
        let out = self.run(effects);
        answers(&out)[0]
    }

    fn init_ok(&mut self, id: &str) -> ProducerIdAndEpoch {
        match self.init(id, None) {
            Ok(Reply::ProducerId(p)) => p,
            other => panic!("InitProducerId answered {other:?}"),
        }
    }

    fn add(&mut self, id: &str, p: ProducerIdAndEpoch, parts: &[TopicPartition]) -> Result<Reply, ResponseError> {
        let request = self.request();
        let effects = self.c.add_partitions(request, id, p, parts, self.now_ms);
        answers(&self.run(effects))[0]
    }

    fn end_raw(&mut self, id: &str, p: ProducerIdAndEpoch, result: TxnResult) -> Vec<Effect> {
        let request = self.request();
        self.c.end_txn(request, id, p, result, self.now_ms)
    }

    fn end(
        &mut self,
        id: &str,
        p: ProducerIdAndEpoch,
        result: TxnResult,
    ) -> (Result<Reply, ResponseError>, Vec<TxnMarkers>) {
        let effects = self.end_raw(id, p, result);
        let out = self.run(effects);
        (answers(&out)[0], markers(&out))
    }

    fn finish_markers(&mut self, m: &TxnMarkers) {
        let p = pe(m.producer_id, m.producer_epoch);
        let effects = self.c.markers_written(&m.transactional_id, p, m.result, self.now_ms);
        assert_eq!(writes(&effects).len(), 1, "the Complete record is written");
        assert!(self.run(effects).is_empty());
    }

    fn state(&self, id: &str) -> TxnState {
        self.c.metadata(id).expect("known id").state()
    }

    /// A coordinator rebuilt from this one's log.
    fn reload(&self) -> (TxnCoordinator, Vec<Effect>) {
        let mut c = TxnCoordinator::loading(*self.c.settings(), self.c.coordinator_epoch() + 1);
        for record in &self.log {
            let decoded = TxnLogRecord::decode(&record.encode_key(), record.encode_value().as_deref()).unwrap();
            c.replay(decoded);
        }
        let effects = c.finish_loading();
        (c, effects)
    }
}

#[test]
fn init_of_a_new_id_allocates_a_producer_id_at_epoch_zero() {
    let mut h = Harness::new();
    let p = h.init_ok("app");
    assert_eq!(p, pe(1000, 0));
    assert_eq!(h.state("app"), TxnState::Empty);
    assert_eq!(h.log.len(), 1);
    assert_eq!(h.log[0].value.as_ref().unwrap().producer_epoch, 0);
}

#[test]
fn init_answers_only_after_its_write_committed() {
    let mut h = Harness::new();
    let effects = h.init_raw("app", None);
    assert!(answers(&effects).is_empty());
    let (write, _) = writes(&effects)[0].clone();
    // While the write is pending, a second init waits.
    assert_eq!(answers(&h.init_raw("app", None)), vec![Err(ResponseError::ConcurrentTransactions)]);
    let out = h.c.write_committed(write, h.now_ms);
    assert_eq!(answers(&out), vec![Ok(Reply::ProducerId(pe(1000, 0)))]);
}

#[test]
fn init_refuses_a_timeout_above_the_maximum_or_not_positive() {
    let mut h = Harness::with(TxnSettings { transaction_max_timeout_ms: 1_000, ..TxnSettings::default() });
    for timeout in [1_001, 0, -5] {
        let request = h.request();
        let req = InitProducerId { transactional_id: "app".into(), txn_timeout_ms: timeout, expected: None };
        let out = h.c.init_producer_id(request, &req, 0, &mut h.ids);
        assert_eq!(answers(&out), vec![Err(ResponseError::InvalidTransactionTimeout)]);
    }
    assert!(h.c.metadata("app").is_none());
}

#[test]
fn second_init_bumps_the_epoch_and_fences_the_zombie() {
    let mut h = Harness::new();
    let old = h.init_ok("app");
    let new = h.init_ok("app");
    assert_eq!(new, pe(old.producer_id, old.epoch + 1));
    assert_eq!(h.add("app", old, &[tp("t", 0)]), Err(ResponseError::ProducerFenced));
    assert_eq!(h.end("app", old, TxnResult::Commit).0, Err(ResponseError::ProducerFenced));
    assert_eq!(h.add("app", new, &[tp("t", 0)]), Ok(Reply::Done));
    assert_eq!(h.c.verify_partition("app", old, &tp("t", 0)), Err(ResponseError::ProducerFenced));
    assert_eq!(h.c.verify_partition("app", new, &tp("t", 0)), Ok(()));
}

#[test]
fn init_with_an_open_transaction_aborts_it_under_a_bumped_epoch_first() {
    let mut h = Harness::new();
    let old = h.init_ok("app");
    h.add("app", old, &[tp("t", 0), tp("u", 1)]).unwrap();
    let effects = h.init_raw("app", None);
    assert_eq!(answers(&effects), vec![Err(ResponseError::ConcurrentTransactions)]);
    assert_eq!(h.state("app"), TxnState::PrepareEpochFence);
    let record = writes(&effects)[0].1.clone();
    let value = record.value.unwrap();
    assert_eq!((value.state, value.producer_epoch), (TxnState::PrepareAbort, old.epoch + 1));
    // During the fence the old epoch can do nothing.
    assert_eq!(h.add("app", old, &[tp("t", 0)]), Err(ResponseError::ProducerFenced));
    assert_eq!(h.c.verify_partition("app", old, &tp("t", 0)), Err(ResponseError::ProducerFenced));
    let out = h.run(effects);
    let m = markers(&out);
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].result, TxnResult::Abort);
    assert_eq!(m[0].producer_epoch, old.epoch + 1);
    assert_eq!(m[0].partitions, vec![tp("t", 0), tp("u", 1)]);
    assert_eq!(m[0].coordinator_epoch, 3);
    // The retry waits until the abort is complete ...
    assert_eq!(h.init("app", None), Err(ResponseError::ConcurrentTransactions));
    h.finish_markers(&m[0]);
    assert_eq!(h.state("app"), TxnState::CompleteAbort);
    // ... then gets the epoch after the fencing one.
    assert_eq!(h.init_ok("app"), pe(old.producer_id, old.epoch + 2));
}

#[test]
fn kip360_bump_with_the_current_epoch_and_its_retry_get_the_same_epoch() {
    let mut h = Harness::new();
    let p = h.init_ok("app");
    let bumped = h.init("app", Some(p)).unwrap();
    assert_eq!(bumped, Reply::ProducerId(pe(p.producer_id, p.epoch + 1)));
    // The answer was lost; the producer asks again with the epoch it had.
    assert_eq!(h.init("app", Some(p)).unwrap(), bumped);
    // An epoch that is neither current nor the one before the bump is a zombie's.
    assert_eq!(h.init("app", Some(pe(p.producer_id, p.epoch + 7))), Err(ResponseError::ProducerFenced));
    // So is another producer id.
    assert_eq!(h.init("app", Some(pe(p.producer_id + 1, 0))), Err(ResponseError::ProducerFenced));
}

#[test]
fn exhausted_epoch_rolls_over_to_a_new_producer_id() {
    let mut h = Harness::new();
    let p = h.init_ok("app");
    // Bring the id to the last usable epoch.
    h.c.txns.get_mut("app").unwrap().current.producer_epoch = EXHAUSTED_EPOCH;
    let old = pe(p.producer_id, EXHAUSTED_EPOCH);
    let rolled = h.init("app", Some(old)).unwrap();
    let Reply::ProducerId(rolled) = rolled else { panic!() };
    assert_ne!(rolled.producer_id, p.producer_id);
    assert_eq!(rolled.epoch, 0);
    let meta = h.c.metadata("app").unwrap();
    assert_eq!(meta.current.last_producer_id, p.producer_id);
    // The rotation's retry (old producer id, exhausted epoch) is recognised and answered the same.
    assert_eq!(h.init("app", Some(old)).unwrap(), Reply::ProducerId(rolled));
    // The record carries the previous producer id.
    assert_eq!(h.log.last().unwrap().value.as_ref().unwrap().last_producer_id, p.producer_id);
}

#[test]
fn add_partitions_refuses_unknown_ids_and_other_producer_ids() {
    let mut h = Harness::new();
    assert_eq!(h.add("nobody", pe(1, 0), &[tp("t", 0)]), Err(ResponseError::InvalidProducerIdMapping));
    let p = h.init_ok("app");
    assert_eq!(h.add("app", pe(p.producer_id + 1, 0), &[tp("t", 0)]), Err(ResponseError::InvalidProducerIdMapping));
}

#[test]
fn add_partitions_starts_a_transaction_and_re_adding_needs_no_write() {
    let mut h = Harness::new();
    let p = h.init_ok("app");
    h.now_ms = 5_000;
    assert_eq!(h.add("app", p, &[tp("t", 0)]), Ok(Reply::Done));
    let meta = h.c.metadata("app").unwrap();
    assert_eq!((meta.state(), meta.current.txn_start_ms), (TxnState::Ongoing, 5_000));
    let logged = h.log.len();
    assert_eq!(h.add("app", p, &[tp("t", 0)]), Ok(Reply::Done));
    assert_eq!(h.log.len(), logged, "already present: no write");
    h.now_ms = 6_000;
    assert_eq!(h.add("app", p, &[tp("t", 1)]), Ok(Reply::Done));
    let meta = h.c.metadata("app").unwrap();
    assert_eq!(meta.current.partitions.len(), 2);
    assert_eq!(meta.current.txn_start_ms, 5_000, "the transaction's start does not move");
}

#[test]
fn add_offsets_adds_the_groups_consumer_offsets_partition() {
    let mut h = Harness::new();
    let p = h.init_ok("app");
    let request = h.request();
    let effects = h.c.add_offsets(request, "app", p, 17, h.now_ms);
    assert_eq!(answers(&h.run(effects)), vec![Ok(Reply::Done)]);
    assert!(h.c.metadata("app").unwrap().current.partitions.contains(&tp(CONSUMER_OFFSETS_TOPIC, 17)));
}

#[test]
fn add_partitions_waits_while_a_write_is_pending_or_markers_are_being_written() {
    let mut h = Harness::new();
    let p = h.init_ok("app");
    let request = h.request();
    let pending = h.c.add_partitions(request, "app", p, &[tp("t", 0)], h.now_ms);
    assert_eq!(writes(&pending).len(), 1);
    assert_eq!(h.add("app", p, &[tp("t", 1)]), Err(ResponseError::ConcurrentTransactions));
    // Not durable yet: a leader may not take data for it.
    assert_eq!(h.c.verify_partition("app", p, &tp("t", 0)), Err(ResponseError::InvalidTxnState));
    h.run(pending);
    let (answer, m) = h.end("app", p, TxnResult::Commit);
    assert_eq!(answer, Ok(Reply::Done));
    assert_eq!(m.len(), 1);
    assert_eq!(h.add("app", p, &[tp("t", 1)]), Err(ResponseError::ConcurrentTransactions));
}

#[test]
fn verify_accepts_only_partitions_of_the_ongoing_transaction() {
    let mut h = Harness::new();
    assert_eq!(h.c.verify_partition("nobody", pe(1, 0), &tp("t", 0)), Err(ResponseError::InvalidProducerIdMapping));
    let p = h.init_ok("app");
    assert_eq!(h.c.verify_partition("app", p, &tp("t", 0)), Err(ResponseError::InvalidTxnState));
    h.add("app", p, &[tp("t", 0)]).unwrap();
    assert_eq!(h.c.verify_partition("app", p, &tp("t", 0)), Ok(()));
    assert_eq!(h.c.verify_partition("app", p, &tp("t", 1)), Err(ResponseError::InvalidTxnState));
    assert_eq!(h.c.verify_partition("app", pe(p.producer_id, 5), &tp("t", 0)), Err(ResponseError::ProducerFenced));
    assert_eq!(
        h.c.verify_partition("app", pe(p.producer_id + 1, 0), &tp("t", 0)),
        Err(ResponseError::InvalidProducerIdMapping)
    );
    // Once EndTxn is being written, no more data.
    let effects = h.end_raw("app", p, TxnResult::Commit);
    assert_eq!(h.c.verify_partition("app", p, &tp("t", 0)), Err(ResponseError::InvalidTxnState));
    h.run(effects);
    assert_eq!(h.c.verify_partition("app", p, &tp("t", 0)), Err(ResponseError::InvalidTxnState));
}

#[test]
fn end_txn_answers_after_prepare_is_durable_then_markers_then_complete() {
    let mut h = Harness::new();
    let p = h.init_ok("app");
    h.add("app", p, &[tp("t", 0), tp("t", 2)]).unwrap();
    let effects = h.end_raw("app", p, TxnResult::Commit);
    assert!(answers(&effects).is_empty() && markers(&effects).is_empty(), "nothing before the write commits");
    let (write, record) = writes(&effects)[0].clone();
    assert_eq!(record.value.unwrap().state, TxnState::PrepareCommit);
    h.log.push(writes(&effects)[0].1.clone());
    let out = h.c.write_committed(write, h.now_ms);
    assert_eq!(answers(&out), vec![Ok(Reply::Done)]);
    let m = markers(&out);
    assert_eq!(m[0].partitions, vec![tp("t", 0), tp("t", 2)]);
    assert_eq!((m[0].result, m[0].producer_epoch), (TxnResult::Commit, p.epoch));
    // Retries while the markers are being written.
    assert_eq!(h.end("app", p, TxnResult::Commit).0, Err(ResponseError::ConcurrentTransactions));
    assert_eq!(h.end("app", p, TxnResult::Abort).0, Err(ResponseError::InvalidTxnState));
    h.finish_markers(&m[0]);
    let meta = h.c.metadata("app").unwrap();
    assert_eq!(meta.state(), TxnState::CompleteCommit);
    assert!(meta.current.partitions.is_empty());
    // Retries after completion.
    assert_eq!(h.end("app", p, TxnResult::Commit).0, Ok(Reply::Done));
    assert_eq!(h.end("app", p, TxnResult::Abort).0, Err(ResponseError::InvalidTxnState));
    // And the next transaction starts from CompleteCommit.
    assert_eq!(h.add("app", p, &[tp("t", 5)]), Ok(Reply::Done));
    assert_eq!(h.state("app"), TxnState::Ongoing);
}

#[test]
fn abort_completes_to_complete_abort_and_its_retry_succeeds() {
    let mut h = Harness::new();
    let p = h.init_ok("app");
    h.add("app", p, &[tp("t", 0)]).unwrap();
    let (answer, m) = h.end("app", p, TxnResult::Abort);
    assert_eq!(answer, Ok(Reply::Done));
    assert_eq!(h.end("app", p, TxnResult::Abort).0, Err(ResponseError::ConcurrentTransactions));
    assert_eq!(h.end("app", p, TxnResult::Commit).0, Err(ResponseError::InvalidTxnState));
    h.finish_markers(&m[0]);
    assert_eq!(h.state("app"), TxnState::CompleteAbort);
    assert_eq!(h.end("app", p, TxnResult::Abort).0, Ok(Reply::Done));
    assert_eq!(h.end("app", p, TxnResult::Commit).0, Err(ResponseError::InvalidTxnState));
}

#[test]
fn end_txn_without_a_transaction_or_during_another_end_is_refused() {
    let mut h = Harness::new();
    assert_eq!(h.end("nobody", pe(1, 0), TxnResult::Commit).0, Err(ResponseError::InvalidProducerIdMapping));
    let p = h.init_ok("app");
    assert_eq!(h.end("app", p, TxnResult::Commit).0, Err(ResponseError::InvalidTxnState));
    h.add("app", p, &[tp("t", 0)]).unwrap();
    let first = h.end_raw("app", p, TxnResult::Commit);
    assert_eq!(answers(&h.end_raw("app", p, TxnResult::Commit)), vec![Err(ResponseError::ConcurrentTransactions)]);
    assert_eq!(answers(&h.end_raw("app", p, TxnResult::Abort)), vec![Err(ResponseError::ConcurrentTransactions)]);
    assert_eq!(answers(&h.run(first)), vec![Ok(Reply::Done)]);
}

#[test]
fn a_failed_write_reverts_its_transition_and_answers_a_coordinator_error() {
    let mut h = Harness::new();
    let p = h.init_ok("app");
    let request = h.request();
    let effects = h.c.add_partitions(request, "app", p, &[tp("t", 0)], h.now_ms);
    let (write, _) = writes(&effects)[0].clone();
    let out = h.c.write_failed(write, ResponseError::NotEnoughReplicas);
    assert_eq!(answers(&out), vec![Err(ResponseError::CoordinatorNotAvailable)]);
    assert_eq!(h.state("app"), TxnState::Empty);
    assert!(h.c.metadata("app").unwrap().pending.is_none());
    h.add("app", p, &[tp("t", 0)]).unwrap();
    let effects = h.end_raw("app", p, TxnResult::Commit);
    let (write, _) = writes(&effects)[0].clone();
    let out = h.c.write_failed(write, ResponseError::NotLeaderOrFollower);
    assert_eq!(answers(&out), vec![Err(ResponseError::NotCoordinator)]);
    assert!(markers(&out).is_empty(), "no markers for an outcome that is not durable");
    assert_eq!(h.state("app"), TxnState::Ongoing);
    // The client retries and this time it works.
    assert_eq!(h.end("app", p, TxnResult::Commit).0, Ok(Reply::Done));
}

#[test]
fn a_failed_fence_write_returns_to_the_ongoing_transaction_with_the_old_epoch() {
    let mut h = Harness::new();
    let p = h.init_ok("app");
    h.add("app", p, &[tp("t", 0)]).unwrap();
    let effects = h.init_raw("app", None);
    let (write, _) = writes(&effects)[0].clone();
    assert!(h.c.write_failed(write, ResponseError::NotEnoughReplicas).is_empty(), "init was already answered");
    let meta = h.c.metadata("app").unwrap();
    assert_eq!((meta.state(), meta.current.producer_epoch), (TxnState::Ongoing, p.epoch));
}

#[test]
fn a_timed_out_transaction_is_aborted_under_a_bumped_epoch() {
    let mut h = Harness::new();
    let p = h.init_ok("app");
    h.add("app", p, &[tp("t", 0)]).unwrap();
    let start = h.now_ms;
    assert!(h.c.tick(start + 60_000).is_empty(), "not yet: the timeout must be exceeded");
    h.now_ms = start + 60_001;
    let effects = h.c.tick(h.now_ms);
    let value = writes(&effects)[0].1.value.clone().unwrap();
    assert_eq!((value.state, value.producer_epoch), (TxnState::PrepareAbort, p.epoch + 1));
    let out = h.run(effects);
    let m = markers(&out);
    assert_eq!((m[0].result, m[0].producer_epoch), (TxnResult::Abort, p.epoch + 1));
    // The producer learns it was fenced when it tries to commit.
    assert_eq!(h.end("app", p, TxnResult::Commit).0, Err(ResponseError::ProducerFenced));
    h.finish_markers(&m[0]);
    assert_eq!(h.state("app"), TxnState::CompleteAbort);
    assert_eq!(h.init_ok("app"), pe(p.producer_id, p.epoch + 2));
}

#[test]
fn a_failed_timeout_abort_is_tried_again_on_the_next_tick() {
    let mut h = Harness::new();
    let p = h.init_ok("app");
    h.add("app", p, &[tp("t", 0)]).unwrap();
    let effects = h.c.tick(h.now_ms + 70_000);
    let (write, _) = writes(&effects)[0].clone();
    h.c.write_failed(write, ResponseError::RequestTimedOut);
    assert_eq!(h.state("app"), TxnState::Ongoing);
    let again = h.c.tick(h.now_ms + 71_000);
    assert_eq!(writes(&again)[0].1.value.as_ref().unwrap().producer_epoch, p.epoch + 1, "bumped once only");
}

#[test]
fn a_failed_complete_write_is_tried_again_on_the_next_tick() {
    let mut h = Harness::new();
    let p = h.init_ok("app");
    h.add("app", p, &[tp("t", 0)]).unwrap();
    let (_, m) = h.end("app", p, TxnResult::Commit);
    let effects = h.c.markers_written("app", p, TxnResult::Commit, h.now_ms);
    let (write, _) = writes(&effects)[0].clone();
    h.c.write_failed(write, ResponseError::NotEnoughReplicas);
    assert_eq!(h.state("app"), TxnState::PrepareCommit);
    // A late report for another epoch changes nothing.
    assert!(h.c.markers_written("app", pe(p.producer_id, p.epoch + 1), TxnResult::Commit, 0).is_empty());
    let again = h.c.tick(h.now_ms);
    assert_eq!(writes(&again)[0].1.value.as_ref().unwrap().state, TxnState::CompleteCommit);
    h.run(again);
    assert_eq!(h.state("app"), TxnState::CompleteCommit);
    assert_eq!(m.len(), 1);
}

#[test]
fn an_idle_id_expires_with_a_tombstone() {
    let mut h = Harness::new();
    let p = h.init_ok("app");
    h.add("app", p, &[tp("t", 0)]).unwrap();
    let (_, m) = h.end("app", p, TxnResult::Commit);
    h.finish_markers(&m[0]);
    let idle_since = h.now_ms;
    let expiration = TxnSettings::default().transactional_id_expiration_ms;
    assert!(h.c.tick(idle_since + expiration - 1).is_empty());
    let effects = h.c.tick(idle_since + expiration);
    let (_, record) = writes(&effects)[0].clone();
    assert_eq!(record, TxnLogRecord { transactional_id: "app".into(), value: None });
    assert_eq!(h.add("app", p, &[tp("t", 0)]), Err(ResponseError::ConcurrentTransactions), "while expiring");
    h.run(effects);
    assert!(h.c.metadata("app").is_none());
    assert_eq!(h.add("app", p, &[tp("t", 0)]), Err(ResponseError::InvalidProducerIdMapping));
    // An Ongoing transaction never expires (it times out instead).
    let q = h.init_ok("other");
    h.add("other", q, &[tp("t", 0)]).unwrap();
    let effects = h.c.tick(h.now_ms + expiration + 1);
    assert!(writes(&effects).iter().all(|(_, r)| r.value.as_ref().is_some_and(|v| v.state == TxnState::PrepareAbort)));
}

#[test]
fn requests_while_loading_or_after_resigning_are_refused() {
    let mut c = TxnCoordinator::loading(TxnSettings::default(), 0);
    let req = InitProducerId { transactional_id: "app".into(), txn_timeout_ms: 1_000, expected: None };
    let out = c.init_producer_id(RequestToken(1), &req, 0, &mut Ids(0));
    assert_eq!(answers(&out), vec![Err(ResponseError::CoordinatorLoadInProgress)]);
    assert_eq!(c.verify_partition("app", pe(1, 0), &tp("t", 0)), Err(ResponseError::CoordinatorLoadInProgress));
    c.finish_loading();
    let pending = c.init_producer_id(RequestToken(2), &req, 0, &mut Ids(0));
    assert_eq!(writes(&pending).len(), 1);
    let out = c.resign();
    assert_eq!(out, vec![Effect::Answer { request: RequestToken(2), reply: Err(ResponseError::NotCoordinator) }]);
    let (write, _) = writes(&pending)[0].clone();
    assert!(c.write_committed(write, 0).is_empty(), "a write reported after resigning is ignored");
    let out = c.end_txn(RequestToken(3), "app", pe(1, 0), TxnResult::Commit, 0);
    assert_eq!(answers(&out), vec![Err(ResponseError::NotCoordinator)]);
}

#[test]
fn replay_keeps_the_last_record_and_forgets_tombstoned_ids() {
    let mut h = Harness::new();
    let a = h.init_ok("a");
    h.add("a", a, &[tp("t", 0)]).unwrap();
    let b = h.init_ok("b");
    h.add("b", b, &[tp("t", 1)]).unwrap();
    let (_, m) = h.end("b", b, TxnResult::Commit);
    h.finish_markers(&m[0]);
    h.log.push(TxnLogRecord { transactional_id: "b".into(), value: None });
    let (c, effects) = h.reload();
    assert!(effects.is_empty());
    assert_eq!(c.metadata("a").unwrap().current, h.c.metadata("a").unwrap().current);
    assert!(c.metadata("b").is_none());
}

#[test]
fn a_new_coordinator_finishes_prepared_transactions_and_keeps_ongoing_timers() {
    let mut h = Harness::new();
    let a = h.init_ok("a");
    h.add("a", a, &[tp("t", 0), tp("t", 1)]).unwrap();
    let (_, m) = h.end("a", a, TxnResult::Commit);
    let b = h.init_ok("b");
    h.add("b", b, &[tp("u", 0)]).unwrap();
    let b_start = h.now_ms;
    // The coordinator fails before the markers of "a" are written.
    let (mut c, effects) = h.reload();
    let resent = markers(&effects);
    assert_eq!(resent.len(), 1);
    assert_eq!(
        (resent[0].partitions.clone(), resent[0].result, resent[0].producer_epoch),
        (m[0].partitions.clone(), TxnResult::Commit, a.epoch)
    );
    assert_eq!(resent[0].coordinator_epoch, 4);
    let done = c.markers_written("a", a, TxnResult::Commit, h.now_ms);
    assert_eq!(writes(&done)[0].1.value.as_ref().unwrap().state, TxnState::CompleteCommit);
    // "b" is still Ongoing and times out on the new coordinator too.
    assert_eq!(c.verify_partition("b", b, &tp("u", 0)), Ok(()));
    assert!(
        c.tick(b_start + 60_000)
            .iter()
            .all(|e| !matches!(e, Effect::Write { record, .. } if record.transactional_id == "b"))
    );
    let effects = c.tick(b_start + 60_001);
    assert!(writes(&effects).iter().any(|(_, r)| r.transactional_id == "b"));
}

#[test]
#[should_panic(expected = "not a valid transition")]
fn a_transition_outside_kafkas_table_is_a_bug() {
    let mut meta = TxnMetadata::new("app".into(), 1, 1_000, 0);
    let mut target = meta.current.clone();
    target.state = TxnState::PrepareCommit;
    meta.prepare(target);
}

#[test]
fn state_bytes_follow_kafkas_numbering_and_transition_table() {
    use TxnState::*;
    let all = [Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort, Dead, PrepareEpochFence];
    for (i, s) in all.iter().enumerate() {
        assert_eq!(s.id(), i as i8);
        assert_eq!(TxnState::from_id(i as i8), Some(*s));
    }
    assert_eq!(TxnState::from_id(8), None);
    assert_eq!(PrepareAbort.valid_previous(), &[Ongoing, PrepareEpochFence]);
    assert_eq!(CompleteCommit.valid_previous(), &[PrepareCommit]);
    assert!(!Dead.valid_previous().contains(&Ongoing));
}

fn sample() -> TxnSnapshot {
    TxnSnapshot {
        producer_id: 4_000_000_123,
        last_producer_id: NO_PRODUCER_ID,
        producer_epoch: 7,
        last_producer_epoch: NO_PRODUCER_EPOCH,
        txn_timeout_ms: 60_000,
        state: TxnState::Ongoing,
        partitions: [tp("orders", 3), tp("orders", 0), tp(CONSUMER_OFFSETS_TOPIC, 12), tp("é", 1)].into(),
        txn_start_ms: 1_700_000_000_000,
        txn_last_update_ms: 1_700_000_000_500,
    }
}

#[test]
fn records_round_trip_in_version_1_and_version_0() {
    let mut rotated = sample();
    rotated.last_producer_id = 42;
    for value in [sample(), rotated.clone()] {
        let record = TxnLogRecord { transactional_id: "app-1".into(), value: Some(value) };
        let bytes = record.encode_value().unwrap();
        assert_eq!(&bytes[..2], &[0, 1], "version 1");
        assert_eq!(TxnLogRecord::decode(&record.encode_key(), Some(&bytes)).unwrap(), record);
    }
    // Version 0 has no tag for the previous producer id.
    let v0 = encode_value_v0(&rotated);
    let record = TxnLogRecord { transactional_id: "app-1".into(), value: Some(rotated.clone()) };
    let decoded = TxnLogRecord::decode(&record.encode_key(), Some(&v0)).unwrap().value.unwrap();
    assert_eq!(decoded, TxnSnapshot { last_producer_id: NO_PRODUCER_ID, ..rotated });
    let tombstone = TxnLogRecord { transactional_id: "gone".into(), value: None };
    assert_eq!(tombstone.encode_value(), None);
    assert_eq!(TxnLogRecord::decode(&tombstone.encode_key(), None).unwrap(), tombstone);
}

#[test]
fn record_bytes_match_kafkas_layout() {
    let value = TxnSnapshot { partitions: [tp("t", 2)].into(), state: TxnState::PrepareCommit, ..sample() };
    let record = TxnLogRecord { transactional_id: "ab".into(), value: Some(value) };
    assert_eq!(record.encode_key(), vec![0, 0, 0, 2, b'a', b'b']);
    let v0 = encode_value_v0(record.value.as_ref().unwrap());
    let mut expected = vec![0, 0];
    expected.extend_from_slice(&4_000_000_123i64.to_be_bytes());
    expected.extend_from_slice(&7i16.to_be_bytes());
    expected.extend_from_slice(&60_000i32.to_be_bytes());
    expected.push(2);
    expected.extend_from_slice(&[0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 2]);
    expected.extend_from_slice(&1_700_000_000_500i64.to_be_bytes());
    expected.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
    assert_eq!(v0, expected);
    let v1 = record.encode_value().unwrap();
    let mut expected = vec![0, 1];
    expected.extend_from_slice(&4_000_000_123i64.to_be_bytes());
    expected.extend_from_slice(&7i16.to_be_bytes());
    expected.extend_from_slice(&60_000i32.to_be_bytes());
    expected.push(2);
    expected.extend_from_slice(&[2, 2, b't', 2, 0, 0, 0, 2, 0]);
    expected.extend_from_slice(&1_700_000_000_500i64.to_be_bytes());
    expected.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
    expected.push(0);
    assert_eq!(v1, expected);
}

#[test]
fn damaged_records_are_refused_not_trusted() {
    let record = TxnLogRecord { transactional_id: "app".into(), value: Some(sample()) };
    let key = record.encode_key();
    let bytes = record.encode_value().unwrap();
    for cut in 0..bytes.len() {
        assert!(TxnLogRecord::decode(&key, Some(&bytes[..cut])).is_err(), "cut at {cut}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(TxnLogRecord::decode(&key, Some(&longer)), Err(RecordError::TrailingBytes(1)));
    let mut version = bytes.clone();
    version[1] = 9;
    assert_eq!(
        TxnLogRecord::decode(&key, Some(&version)),
        Err(RecordError::UnknownVersion { what: "value", version: 9 })
    );
    let mut state = bytes.clone();
    state[16] = 42;
    assert_eq!(TxnLogRecord::decode(&key, Some(&state)), Err(RecordError::UnknownState(42)));
    // A huge partition count in a short record is refused before anything is allocated.
    let mut v0 = encode_value_v0(&sample());
    v0[17..21].copy_from_slice(&i32::MAX.to_be_bytes());
    assert_eq!(TxnLogRecord::decode(&key, Some(&v0)), Err(RecordError::Truncated("partitions")));
}

#[test]
fn fencing_at_the_last_usable_epoch_uses_the_reserved_epoch_then_rotates() {
    let mut h = Harness::new();
    let p = h.init_ok("app");
    h.c.txns.get_mut("app").unwrap().current.producer_epoch = EXHAUSTED_EPOCH;
    let old = pe(p.producer_id, EXHAUSTED_EPOCH);
    h.add("app", old, &[tp("t", 0)]).unwrap();
    let effects = h.init_raw("app", None);
    let out = h.run(effects);
    let m = markers(&out);
    assert_eq!(m[0].producer_epoch, i16::MAX, "the abort takes the epoch kept for fencing");
    h.finish_markers(&m[0]);
    let next = h.init_ok("app");
    assert_ne!(next.producer_id, p.producer_id);
    assert_eq!(next.epoch, 0);
    assert_eq!(h.add("app", old, &[tp("t", 0)]), Err(ResponseError::InvalidProducerIdMapping));
}
