//! WriteTxnMarkers (v1, as a coordinator or `kafka-transactions.sh abort` sends it) against the real
//! binary, with what Kafka's leaders answer (`KafkaApis.handleWriteTxnMarkersRequest`,
//! `ProducerAppendInfo.appendEndTxnMarker`):
//! - a partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION, and nothing is written anywhere;
//! - a marker for a producer the partition has never seen is appended, and ends nothing;
//! - a marker from an older coordinator epoch than the partition saw for the producer is
//!   TRANSACTION_COORDINATOR_FENCED;
//! - a marker sent again for a transaction already ended (a coordinator's retry) is appended again and
//!   changes nothing a read_committed consumer sees: no transaction reopens, none is aborted after the
//!   fact, and the last stable offset stays at the high watermark.

mod common;

use std::time::Duration;

use kafka_protocol::ResponseError;

use common::Broker;
use common::requests::{batch, create, produce_one};
use common::txn::{
    Marker, add_partition, describe, end_txn, fetch_committed, init, latest, partition_producer, produce_transactional,
    transactional_batch, wait_for, write_markers,
};

/// (high watermark, last stable offset) of `topic`-`partition`.
fn stable(stream: &mut std::net::TcpStream, topic: &str, partition: i32) -> (i64, i64) {
    (latest(stream, topic, partition, 0), latest(stream, topic, partition, 1))
}

#[test]
fn markers_for_unknown_partitions_and_producers_get_kafkas_answers() {
    let broker = Broker::start(2);
    let mut stream = broker.connect();
    assert_eq!(create(&mut stream, "t", 2, 1, &[]), 0);
    assert_eq!(produce_one(&mut stream, "t", 0, &batch(1, 1, 1_700_000_000_000)), (0, 0));
    let unknown = ResponseError::UnknownTopicOrPartition.code();

    let never_seen = 4_242;
    let answers = write_markers(
        &mut stream,
        &[
            Marker { producer: (never_seen, 0), commit: true, coordinator_epoch: 5, partitions: &[("t", 0)] },
            Marker {
                producer: (never_seen + 1, 3),
                commit: false,
                coordinator_epoch: 0,
                partitions: &[("nope", 0), ("t", 7), ("t", -1), ("t", 1)],
            },
        ],
    );
    let row = |topic: &str, partition, code| (topic.to_string(), partition, code);
    assert_eq!(
        answers,
        vec![
            vec![row("t", 0, 0)],
            vec![row("nope", 0, unknown), row("t", 7, unknown), row("t", -1, unknown), row("t", 1, 0)],
        ]
    );
    // Each known partition took its marker, at its log end, and no transaction was opened or aborted.
    assert_eq!(stable(&mut stream, "t", 0), (2, 2));
    assert_eq!(stable(&mut stream, "t", 1), (1, 1));
    let read = fetch_committed(&mut stream, "t", 0);
    assert_eq!((read.aborted.clone(), read.visible_offsets()), (vec![], vec![0]));
    let read = fetch_committed(&mut stream, "t", 1);
    assert_eq!((read.aborted.clone(), read.visible_offsets()), (vec![], vec![]), "an ABORT of nothing aborts nothing");
    assert_eq!(partition_producer(&mut stream, "t", 0, never_seen), Some((0, 5, -1)), "remembered, nothing open");
    assert_eq!(partition_producer(&mut stream, "t", 1, never_seen + 1), Some((3, 0, -1)));

    // The partition now knows the producer's coordinator epoch: an older coordinator is fenced.
    let older = Marker { producer: (never_seen, 0), commit: false, coordinator_epoch: 4, partitions: &[("t", 0)] };
    let fenced = ResponseError::TransactionCoordinatorFenced.code();
    assert_eq!(write_markers(&mut stream, &[older]), vec![vec![row("t", 0, fenced)]]);
    assert_eq!(stable(&mut stream, "t", 0), (2, 2), "nothing written");
    // A marker at an epoch older than the producer's: INVALID_PRODUCER_EPOCH, as Kafka's leaders answer
    // (KIP-588), which its coordinator takes as a refusal for good.
    let stale = Marker { producer: (never_seen + 1, 2), commit: true, coordinator_epoch: 0, partitions: &[("t", 1)] };
    let invalid_epoch = ResponseError::InvalidProducerEpoch.code();
    assert_eq!(write_markers(&mut stream, &[stale]), vec![vec![row("t", 1, invalid_epoch)]]);
    assert_eq!(stable(&mut stream, "t", 1), (1, 1), "nothing written");

    // The broker serves on: records go on after the markers.
    assert_eq!(produce_one(&mut stream, "t", 0, &batch(2, 1, 1_700_000_000_000)), (0, 2));
    assert_eq!(fetch_committed(&mut stream, "t", 0).visible_offsets(), vec![0, 2]);
    assert_eq!(write_markers(&mut stream, &[]), Vec::<Vec<(String, i32, i16)>>::new(), "no markers, no answers");
    broker.terminate();
}

