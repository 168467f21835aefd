//! One client connection: frames in, responses out, in request order, with pipelined requests served
//! at once.
//!
//! Two halves run side by side. The reader decodes each frame, starts its handler as a task of its own,
//! and queues the task; the writer takes tasks off the queue in order and writes each answer when it is
//! ready. So a client that pipelines produce requests gets them appended in order and made durable by
//! shared fdatasyncs, and a slow request (a long-polling fetch) does not stop later ones from starting.
//! The queue is bounded in requests and in bytes, so one connection cannot hold unbounded memory.
//!
//! Produce requests are dispatched to the owning shards by the reader itself, before the next frame is
//! decoded: that is what keeps a connection's appends to one partition in request order. A produce
//! request with transactional batches is first verified with the transaction coordinator (KIP-890,
//! [`handlers::verify_transactional`], bounded in time), by the reader too, so the order holds for it. Requests that
//! change topics or offsets (CreateTopics, DeleteRecords, ...) and those that read offsets a pipelined
//! produce may move (ListOffsets, OffsetForLeaderEpoch) are not pipelined: each waits for every request
//! before it to be answered, and the requests after it wait for its answer, as Kafka serves a connection.
//!
//! The byte budget counts each request's frame and, for a Fetch, the answer it may bring back, so a
//! client that pipelines fetches and stops reading holds at most one fetch answer.
//!
//! Every frame also takes its bytes from the broker-wide request budget (`queued.max.request.bytes`,
//! see [`super::limits`]) as soon as its length has arrived, before its body is read, and gives them back
//! when its handler has answered. A frame must arrive whole within `socket.request.timeout.ms` of the
//! moment it may be read, and a connection with nothing in hand and nothing moving for
//! `connections.max.idle.ms` is closed: a client cannot hold the broker's memory or a connection by
//! sending slowly or not at all.
//!
//! Client quotas (KIP-13, KIP-124, KIP-219) are applied here too: a Produce request's bytes, a Fetch
//! answer's, and every request's handler time on the shard thread (the time spent polling its handler)
//! are counted against the client's budgets ([`crate::context::Quotas`]); when that takes it above a
//! quota the answer is sent at once with `throttle_time_ms`, and the connection is muted: the reader
//! takes no further request from it until the throttle time has passed. A Fetch throttled for its bytes
//! is answered empty, and its bytes are not counted, as in Kafka.
//!
//! Bad input closes the connection with one log line; nothing a client sends can panic the shard.

use std::cell::Cell;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, future};
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::net::TcpStream;
use glommio::sync::{Semaphore, StaticPermit};
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use shardlog_net::kafka::{DecodedRequest, FrameReader, RequestError, ResponseFrame, decode_request, encode_response};

use super::ServedListener;
use super::authentication;
use super::limits::{BudgetPermit, Clients, ConnectionSlot};
use super::throttling::{self, Mute, quotas_of, throttle_connection, throttle_fetch, throttle_request_time};
use crate::context::BrokerContext;
use crate::handlers;
use crate::security::authenticate::{SaslListener, SaslSession};
use crate::security::authorizer::rules::{Gate, Merge, authorize_request};
use crate::security::principal::Principal;
use crate::security::quotas::QuotaKind;
use crate::security::session::ClientInfo;
use crate::shutdown::Shutdown;

/// A connection reads into a buffer of this size at first ...
const FIRST_READ_BYTES: usize = 4 << 10;
/// ... and grows it, each time a read fills it, up to this: an idle or trickling connection holds 4 KiB,
/// a busy one reads 64 KiB at a time.
const READ_CHUNK_BYTES: usize = 64 << 10;
/// How long answers already being written may take once the broker is stopping.
const WRITE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a closing connection keeps reading (and dropping) what the peer still sends.
const LINGER: std::time::Duration = std::time::Duration::from_secs(1);
/// The most requests one connection has started and not yet answered.
const MAX_IN_FLIGHT_REQUESTS: usize = 32;
/// The most request bytes one connection holds in flight (a larger single request is still admitted
/// alone).
const MAX_IN_FLIGHT_BYTES: u64 = 64 << 20;

/// What to do after a frame's answer is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    Continue,
    Close,
}

