//! The caller's side: a few connections per callee on each shard, each carrying one call at a time.
//!
//! A call takes a kept connection to the callee (or opens one: TCP to the address the callee registered,
//! TLS under cluster mTLS naming the callee, then the Hello), writes its request, reads its one answer and
//! checks it answers this request. The connection goes back to the shard's pool only after a whole, good
//! exchange; any failure drops it. A call that fails on a kept connection (the callee may have closed it
//! while it was idle) is tried once more on a new one; one that got no answer in time is not, since its
//! callee may still be working on it. A callee that is down or silent costs a caller at most
//! [`SETUP_TIMEOUT`] to get a connection plus the call's wait for its answer, never more.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_lite::{AsyncRead, AsyncWrite, AsyncWriteExt};
use glommio::net::TcpStream;
use glommio::sync::Semaphore;
use shardlog_net::peer::calls::{CALLS_ALPN, CallsHello, CallsHelloAnswer, MAX_CALL_FRAME_BYTES, decode_answer, kind};
use shardlog_net::peer::{PeerFrameReader, decode_message, encode_frame, encode_message};

use super::super::replication::{ReadError, connect_tls, next_frame, within};
use super::{CONNECT_TIMEOUT, HELLO_WAIT, SETUP_TIMEOUT};
use crate::context::BrokerContext;
use crate::quorum::state::NodeId;

/// The most calls in flight from one shard to one callee (each on a connection of its own); as many idle
/// connections are kept.
const MAX_CONNECTIONS: u64 = 4;
/// A read's buffer.
const READ_BYTES: usize = 16 * 1024;

/// A request ready to send, and what its answer must be.
pub(super) struct Call {
    pub kind: u16,
    pub body: Vec<u8>,
    pub answer_kind: u16,
    pub correlation: u64,
    pub items: usize,
}

/// Why a call got no answer.
#[derive(Debug, thiserror::Error)]
pub(super) enum CallError {
    /// The callee could not be reached or went away: expected while brokers restart.
    #[error("{0}")]
    Unreachable(String),
    /// The callee answered with something that is not the protocol: an operator should know.
    #[error("bad answer: {0}")]
    Bad(String),
}

impl From<ReadError> for CallError {
    fn from(e: ReadError) -> CallError {
        match e {
            ReadError::Lost(e) => CallError::Unreachable(e.to_string()),
            ReadError::Bad(e) => CallError::Bad(e),
        }
    }
}

fn lost(e: std::io::Error) -> CallError {
    CallError::Unreachable(e.to_string())
}

pub(super) trait Stream: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> Stream for T {}

/// An open connection whose Hello was answered, idle between calls.
pub(super) struct Connection {
    pub(super) stream: Box<dyn Stream>,
    frames: PeerFrameReader,
    /// Where it goes: a connection to an address the callee no longer has is not used again.
    address: String,
}

/// This shard's connections to one callee.
struct Target {
    idle: RefCell<Vec<Connection>>,
    in_use: Semaphore,
}

thread_local! {
    /// Per shard (a shard is a thread): its connections, by callee.
    static TARGETS: RefCell<HashMap<NodeId, Rc<Target>>> = RefCell::new(HashMap::new());
    static CORRELATION: Cell<u64> = const { Cell::new(0) };
}

/// A correlation id not used before on this shard.
pub(super) fn next_correlation() -> u64 {
    CORRELATION.with(|c| {
        c.set(c.get() + 1);
        c.get()
    })
}

fn target(node: NodeId) -> Rc<Target> {
    TARGETS.with(|targets| {
        let mut targets = targets.borrow_mut();
        let target = targets.entry(node).or_insert_with(|| {
            Rc::new(Target { idle: RefCell::new(Vec::new()), in_use: Semaphore::new(MAX_CONNECTIONS) })
        });
        target.clone()
    })
}

/// The address `node` registered for brokers to reach it.
fn address_of(ctx: &BrokerContext, node: NodeId) -> Option<String> {
    let image = ctx.image();
    image.state.brokers.get(&node).map(|b| format!("{}:{}", b.endpoint.host, b.endpoint.port))
}

