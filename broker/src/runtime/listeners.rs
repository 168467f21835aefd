//! The Kafka listeners as the shards serve them: each bound once at start, its descriptor shared by every
//! shard, and for a TLS listener its certificates, loaded at start (a file that cannot be used stops the
//! start with the reason) and read again when they change.
//!
//! A listener is bound and listening from the start, without SO_REUSEPORT: a port another process listens
//! on stops the start with "address already in use" (two brokers sharing a port would each get a random
//! share of the clients), before anything else is done.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::config::BrokerConfig;
use crate::config::listeners::{BASE_SSL, Listener};
use crate::context::quotas::ConnectionRateLimit;
use crate::security::authenticate::{PlainLimiter, SaslListener};
use crate::security::sasl::SaslMechanism;
use crate::security::sasl::oauthbearer::{JwtValidator, OAuthBearerSettings};
use crate::security::tls::TlsListener;

/// A listener being served.
#[derive(Debug)]
pub(super) struct ServedListener {
    pub config: Listener,
    /// The address it is bound to (its port chosen by the system when configured as 0).
    pub addr: SocketAddr,
    /// Present for SSL and SASL_SSL listeners.
    pub tls: Option<Arc<TlsListener>>,
    /// Present for SASL_PLAINTEXT and SASL_SSL listeners.
    pub sasl: Option<Arc<SaslListener>>,
    /// The inter-broker listener: the one other brokers' replication connections come to (the address
    /// the broker registers). No other listener takes a peer frame.
    pub peers: bool,
    /// `listener.name.<name>.max.connection.creation.rate`, across the shards.
    pub connection_rate: Option<ConnectionRateLimit>,
}

/// Loads every listener's certificates and binds every listener, in the config's order; each comes with
/// one descriptor per shard.
pub(super) fn serve_listeners(
    config: &BrokerConfig,
    shards: usize,
) -> Result<Vec<(Arc<ServedListener>, Vec<OwnedFd>)>> {
    refuse_unused_settings(config)?;
    let validator = oauthbearer_validator(config)?;
    let plain_limiter = Arc::new(PlainLimiter::default());
    let mut out = Vec::with_capacity(config.listeners.all.len());
    for (index, listener) in config.listeners.all.iter().enumerate() {
        let tls = match listener.protocol.tls() {
            true => Some(Arc::new(
                TlsListener::load(listener)
                    .with_context(|| format!("listener {}: load its TLS files", listener.name))?,
            )),
            false => None,
        };
        let addr = listener
            .bind
            .socket_addr()
            .with_context(|| format!("resolve listener {} ({})", listener.name, listener.bind))?;
        let (addr, fds) = bind_listener(addr, shards).with_context(|| format!("listener {}", listener.name))?;
        let sasl = listener.protocol.sasl().then(|| {
            let mechanisms: Result<Vec<_>, _> =
                listener.sasl_mechanisms.iter().map(|m| SaslMechanism::from_name(m)).collect();
            Arc::new(SaslListener {
                mechanisms: mechanisms.expect("checked when the config was read"),
                oauthbearer: validator.clone().filter(|_| listener.sasl_mechanisms.iter().any(|m| m == "OAUTHBEARER")),
                failed_delay: Duration::from_millis(config.sasl.failed_authentication_delay_ms),
                max_session: Some(Duration::from_millis(config.sasl.max_reauth_ms)).filter(|d| !d.is_zero()),
                plain_limiter: plain_limiter.clone(),
            })
        });
        out.push((
            Arc::new(ServedListener {
                config: listener.clone(),
                addr,
                tls,
                sasl,
                peers: index == config.listeners.inter_broker,
                connection_rate: listener.max_connection_creation_rate.map(ConnectionRateLimit::new),
            }),
            fds,
        ));
    }
    Ok(out)
}

/// Hands each shard its descriptor of every listener.
pub(super) fn bind_listeners(
    served: Vec<(Arc<ServedListener>, Vec<OwnedFd>)>,
    shards: usize,
) -> Vec<Vec<(Arc<ServedListener>, OwnedFd)>> {
    let mut per_shard: Vec<Vec<(Arc<ServedListener>, OwnedFd)>> = (0..shards).map(|_| Vec::new()).collect();
    for (listener, fds) in served {
        for (shard, fd) in fds.into_iter().enumerate() {
            per_shard[shard].push((listener.clone(), fd));
        }
    }
    per_shard
}