/// An answer on its way: the response frame (none for acks=0 produce) and what comes after it.
pub(super) type Answer = (Option<ResponseFrame>, Next);

/// A request in the queue, in arrival order.
enum Pending {
    /// A handler running as its own task; the permit holds the request's share of the byte budget.
    Running(oneshot::Receiver<Answer>, StaticPermit),
    /// Known without running anything (a refusal).
    Ready(Answer),
}

/// What the reader, the writer and the watch share about the connection's progress.
#[derive(Debug)]
struct Activity {
    /// When bytes last moved either way.
    last_moved: Cell<Instant>,
    /// Requests taken in and not yet answered on the wire.
    in_hand: Cell<usize>,
    /// When the frame being received must be whole; `None` between frames and while a frame waits for
    /// its share of the request budget (the client is not to blame for that).
    frame_due: Cell<Option<Instant>>,
    /// A frame has started to arrive (it may be waiting for the budget).
    receiving: Cell<bool>,
    /// Since when the writer has been waiting for the client to take the next piece of an answer.
    writing_since: Cell<Option<Instant>>,
}

impl Activity {
    fn new() -> Self {
        Activity {
            last_moved: Cell::new(Instant::now()),
            in_hand: Cell::new(0),
            frame_due: Cell::new(None),
            receiving: Cell::new(false),
            writing_since: Cell::new(None),
        }
    }

    fn moved(&self) {
        self.last_moved.set(Instant::now());
    }
}

/// Serves one connection accepted on `listener`; `slot` is its place in the connection limits, held
/// while it lives.
pub(super) async fn serve(
    stream: TcpStream,
    listener: Arc<ServedListener>,
    ctx: Arc<BrokerContext>,
    clients: Arc<Clients>,
    shutdown: Shutdown,
    slot: ConnectionSlot,
) {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "unknown".into());
    // Another broker's replication or peer-calls connection, on the inter-broker listener, starts with a
    // peer frame (told apart by its type: a calls Hello is served here, see `peer_calls`),
    // sent as soon as it connects; a Kafka client's with a size. The first bytes are looked at without
    // reading them (and without giving the connection a receive buffer of its own), for a short while:
    // what says nothing by then is a Kafka client, served as one. Other listeners take Kafka clients only:
    // a peer frame there is a Kafka frame of an impossible size, and closes the connection.
    //
    // Under cluster mTLS a follower starts with a TLS ClientHello instead, whose ALPN names the leader
    // shard it is for: read from a copy, the socket untouched, and the connection handed to that shard
    // for the handshake (a caller's ALPN names the calls, served on this shard). A Kafka client's ClientHello (on a TLS inter-broker listener) names no such
    // protocol, and the connection goes on as a Kafka client's.
    if listener.peers
        && let Some(first) = peek_first_bytes(stream.as_raw_fd()).await
    {
        if super::replication::is_peer(&first) {
            if super::peer_calls::starts_with_calls_hello(stream.as_raw_fd()).await {
                // Boxed, as below: a peer-calls connection's future is not carried by every connection's.
                return Box::pin(super::peer_calls::accept_plain(stream, ctx, peer, Box::new(slot))).await;
            }
            return super::replication::accept_peer(stream, ctx, peer, Box::new(slot)).await;
        }
        if ctx.cluster_tls.is_some() && super::replication::is_tls_record(&first) {
            use super::replication::PeerService;
            match super::replication::peek_peer_service(stream.as_raw_fd()).await {
                Some(PeerService::Replication { shard }) => {
                    return super::replication::accept_peer_tls(stream, ctx, peer, Box::new(slot), shard);
                }
                Some(PeerService::Calls) => {
                    return Box::pin(super::peer_calls::accept_tls(stream, ctx, peer, Box::new(slot))).await;
                }
                None => {}
            }
        }
    }
    let fd = stream.as_raw_fd();
    let name: Arc<str> = Arc::from(listener.config.name.as_str());
    let Some(tls) = &listener.tls else {
        let client = ClientInfo { peer: Arc::from(peer), listener: name, principal: Principal::anonymous() };
        return serve_kafka(stream, fd, client, listener.sasl.clone(), ctx, clients, shutdown).await;
    };
    // The handshake must be done within socket.request.timeout.ms, as a request must arrive: a client
    // cannot hold a connection by starting one and saying nothing more.
    let acceptor = futures_rustls::TlsAcceptor::from(tls.config());
    let handshake = future::or(async { Some(acceptor.accept(stream).await) }, async {
        future::or(glommio::timer::sleep(clients.frame_limit()), shutdown.wait()).await;
        None
    })
    .await;
    let stream = match handshake {
        Some(Ok(stream)) => stream,
        Some(Err(e)) => {
            tracing::info!(%peer, listener = %name, error = %e, "closing connection: TLS handshake failed");
            return;
        }
        None => {
            tracing::info!(%peer, listener = %name, "closing connection: no TLS handshake within socket.request.timeout.ms");
            return;
        }
    };
    // On SASL_SSL the principal is the one SASL proves; a client certificate only gets it through.
    let principal = match tls.principal(stream.get_ref().1.peer_certificates()) {
        Ok(principal) => principal,
        Err(e) => {
            tracing::info!(%peer, listener = %name, error = %e, "closing connection: no principal for its certificate");
            return;
        }
    };
    let client = ClientInfo { peer: Arc::from(peer), listener: name, principal };
    serve_kafka(stream, fd, client, listener.sasl.clone(), ctx, clients, shutdown).await;
}