/// Sends `call` to `node` and returns its answer's error codes, one per item: within [`SETUP_TIMEOUT`] to
/// get a connection, then within `answer_wait` of sending the request.
pub(super) async fn call(
    ctx: &Arc<BrokerContext>,
    node: NodeId,
    call: &Call,
    answer_wait: Duration,
) -> Result<Vec<i16>, CallError> {
    let target = target(node);
    let ready = async {
        let permit =
            target.in_use.acquire_permit(1).await.map_err(|e| CallError::Unreachable(format!("pool closed: {e}")))?;
        let address = address_of(ctx, node).ok_or_else(|| CallError::Unreachable("not a registered broker".into()))?;
        let kept = {
            let mut idle = target.idle.borrow_mut();
            idle.retain(|c| c.address == address);
            idle.pop()
        };
        Ok((permit, address, kept))
    };
    let (_permit, address, kept) = within(SETUP_TIMEOUT, ready).await.unwrap_or_else(|| Err(no_connection()))?;
    let frame = encode_frame(call.kind, &call.body);
    let no_answer = || CallError::Unreachable("no answer in time".into());
    if let Some(mut connection) = kept {
        match within(answer_wait, exchange(&mut connection, &frame, call)).await {
            Some(Ok(errors)) => {
                keep(&target, connection);
                return Ok(errors);
            }
            Some(Err(e)) => tracing::trace!(?node, error = %e, "a kept peer-calls connection failed; trying a new one"),
            None => return Err(no_answer()),
        }
    }
    let mut connection =
        within(SETUP_TIMEOUT, connect(ctx, node, address)).await.unwrap_or_else(|| Err(no_connection()))?;
    let errors =
        within(answer_wait, exchange(&mut connection, &frame, call)).await.unwrap_or_else(|| Err(no_answer()))?;
    keep(&target, connection);
    Ok(errors)
}

fn no_connection() -> CallError {
    CallError::Unreachable("no connection in time".into())
}

/// Puts a connection back for the next call, if it is clean and the pool has room.
fn keep(target: &Target, connection: Connection) {
    let mut idle = target.idle.borrow_mut();
    if connection.frames.buffered() == 0 && (idle.len() as u64) < MAX_CONNECTIONS {
        idle.push(connection);
    }
}

/// A new connection to `node` at `address`, its Hello answered by `node` itself.
async fn connect(ctx: &BrokerContext, node: NodeId, address: String) -> Result<Connection, CallError> {
    let stream = match within(CONNECT_TIMEOUT, TcpStream::connect(address.as_str())).await {
        Some(Ok(stream)) => stream,
        Some(Err(e)) => return Err(CallError::Unreachable(format!("connect to {address}: {e}"))),
        None => return Err(CallError::Unreachable(format!("connect to {address} timed out"))),
    };
    let _ = stream.set_nodelay(true);
    let stream: Box<dyn Stream> = match ctx.cluster_tls.as_deref() {
        None => Box::new(stream),
        Some(tls) => match within(CONNECT_TIMEOUT, connect_tls(tls, stream, node, CALLS_ALPN.to_vec())).await {
            Some(Ok(stream)) => Box::new(stream),
            Some(Err(e)) => return Err(CallError::Unreachable(format!("TLS handshake with {address}: {e}"))),
            None => return Err(CallError::Unreachable(format!("TLS handshake with {address} timed out"))),
        },
    };
    let hello = CallsHello { cluster_id: ctx.cluster_id.clone(), broker: ctx.config.node_id };
    say_hello(stream, address, &hello, node).await
}

/// Says `hello` on a new connection to `node` and reads the answer, which must be `node`'s.
pub(super) async fn say_hello(
    stream: Box<dyn Stream>,
    address: String,
    hello: &CallsHello,
    node: NodeId,
) -> Result<Connection, CallError> {
    let mut connection = Connection { stream, frames: PeerFrameReader::new(MAX_CALL_FRAME_BYTES), address };
    let hello = encode_frame(kind::HELLO, &encode_message(hello));
    connection.stream.write_all(&hello).await.map_err(lost)?;
    connection.stream.flush().await.map_err(lost)?;
    let mut buf = vec![0u8; READ_BYTES];
    let read = next_frame(&mut connection.stream, &mut connection.frames, &mut buf);
    let frame = match within(HELLO_WAIT, read).await {
        Some(Ok(Some(frame))) if frame.kind == kind::HELLO_ANSWER => frame,
        Some(Ok(Some(frame))) => return Err(CallError::Bad(format!("frame type {} for a Hello", frame.kind))),
        Some(Ok(None)) => return Err(CallError::Unreachable("the callee refused the Hello".into())),
        Some(Err(e)) => return Err(e.into()),
        None => return Err(CallError::Unreachable("no answer to the Hello in time".into())),
    };
    let answer = decode_message::<CallsHelloAnswer>(&frame.body).map_err(|e| CallError::Bad(e.to_string()))?;
    if answer.broker != node.0 {
        let why = format!("broker {} answers at the address of broker {}", answer.broker, node.0);
        return Err(CallError::Unreachable(why));
    }
    Ok(connection)
}

/// One request and its answer on `connection`.
pub(super) async fn exchange(connection: &mut Connection, frame: &[u8], call: &Call) -> Result<Vec<i16>, CallError> {
    connection.stream.write_all(frame).await.map_err(lost)?;
    connection.stream.flush().await.map_err(lost)?;
    let mut buf = vec![0u8; READ_BYTES];
    match next_frame(&mut connection.stream, &mut connection.frames, &mut buf).await? {
        Some(answer) => decode_answer(&answer, call.answer_kind, call.correlation, call.items)
            .map_err(|e| CallError::Bad(e.to_string())),
        None => Err(CallError::Unreachable("closed by the callee".into())),
    }
}