#[test]
fn a_marker_sent_again_after_its_transaction_ended_changes_nothing_readers_see() {
    const ID: &str = "tx-again";
    let broker = Broker::start(1);
    let mut stream = broker.connect();
    assert_eq!(create(&mut stream, "t", 1, 1, &[]), 0);
    let producer = init(&mut stream, ID, 60_000);
    assert_eq!(add_partition(&mut stream, ID, producer, "t", 0), 0);
    assert_eq!(produce_transactional(&mut stream, ID, "t", &transactional_batch(producer, 0, 2)), (0, 0));
    assert_eq!(end_txn(&mut stream, 3, ID, producer, true), 0);
    wait_for("the commit's completion", Duration::from_secs(30), || {
        (describe(&mut stream, ID).state == "CompleteCommit").then_some(())
    });
    assert_eq!(stable(&mut stream, "t", 0), (3, 3), "the coordinator's COMMIT marker at 2");
    let (epoch, coordinator_epoch, open) = partition_producer(&mut stream, "t", 0, producer.0).unwrap();
    assert_eq!((epoch, open), (i32::from(producer.1), -1));

    // The coordinator's marker once more, as a retry after a lost answer would bring it: taken again (as
    // Kafka takes it), and the transaction stays committed.
    let commit = Marker { producer, commit: true, coordinator_epoch, partitions: &[("t", 0)] };
    assert_eq!(write_markers(&mut stream, &[commit]), vec![vec![("t".to_string(), 0, 0)]]);
    assert_eq!(stable(&mut stream, "t", 0), (4, 4));
    let read = fetch_committed(&mut stream, "t", 0);
    assert_eq!((read.aborted.clone(), read.visible_offsets()), (vec![], vec![0, 1]));
    // Even an ABORT for the same producer and epoch, now that nothing is open, aborts nothing.
    let abort = Marker { commit: false, ..commit };
    assert_eq!(write_markers(&mut stream, &[abort]), vec![vec![("t".to_string(), 0, 0)]]);
    assert_eq!(stable(&mut stream, "t", 0), (5, 5));
    let read = fetch_committed(&mut stream, "t", 0);
    assert_eq!((read.aborted.clone(), read.visible_offsets()), (vec![], vec![0, 1]), "still committed");
    assert_eq!(partition_producer(&mut stream, "t", 0, producer.0), Some((epoch, coordinator_epoch, -1)));

    // The producer's next transaction opens and ends as if no marker had come twice.
    assert_eq!(add_partition(&mut stream, ID, producer, "t", 0), 0);
    assert_eq!(produce_transactional(&mut stream, ID, "t", &transactional_batch(producer, 2, 1)), (0, 5));
    assert_eq!(stable(&mut stream, "t", 0), (6, 5), "open from 5");
    assert_eq!(end_txn(&mut stream, 3, ID, producer, false), 0);
    wait_for("the abort's completion", Duration::from_secs(30), || {
        (describe(&mut stream, ID).state == "CompleteAbort").then_some(())
    });
    let read = fetch_committed(&mut stream, "t", 0);
    assert_eq!((read.last_stable_offset, read.aborted.clone()), (7, vec![(producer.0, 5)]));
    assert_eq!(read.visible_offsets(), vec![0, 1]);
    broker.terminate();
}
