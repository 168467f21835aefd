//! Peer calls over loopback TCP, caller and callee on one glommio executor: requests answered in order
//! on one connection, and a callee that closes (rather than answers or panics) on a Hello it refuses or
//! a frame that is not the protocol. The callee answers markers as `write_markers_here` does until the
//! storage side of markers is in (NOT_LEADER_OR_FOLLOWER for each).

use futures_lite::AsyncWriteExt;
use glommio::net::{TcpListener, TcpStream};
use kafka_protocol::ResponseError;
use shardlog_net::peer::calls::{CallRequest, CallsHello, MAX_CALL_FRAME_BYTES, kind};
use shardlog_net::peer::{HEADER_BYTES, encode_frame};
use shardlog_storage::TopicPartition;

use super::client::{Call, CallError, Connection, exchange, say_hello};
use super::serve::Callee;
use super::{error_of, markers_call, verify_call};
use crate::handlers::txn_markers::MarkerWrite;
use crate::quorum::state::NodeId;
use crate::txn::ProducerIdAndEpoch;

const CALLEE: u32 = 5;

/// Serves one connection on `listener` as broker [`CALLEE`] of cluster "c", refusing Hellos from other
/// clusters; markers are refused NOT_LEADER_OR_FOLLOWER, verifications accept partition 0 only.
async fn serve_one(listener: TcpListener) {
    let stream = listener.accept().await.expect("a caller");
    let callee = Callee { peer: "test", me: CALLEE, proven: None };
    let check = |hello: &CallsHello| if hello.cluster_id == "c" { Ok(()) } else { Err("not a broker of this cluster") };
    let answer = |request: CallRequest| async move {
        match request {
            CallRequest::WriteMarkers(w) => vec![ResponseError::NotLeaderOrFollower.code(); w.markers.len()],
            CallRequest::VerifyTxn(v) => v
                .partitions
                .iter()
                .map(|p| if p.partition == 0 { 0 } else { ResponseError::InvalidTxnState.code() })
                .collect(),
        }
    };
    callee.serve(stream, check, futures_lite::future::pending::<()>, answer).await;
}

/// Runs `test` against a callee on loopback; `test` gets the callee's address.
fn with_callee<F, Fut>(test: F)
where
    F: FnOnce(String) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let address = listener.local_addr().unwrap().to_string();
            let callee = glommio::spawn_local(serve_one(listener));
            test(address).await;
            // The callee's task ends once the caller's connection has gone or was closed by it.
            callee.await;
        })
        .unwrap()
        .join()
        .unwrap();
}

async fn connect(address: &str, cluster: &str) -> Result<Connection, CallError> {
    let stream = TcpStream::connect(address).await.unwrap();
    let hello = CallsHello { cluster_id: cluster.into(), broker: 4 };
    say_hello(Box::new(stream), address.to_string(), &hello, NodeId(CALLEE)).await
}

async fn send(connection: &mut Connection, call: &Call) -> Result<Vec<i16>, CallError> {
    exchange(connection, &encode_frame(call.kind, &call.body), call).await
}

fn marker(partition: u32) -> MarkerWrite {
    MarkerWrite {
        tp: TopicPartition::new("orders", partition),
        producer_id: 9,
        producer_epoch: 1,
        coordinator_epoch: 3,
        commit: true,
    }
}

#[test]
fn markers_and_verifications_are_answered_in_order_on_one_connection() {
    with_callee(|address| async move {
        let mut connection = connect(&address, "c").await.expect("the Hello is answered");
        let markers = markers_call(&[marker(0), marker(1)]);
        let codes = send(&mut connection, &markers).await.unwrap();
        let errors: Vec<_> = codes.into_iter().map(|c| error_of(c, ResponseError::NotLeaderOrFollower)).collect();
        assert_eq!(
            errors,
            vec![Some(ResponseError::NotLeaderOrFollower); 2],
            "write_markers_here's answer, per marker"
        );
        let producer = ProducerIdAndEpoch { producer_id: 9, epoch: 1 };
        let partitions: Vec<TopicPartition> = (0..3).map(|p| TopicPartition::new("orders", p)).collect();
        let verify = verify_call("payments", producer, &partitions);
        let codes = send(&mut connection, &verify).await.unwrap();
        let invalid = ResponseError::InvalidTxnState.code();
        assert_eq!(codes, vec![0, invalid, invalid]);
        assert!(verify.correlation > markers.correlation, "each request has a correlation id of its own");
        assert_eq!(error_of(0, ResponseError::CoordinatorNotAvailable), None);
        assert_eq!(
            error_of(-999, ResponseError::CoordinatorNotAvailable),
            Some(ResponseError::CoordinatorNotAvailable)
        );
    });
}

#[test]
fn a_hello_from_another_cluster_is_refused_with_a_closed_connection() {
    with_callee(|address| async move {
        match connect(&address, "another").await {
            Err(CallError::Unreachable(why)) => assert!(why.contains("refused the Hello"), "{why}"),
            other => panic!("{:?}", other.map(|_| ())),
        }
    });
}

#[test]
fn a_malformed_request_closes_the_connection_unanswered() {
    with_callee(|address| async move {
        let mut connection = connect(&address, "c").await.unwrap();
        // A frame whose CRC checks but whose body is no VerifyTxn archive.
        let call = Call {
            kind: kind::VERIFY_TXN,
            body: vec![0xAB; 40],
            answer_kind: kind::VERIFY_TXN_ANSWER,
            correlation: 1,
            items: 1,
        };
        match send(&mut connection, &call).await {
            Err(CallError::Unreachable(why)) => assert!(why.contains("closed"), "{why}"),
            other => panic!("a malformed request was answered: {other:?}"),
        }
    });
}

#[test]
fn an_oversized_frame_closes_the_connection_before_its_body_is_read() {
    with_callee(|address| async move {
        let mut connection = connect(&address, "c").await.unwrap();
        let mut header = encode_frame(kind::VERIFY_TXN, &[])[..HEADER_BYTES].to_vec();
        header[8..12].copy_from_slice(&(MAX_CALL_FRAME_BYTES + 1).to_be_bytes());
        let call = Call {
            kind: kind::VERIFY_TXN,
            body: Vec::new(),
            answer_kind: kind::VERIFY_TXN_ANSWER,
            correlation: 1,
            items: 0,
        };
        match exchange(&mut connection, &header, &call).await {
            Err(CallError::Unreachable(why)) => assert!(why.contains("closed"), "{why}"),
            other => panic!("an oversized frame was answered: {other:?}"),
        }
    });
}

#[test]
fn an_answer_to_another_request_is_refused() {
    with_callee(|address| async move {
        let mut connection = connect(&address, "c").await.unwrap();
        let mut call = markers_call(&[marker(0)]);
        let frame = encode_frame(call.kind, &call.body);
        call.correlation += 1;
        match exchange(&mut connection, &frame, &call).await {
            Err(CallError::Bad(why)) => assert!(why.contains("answer to request"), "{why}"),
            other => panic!("{other:?}"),
        }
        connection.stream.close().await.unwrap();
    });
}