/// Serves Kafka requests on a connection, plain or TLS (`fd` is its socket).
async fn serve_kafka<S>(
    stream: S,
    fd: RawFd,
    client: ClientInfo,
    sasl: Option<Arc<SaslListener>>,
    ctx: Arc<BrokerContext>,
    clients: Arc<Clients>,
    shutdown: Shutdown,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut reader, writer) = futures_lite::io::split(stream);
    let (queue, answers) = local_channel::new_bounded(MAX_IN_FLIGHT_REQUESTS);
    let activity = Activity::new();
    let mute: Mute = Rc::new(Cell::new(None));
    let peer = client.peer.clone();
    // The reader ends at end of stream, a bad frame or shutdown, dropping its end of the queue; the writer
    // then writes what is queued and ends. A writer that ends first (a lost peer) ends the reader too, and
    // so does the watch when the client is too slow or idle too long.
    let reading = async {
        let sasl = sasl.map(SaslSession::new);
        read_requests(&mut reader, queue, &ctx, &clients, &activity, &shutdown, client.clone(), sasl, mute).await;
        future::pending::<()>().await
    };
    let watching = watch(&activity, &clients, &peer);
    future::or(write_answers(writer, answers, &activity, &shutdown, &peer), future::or(reading, watching)).await;
    linger(fd, &mut reader, &shutdown).await;
}

/// Returns when the connection must be closed: a frame late past `socket.request.timeout.ms`, or nothing
/// in hand and nothing moving for `connections.max.idle.ms`.
async fn watch(activity: &Activity, clients: &Clients, peer: &str) {
    let (frame_limit, idle_limit) = (clients.frame_limit(), clients.idle_limit());
    let tick = (frame_limit.min(idle_limit) / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        glommio::timer::sleep(tick).await;
        let now = Instant::now();
        if activity.frame_due.get().is_some_and(|due| now >= due) {
            tracing::warn!(
                %peer,
                limit_ms = frame_limit.as_millis() as u64,
                "closing connection: a request did not arrive whole within socket.request.timeout.ms"
            );
            return;
        }
        if activity.writing_since.get().is_some_and(|since| now.duration_since(since) >= frame_limit) {
            // It holds its answers, and the request budget they came with, without reading them.
            tracing::warn!(
                %peer,
                limit_ms = frame_limit.as_millis() as u64,
                "closing connection: the client took no answer bytes for socket.request.timeout.ms"
            );
            return;
        }
        let idle = activity.in_hand.get() == 0 && !activity.receiving.get();
        if idle && now.duration_since(activity.last_moved.get()) >= idle_limit {
            tracing::debug!(%peer, "closing connection: idle for connections.max.idle.ms");
            return;
        }
    }
}