/// Settings given for something no listener does would do nothing: the start stops and says so.
fn refuse_unused_settings(config: &BrokerConfig) -> Result<()> {
    let explicit = |keys: &dyn Fn(&str) -> bool| {
        config.effective.iter().filter(|s| s.explicit && keys(s.key)).map(|s| s.key).next()
    };
    let listeners = &config.listeners.all;
    if !listeners.iter().any(|l| l.protocol.tls())
        && let Some(setting) = explicit(&|key| BASE_SSL.contains(&key))
    {
        anyhow::bail!("{setting} is set, but no listener speaks SSL or SASL_SSL (listener.security.protocol.map)");
    }
    let sasl_keys = ["sasl.enabled.mechanisms", "sasl.server.max.receive.size", "connections.max.reauth.ms"];
    if !listeners.iter().any(|l| l.protocol.sasl())
        && let Some(setting) = explicit(&|key| sasl_keys.contains(&key))
    {
        anyhow::bail!(
            "{setting} is set, but no listener speaks SASL_PLAINTEXT or SASL_SSL (listener.security.protocol.map)"
        );
    }
    if !config.authorization.enabled
        && let Some(setting) = explicit(&|key| key == "super.users" || key == "allow.everyone.if.no.acl.found")
    {
        anyhow::bail!("{setting} is set, but authorizer.class.name is not: nothing is authorized");
    }
    if !listeners.iter().any(|l| l.sasl_mechanisms.iter().any(|m| m == "OAUTHBEARER"))
        && let Some(setting) = explicit(&|key| key.starts_with("sasl.oauthbearer."))
    {
        anyhow::bail!("{setting} is set, but no listener enables OAUTHBEARER (sasl.enabled.mechanisms)");
    }
    Ok(())
}

/// The OAUTHBEARER token check, when a listener enables it: its JWKS file is read now, so a missing or
/// unusable one stops the start with the reason.
fn oauthbearer_validator(config: &BrokerConfig) -> Result<Option<Arc<JwtValidator>>> {
    let wanted = config.listeners.all.iter().any(|l| l.sasl_mechanisms.iter().any(|m| m == "OAUTHBEARER"));
    let oauth = &config.sasl.oauthbearer;
    let Some(url) = oauth.jwks_endpoint_url.clone().filter(|_| wanted) else { return Ok(None) };
    let settings = OAuthBearerSettings {
        jwks_endpoint_url: url,
        expected_issuer: oauth.expected_issuer.clone(),
        expected_audience: oauth.expected_audience.clone(),
        sub_claim_name: oauth.sub_claim_name.clone(),
        clock_skew_seconds: oauth.clock_skew_seconds,
    };
    let validator = JwtValidator::new(settings).context("OAUTHBEARER: sasl.oauthbearer.jwks.endpoint.url")?;
    Ok(Some(Arc::new(validator)))
}

/// How long a start waits for a port in use to be released before it gives up.
const PORT_RELEASE_WAIT: Duration = Duration::from_secs(5);

/// Connections the kernel queues for the shards to accept.
const LISTEN_BACKLOG: i32 = 1024;

/// Binds the Kafka listener and listens (SO_REUSEADDR, so a restart is not held up by connections of the
/// previous process in TIME_WAIT, but not SO_REUSEPORT) and returns one descriptor of it per shard. It is
/// non-blocking: the descriptors share its file status flags, and glommio's accept sets and restores
/// O_NONBLOCK around a direct accept(2), which on a blocking socket could block a shard.
///
/// A port still held for a moment after its process died is waited for, up to [`PORT_RELEASE_WAIT`]:
/// after kill -9 under load, the kernel tears the dead broker's io_uring rings down only once their
/// direct writes complete, and a pending accept keeps its listening socket open until then.
fn bind_listener(addr: SocketAddr, shards: usize) -> Result<(SocketAddr, Vec<OwnedFd>)> {
    use socket2::{Domain, Protocol, Socket, Type};
    let in_use = || format!("listen on {addr}");
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).with_context(in_use)?;
    socket.set_reuse_address(true).with_context(in_use)?;
    socket.set_nonblocking(true).with_context(in_use)?;
    let deadline = std::time::Instant::now() + PORT_RELEASE_WAIT;
    let mut told = false;
    loop {
        match socket.bind(&addr.into()) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && std::time::Instant::now() < deadline => {
                if !std::mem::replace(&mut told, true) {
                    tracing::info!(%addr, "the port is in use; waiting a few seconds in case a previous process still holds it");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e).with_context(in_use),
        }
    }
    // Listening at once: two sockets with SO_REUSEADDR may both bind while neither listens, so only a
    // listening socket keeps the port from a second process.
    socket.listen(LISTEN_BACKLOG).with_context(in_use)?;
    let bound = socket.local_addr().ok().and_then(|a| a.as_socket()).unwrap_or(addr);
    let first = OwnedFd::from(socket);
    let mut out = Vec::with_capacity(shards);
    for _ in 1..shards {
        out.push(first.try_clone().with_context(in_use)?);
    }
    out.push(first);
    Ok((bound, out))
}
