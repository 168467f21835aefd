//! A transaction left open past its `transaction.timeout.ms`, against the real binary: the coordinator
//! aborts it as Kafka's does (its next cleanup, every
//! `transaction.abort.timed.out.transaction.cleanup.interval.ms`), under a bumped producer epoch, so the
//! producer that went silent is fenced everywhere: at the coordinator (PRODUCER_FENCED, or
//! INVALID_PRODUCER_EPOCH for clients older than EndTxn v2) and at the partition, whose ABORT marker
//! carries the new epoch (INVALID_PRODUCER_EPOCH, Kafka's leaders' answer to a produce at an older epoch).

mod common;

use std::time::Duration;

use kafka_protocol::ResponseError;

use common::Broker;
use common::requests::create;
use common::txn::{
    Described, add_partition, describe, end_txn, fetch_committed, init, latest, partition_producer,
    produce_transactional, transactional_batch, wait_for,
};

const ID: &str = "tx-silent";

#[test]
fn a_transaction_past_its_timeout_is_aborted_by_the_coordinator_and_its_producer_fenced() {
    let cleanup = "transaction.abort.timed.out.transaction.cleanup.interval.ms=100";
    let broker = Broker::start_with(1, &["--set", cleanup]);
    let mut stream = broker.connect();
    assert_eq!(create(&mut stream, "t", 1, 1, &[]), 0);
    let silent = init(&mut stream, ID, 1_000);
    assert_eq!(silent.1, 0, "a new id starts at epoch 0");
    assert_eq!(add_partition(&mut stream, ID, silent, "t", 0), 0);
    assert_eq!(produce_transactional(&mut stream, ID, "t", &transactional_batch(silent, 0, 3)), (0, 0));

    // The producer goes silent. Kafka's coordinator ends the transaction with PrepareAbort then
    // CompleteAbort under the next epoch, and writes the ABORT marker in between.
    let aborted = wait_for("the coordinator's abort", Duration::from_secs(60), || {
        let described = describe(&mut stream, ID);
        (described.state != "Ongoing" && described.state != "PrepareAbort").then_some(described)
    });
    let fenced_in = (silent.0, silent.1 + 1);
    assert_eq!(
        aborted,
        Described { error: 0, state: "CompleteAbort".into(), producer: fenced_in, partitions: vec![] },
        "aborted under a bumped epoch, its partitions forgotten"
    );
    // The marker is at offset 3: nothing holds the last stable offset below the high watermark, and
    // read_committed consumers drop the three records.
    assert_eq!((latest(&mut stream, "t", 0, 0), latest(&mut stream, "t", 0, 1)), (4, 4));
    let read = fetch_committed(&mut stream, "t", 0);
    assert_eq!((read.high_watermark, read.last_stable_offset, &read.aborted), (4, 4, &vec![(silent.0, 0)]));
    assert_eq!(read.visible_offsets(), Vec::<i64>::new(), "no aborted record is read_committed");
    assert_eq!(
        partition_producer(&mut stream, "t", 0, silent.0).map(|(epoch, _, open)| (epoch, open)),
        Some((i32::from(fenced_in.1), -1)),
        "the partition has the marker's epoch and no open transaction"
    );

    // The silent producer wakes up: whatever it sends is refused, as Kafka refuses it, and nothing changes.
    let fenced = ResponseError::ProducerFenced.code();
    assert_eq!(end_txn(&mut stream, 3, ID, silent, true), fenced);
    assert_eq!(end_txn(&mut stream, 3, ID, silent, false), fenced);
    assert_eq!(end_txn(&mut stream, 1, ID, silent, true), ResponseError::InvalidProducerEpoch.code());
    assert_eq!(add_partition(&mut stream, ID, silent, "t", 0), fenced);
    let (code, _) = produce_transactional(&mut stream, ID, "t", &transactional_batch(silent, 3, 1));
    assert_eq!(code, ResponseError::InvalidProducerEpoch.code(), "the partition leader's answer");
    assert_eq!((latest(&mut stream, "t", 0, 0), latest(&mut stream, "t", 0, 1)), (4, 4), "nothing appended");
    assert_eq!(describe(&mut stream, ID), aborted, "nothing changed at the coordinator");

    // A new session of the id (the restarted producer) gets the epoch after the fence, and its
    // transaction commits where the old one was aborted.
    let next = init(&mut stream, ID, 60_000);
    assert_eq!(next, (silent.0, fenced_in.1 + 1));
    assert_eq!(add_partition(&mut stream, ID, next, "t", 0), 0);
    assert_eq!(produce_transactional(&mut stream, ID, "t", &transactional_batch(next, 0, 2)), (0, 4));
    assert_eq!(end_txn(&mut stream, 3, ID, next, true), 0);
    wait_for("the commit's completion", Duration::from_secs(30), || {
        (describe(&mut stream, ID).state == "CompleteCommit").then_some(())
    });
    let read = fetch_committed(&mut stream, "t", 0);
    assert_eq!((read.last_stable_offset, &read.aborted), (7, &vec![(silent.0, 0)]), "the commit's marker at 6");
    assert_eq!(read.visible_offsets(), vec![4, 5], "the committed records only");
    broker.terminate();
}