/// Closes the way a careful server does: end of stream first, then whatever the peer still sends is read
/// and dropped, for at most `LINGER`. Closing a socket with unread bytes makes the kernel answer with a
/// reset, which destroys the answers still on their way to the client (those to the requests before a
/// bad frame, say).
async fn linger<S: AsyncRead + Unpin>(fd: RawFd, reader: &mut futures_lite::io::ReadHalf<S>, shutdown: &Shutdown) {
    // SAFETY: `fd` belongs to the stream, which both halves keep open until this function returns;
    // shutdown(2) only changes the connection's state.
    unsafe { libc::shutdown(fd, libc::SHUT_WR) };
    let mut buf = [0u8; 4096];
    let drain = async {
        while let Ok(n) = reader.read(&mut buf).await
            && n > 0
        {}
    };
    let give_up = async {
        future::or(glommio::timer::sleep(LINGER), shutdown.wait()).await;
    };
    future::or(drain, give_up).await;
}

#[allow(clippy::too_many_arguments)]
async fn read_requests<S: AsyncRead + Unpin>(
    stream: &mut futures_lite::io::ReadHalf<S>,
    queue: LocalSender<Pending>,
    ctx: &Arc<BrokerContext>,
    clients: &Clients,
    activity: &Activity,
    shutdown: &Shutdown,
    mut client: ClientInfo,
    mut sasl: Option<SaslSession>,
    mute: Mute,
) {
    let peer = client.peer.clone();
    let peer = &*peer;
    let budget = Rc::new(Semaphore::new(MAX_IN_FLIGHT_BYTES));
    let mut reader = FrameReader::new(ctx.config.socket_request_max_bytes);
    if sasl.is_some() {
        reader.set_limit(ctx.config.sasl.max_receive_bytes, "sasl.server.max.receive.size");
    }
    let mut buf = vec![0u8; FIRST_READ_BYTES];
    // The frame being received's share of the broker's request budget, once it has one.
    let mut held: Option<BudgetPermit> = None;
    loop {
        loop {
            if !wait_unmuted(&mute, activity, clients, shutdown).await {
                return;
            }
            let frame = match reader.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "closing connection: bad frame");
                    return;
                }
            };
            // What follows the frame is the start of the next one, due in its own time.
            let more = reader.buffered() > 0;
            activity.receiving.set(more);
            // The waits below are the broker's, not the client's: the rest of the next frame is due
            // counting from the next read.
            activity.frame_due.set(None);
            let frame_bytes = frame.len();
            let received = Instant::now();
            // A frame that came whole in one read takes its share now (a read is at most 64 KiB).
            let shared = match held.take() {
                Some(permit) => permit,
                None => match until_shutdown(clients.budget.acquire(frame_bytes), shutdown).await {
                    Some(permit) => permit,
                    None => return,
                },
            };
            let decoded = match &mut sasl {
                Some(session) => authentication::gate(session, ctx, frame, &mut client, &mut reader).await,
                None => decode(ctx, frame, peer),
            };
            let pending = match decoded {
                Ok(request) => {
                    let units = budget_units(&request, frame_bytes);
                    let Ok(permit) = budget.clone().acquire_static_permit(units).await else { return };
                    // Boxed: a Produce's verification may hold a peer call, too large a future for
                    // the shard's stack to carry inside every connection's reader.
                    Box::pin(start(ctx, request, &client, (permit, shared), frame_bytes, received, &mute)).await
                }
                Err(answer) => Pending::Ready(answer),
            };
            let last = matches!(pending, Pending::Ready((_, Next::Close)));
            activity.in_hand.set(activity.in_hand.get() + 1);
            if queue.send(pending).await.is_err() || last {
                return;
            }
        }
        if shutdown.is_triggered() {
            return;
        }
        // A frame whose length has arrived is read only once its bytes fit in the broker's budget, and
        // its time to arrive counts from then.
        if held.is_none()
            && let Some(size) = reader.announced()
        {
            activity.frame_due.set(None);
            match until_shutdown(clients.budget.acquire(size), shutdown).await {
                Some(permit) => held = Some(permit),
                None => return,
            }
            activity.frame_due.set(Some(Instant::now() + clients.frame_limit()));
        }
        if reader.buffered() > 0 && activity.frame_due.get().is_none() {
            activity.frame_due.set(Some(Instant::now() + clients.frame_limit()));
        }
        // The rest of a large frame is read straight into its own buffer; anything else through `buf`.
        // Either way a read takes at most READ_CHUNK_BYTES, so the shard's other work goes on between them.
        let read = match reader.large_frame_space() {
            Some(space) => {
                let len = space.len().min(READ_CHUNK_BYTES);
                let space = &mut space[..len];
                until_shutdown(stream.read(space), shutdown).await.map(|r| r.map(|n| (n, true)))
            }
            None => until_shutdown(stream.read(&mut buf), shutdown).await.map(|r| r.map(|n| (n, false))),
        };
        match read {
            None => return,
            Some(Ok((0, _))) => {
                if reader.buffered() > 0 {
                    tracing::warn!(%peer, bytes = reader.buffered(), "closing connection: it ended inside a frame");
                }
                return;
            }
            Some(Ok((n, in_place))) => {
                activity.moved();
                if !activity.receiving.replace(true) {
                    activity.frame_due.set(Some(Instant::now() + clients.frame_limit()));
                }
                if in_place {
                    reader.large_frame_filled(n);
                } else {
                    reader.extend(&buf[..n]);
                    if n == buf.len() && n < READ_CHUNK_BYTES {
                        buf.resize(n * 4, 0);
                    }
                }
            }
            Some(Err(e)) => {
                tracing::debug!(%peer, error = %e, "connection lost while reading");
                return;
            }
        }
    }
}

