//! Security: who a client or peer is, and what it may do. Each part is a room of its own:
//!
//! - [`tls`]: TLS listeners (rustls), their certificates and reloading them;
//! - [`cluster_tls`]: mutual TLS among brokers and quorum voters, bound to node ids;
//! - [`sasl`]: the SASL mechanisms, as pure code;
//! - [`authenticate`]: a connection's SASL exchange, driving the mechanisms;
//! - [`authorizer`]: ACLs and Kafka's authorization decisions, and the rules every request passes;
//! - [`principal`]: the principal a connection authenticated as;
//! - [`session`]: what the request handlers know of the client behind a request;
//! - [`quotas`]: which client quota applies to a request, and how long to throttle it.
//!
//! Every connection passes through here once, at the edge (`crate::runtime`): the handlers never
//! authenticate anyone themselves.

pub mod authenticate;
pub mod authorizer;
pub mod cluster_tls;
pub mod principal;
pub mod quotas;
pub mod reload;
pub mod sasl;
pub mod session;
pub mod tls;