/// Waits out the connection's quota throttle, if it is muted; false once the broker is stopping. The wait
/// is the broker's, not the client's: a frame being received gets its full time to arrive after it.
async fn wait_unmuted(mute: &Mute, activity: &Activity, clients: &Clients, shutdown: &Shutdown) -> bool {
    while let Some(until) = mute.get() {
        let Some(left) = until.checked_duration_since(Instant::now()) else {
            mute.set(None);
            break;
        };
        let due = activity.frame_due.replace(None);
        if until_shutdown(glommio::timer::sleep(left), shutdown).await.is_none() {
            return false;
        }
        activity.moved();
        if due.is_some() {
            activity.frame_due.set(Some(Instant::now() + clients.frame_limit()));
        }
    }
    true
}

/// Runs `work`, measuring the time spent polling it: the shard thread's time on it, not the time it
/// waited.
async fn timed<T>(work: impl Future<Output = T>) -> (T, Duration) {
    let mut work = std::pin::pin!(work);
    let mut spent = Duration::ZERO;
    let output = std::future::poll_fn(|cx| {
        let began = Instant::now();
        let poll = work.as_mut().poll(cx);
        spent += began.elapsed();
        poll
    })
    .await;
    (output, spent)
}

/// `work`'s outcome, or `None` once the broker is stopping.
async fn until_shutdown<T>(work: impl Future<Output = T>, shutdown: &Shutdown) -> Option<T> {
    future::or(async { Some(work.await) }, async {
        shutdown.wait().await;
        None
    })
    .await
}

async fn write_answers<S: AsyncWrite + Unpin>(
    mut stream: futures_lite::io::WriteHalf<S>,
    answers: LocalReceiver<Pending>,
    activity: &Activity,
    shutdown: &Shutdown,
    peer: &str,
) {
    while let Some(pending) = answers.recv().await {
        // The permit (the request's share of the byte budget) is held until its answer is written.
        let ((reply, next), _permit) = match pending {
            // A handler that ended without an answer (it panicked) leaves the connection unusable.
            Pending::Running(answer, permit) => (answer.await.unwrap_or((None, Next::Close)), Some(permit)),
            Pending::Ready(answer) => (answer, None),
        };
        if let Some(bytes) = reply {
            // A client that stops reading must not hold the broker's shutdown hostage; answers already on
            // their way get a grace period to be written.
            let written = future::or(async { Some(write_in_pieces(&mut stream, &bytes, activity).await) }, async {
                shutdown.wait().await;
                glommio::timer::sleep(WRITE_GRACE).await;
                None
            })
            .await;
            match written {
                Some(Ok(())) => activity.moved(),
                Some(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "connection lost while writing");
                    return;
                }
                None => return,
            }
        }
        activity.in_hand.set(activity.in_hand.get() - 1);
        if next == Next::Close {
            return;
        }
    }
}

/// Writes an answer's pieces (a Fetch answer's record sets are pieces of their own, written from where the
/// log read them), each a megabyte at a time, so the watch can tell a client that takes it slowly from one
/// that takes none of it.
async fn write_in_pieces<S: AsyncWrite + Unpin>(
    stream: &mut futures_lite::io::WriteHalf<S>,
    frame: &ResponseFrame,
    activity: &Activity,
) -> std::io::Result<()> {
    const STEP_BYTES: usize = 1 << 20;
    for step in frame.pieces().iter().flat_map(|piece| piece.chunks(STEP_BYTES)) {
        activity.writing_since.set(Some(Instant::now()));
        let written = stream.write_all(step).await;
        activity.writing_since.set(None);
        written?;
        activity.moved();
    }
    Ok(())
}

/// Decodes a frame; a frame that is not a request we serve is answered (or closes the connection) here.
pub(super) fn decode(ctx: &Arc<BrokerContext>, frame: bytes::Bytes, peer: &str) -> Result<DecodedRequest, Answer> {
    match decode_request(frame, &ctx.apis) {
        Ok(request) => Ok(request),
        // KIP-511: the client learns our versions from this answer and asks again on this connection.
        Err(e @ RequestError::UnsupportedVersion { .. }) if e.response(&ctx.apis).is_some() => {
            tracing::info!(%peer, error = %e, "answered with the supported versions");
            Err((e.response(&ctx.apis), Next::Continue))
        }
        Err(e) => {
            tracing::warn!(%peer, error = %e, "closing connection: bad request");
            Err((None, Next::Close))
        }
    }
}

/// A request's share of the connection's byte budget: its frame, plus the answer a Fetch may bring;
/// all of it for a request that must not be pipelined (see the module documentation).
fn budget_units(request: &DecodedRequest, frame_bytes: usize) -> u64 {
    let answer_bytes = match &request.body {
        RequestKind::Fetch(fetch) if fetch.max_bytes > 0 => (fetch.max_bytes as usize).min(handlers::FETCH_MAX_BYTES),
        RequestKind::Fetch(_) => handlers::FETCH_MAX_BYTES,
        RequestKind::Produce(_)
        | RequestKind::Metadata(_)
        | RequestKind::ApiVersions(_)
        | RequestKind::DescribeConfigs(_)
        | RequestKind::DescribeCluster(_) => 0,
        _ => return MAX_IN_FLIGHT_BYTES,
    };
    ((frame_bytes + answer_bytes) as u64).clamp(1, MAX_IN_FLIGHT_BYTES)
}

/// Starts answering a request of `frame_bytes`. `shared`, the frame's share of the broker's request
/// budget, is given back when the handler has its answer; `permit` holds its share of the connection's.
async fn start(
    ctx: &Arc<BrokerContext>,
    request: DecodedRequest,
    client: &ClientInfo,
    (permit, shared): (StaticPermit, BudgetPermit),
    frame_bytes: usize,
    received: Instant,
    mute: &Mute,
) -> Pending {
    let (api_key, version, correlation_id) = (request.api_key, request.version, request.header.correlation_id);
    let acks_zero = matches!(&request.body, RequestKind::Produce(p) if p.acks == 0);
    let (quota, request_quota) = quotas_of(ctx, &request, client);
    let (mut request, merge) = match authorize(ctx, request, client) {
        Ok(allowed) => allowed,
        Err(answer) => return Pending::Ready(answer),
    };
    // A Produce request counts its bytes at once (an acks=0 one has no answer: it is only muted); a Fetch
    // answer may bring at most what its quota allows after a quiet spell, as Kafka caps it.
    let mut produce_throttle = Duration::ZERO;
    match (&quota, &mut request.body) {
        (Some(applied), RequestKind::Produce(_)) => {
            produce_throttle = ctx.quotas.record(applied, frame_bytes as f64);
            throttle_connection(mute, QuotaKind::Produce, produce_throttle);
        }
        (Some(applied), RequestKind::Fetch(fetch)) => {
            let most = ctx.quotas.window().most_at_once(applied.limit).clamp(1.0, i32::MAX as f64) as i32;
            fetch.max_bytes = if fetch.max_bytes <= 0 { most } else { fetch.max_bytes.min(most) };
        }
        _ => {}
    }
    let fetch_quota = quota.filter(|q| q.budget.kind == QuotaKind::Fetch).map(|q| (q, mute.clone()));
    // An acks=0 produce gets no answer: when some of it was denied, Kafka closes the connection.
    let next = if acks_zero && merge.has_denials() { Next::Close } else { Next::Continue };
    let slow = SlowRequest::new(ctx.config.clients.slow_request_ms, &request.body, received);
    let (ctx, client) = (ctx.clone(), client.clone());
    let peer = client.peer.clone();
    let answer = match request.body {
        // Dispatched here, before the next frame is read, so appends keep the connection's order. A
        // request with transactional batches is verified with their coordinator first (KIP-890), also
        // before the next frame is read: the wait is bounded, and the order kept.
        RequestKind::Produce(req) => {
            let verdicts = Box::pin(handlers::verify_transactional(&ctx, &req, version)).await;
            let began = Instant::now();
            let produce = handlers::dispatch_produce(&ctx, req, &verdicts);
            let dispatch_time = began.elapsed();
            let mute = mute.clone();
            spawn_handler(async move {
                let (answer, spent) = timed(produce.answer()).await;
                let mut body = answer.map(|p| merge.finish(ResponseKind::Produce(p)));
                let request_throttle =
                    throttle_request_time(&ctx, request_quota.as_ref(), dispatch_time + spent, &mute);
                if let Some(body) = &mut body {
                    throttling::set(body, produce_throttle.max(request_throttle));
                }
                drop(shared);
                crate::metrics::observe_request(api_key, received.elapsed(), body.as_ref());
                let (frame, after) = encode(body, correlation_id, api_key, version, &peer);
                let answer = (frame, if after == Next::Close { after } else { next });
                slow.report(api_key, &peer, &answer);
                answer
            })
        }
        _ => {
            let mute = mute.clone();
            spawn_handler(async move {
                let (answer, spent) = timed(handlers::handle(&ctx, request, &client)).await;
                let mut body = answer.map(|b| merge.finish(b));
                if let (Some(body), Some((applied, mute))) = (&mut body, &fetch_quota) {
                    throttle_fetch(&ctx, applied, body, mute);
                }
                let request_throttle = throttle_request_time(&ctx, request_quota.as_ref(), spent, &mute);
                if let Some(body) = &mut body
                    && !request_throttle.is_zero()
                {
                    let bandwidth = throttling::of(body);
                    throttling::set(body, request_throttle.max(bandwidth));
                }
                drop(shared);
                crate::metrics::observe_request(api_key, received.elapsed(), body.as_ref());
                let answer = encode(body, correlation_id, api_key, version, &peer);
                slow.report(api_key, &peer, &answer);
                answer
            })
        }
    };
    Pending::Running(answer, permit)
}

/// Passes a request through the authorizer, when there is one (`authorizer.class.name`): the request to
/// handle (perhaps with denied items taken out) and what its answer owes them, or the answer already
/// given (a whole refusal, or the connection closing).
fn authorize(
    ctx: &BrokerContext,
    request: DecodedRequest,
    client: &ClientInfo,
) -> Result<(DecodedRequest, Merge), Answer> {
    let Some(authorization) = &ctx.authorization else { return Ok((request, Merge::nothing())) };
    let authorizer = authorization.authorizer(&ctx.image());
    let DecodedRequest { api_key, version, header, body } = request;
    match authorize_request(&client.request_context(), &authorizer, body, version) {
        Gate::Handle { request: body, merge } => Ok((DecodedRequest { api_key, version, header, body }, merge)),
        Gate::Answer(response) => Err(encode(Some(response), header.correlation_id, api_key, version, &client.peer)),
        Gate::Close => Err((None, Next::Close)),
    }
}

/// `log.slow.request.ms`: what is known of a request to say where its time went, if it was slow.
struct SlowRequest {
    threshold: Option<Duration>,
    received: Instant,
    /// When its handler began: before it, the request waited for the connection's and the broker's
    /// budget of bytes in flight.
    started: Instant,
    partitions: usize,
    /// A wait the request asked for (a Fetch's max.wait.ms), not counted as slowness.
    asked_wait: Duration,
}

impl SlowRequest {
    fn new(threshold_ms: u64, body: &RequestKind, received: Instant) -> SlowRequest {
        let (partitions, asked_wait, waits_for_group) = match body {
            RequestKind::Produce(r) => (r.topic_data.iter().map(|t| t.partition_data.len()).sum(), 0, false),
            RequestKind::Fetch(r) => {
                (r.topics.iter().map(|t| t.partitions.len()).sum(), r.max_wait_ms.clamp(0, 60_000) as u64, false)
            }
            RequestKind::ListOffsets(r) => (r.topics.iter().map(|t| t.partitions.len()).sum(), 0, false),
            RequestKind::OffsetCommit(r) => (r.topics.iter().map(|t| t.partitions.len()).sum(), 0, false),
            RequestKind::TxnOffsetCommit(r) => (r.topics.iter().map(|t| t.partitions.len()).sum(), 0, false),
            RequestKind::DeleteRecords(r) => (r.topics.iter().map(|t| t.partitions.len()).sum(), 0, false),
            RequestKind::JoinGroup(_) | RequestKind::SyncGroup(_) => (0, 0, true),
            _ => (0, 0, false),
        };
        SlowRequest {
            threshold: (!waits_for_group).then(|| Duration::from_millis(threshold_ms)),
            received,
            started: Instant::now(),
            partitions,
            asked_wait: Duration::from_millis(asked_wait),
        }
    }

    /// Logs the request if it took longer than the threshold (beyond the wait it asked for).
    fn report(&self, api: ApiKey, peer: &str, answer: &Answer) {
        let Some(threshold) = self.threshold else { return };
        let now = Instant::now();
        let total = now.duration_since(self.received);
        if total.saturating_sub(self.asked_wait) < threshold {
            return;
        }
        tracing::info!(
            api = ?api,
            %peer,
            partitions = self.partitions,
            total_us = total.as_micros() as u64,
            queued_us = self.started.duration_since(self.received).as_micros() as u64,
            handled_us = now.duration_since(self.started).as_micros() as u64,
            asked_wait_ms = self.asked_wait.as_millis() as u64,
            answer_bytes = answer.0.as_ref().map_or(0, ResponseFrame::len),
            "slow request"
        );
    }
}

/// Runs a handler as a task of its own; its answer comes back through the returned channel, and
/// dropping that (the connection ended) cancels the handler.
///
/// The task is detached rather than awaited through its glommio task handle: glommio 0.9 frees a
/// finished task twice when its handle is dropped while another thread drops the task's last waker
/// (a handler waits on replies from other shards and from the quorum link, whose channels hold its
/// waker on their threads). That race aborted the broker under load ("double free detected in tcache").
/// A detached task is freed only through its reference count, which the other threads' wakers share.
fn spawn_handler(handler: impl Future<Output = Answer> + 'static) -> oneshot::Receiver<Answer> {
    let (mut tx, rx) = oneshot::channel();
    glommio::spawn_local(async move {
        let answer = {
            let abandoned = tx.cancellation();
            future::or(async { Some(handler.await) }, async {
                abandoned.await;
                None
            })
            .await
        };
        if let Some(answer) = answer {
            let _ = tx.send(answer);
        }
    })
    .detach();
    rx
}

pub(super) fn encode(
    body: Option<ResponseKind>,
    correlation_id: i32,
    api_key: ApiKey,
    version: i16,
    peer: &str,
) -> Answer {
    // Produce with acks=0: Kafka sends nothing back.
    let Some(body) = body else { return (None, Next::Continue) };
    match encode_response(correlation_id, api_key, version, &body) {
        Ok(bytes) => (Some(bytes), Next::Continue),
        Err(e) => {
            tracing::error!(%peer, error = %e, "cannot encode a response; closing connection");
            (None, Next::Close)
        }
    }
}

/// The first bytes waiting on a new connection, if any arrive within a few milliseconds (a peer broker
/// sends its Hello right after connecting).
async fn peek_first_bytes(fd: RawFd) -> Option<Vec<u8>> {
    let mut first = [0u8; 4];
    for _ in 0..25 {
        // SAFETY: `fd` is the open socket of the stream the caller holds; MSG_PEEK leaves the bytes queued.
        let n = unsafe { libc::recv(fd, first.as_mut_ptr().cast(), first.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        if n > 0 {
            return Some(first[..n as usize].to_vec());
        }
        if n == 0 {
            return None;
        }
        glommio::timer::sleep(Duration::from_millis(2)).await;
    }
    None
}
