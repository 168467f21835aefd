//! What a request's handler knows of the client that sent it: its address, the listener it connected
//! through (Metadata answers with that listener's addresses) and the principal it authenticated as.

use std::sync::Arc;

use super::authorizer::RequestContext;
use super::principal::Principal;

#[derive(Debug, Clone)]
pub struct ClientInfo {
    /// `IP:PORT`.
    pub peer: Arc<str>,
    /// The listener's name, upper case.
    pub listener: Arc<str>,
    pub principal: Principal,
}

impl ClientInfo {
    /// The client's address without its port.
    pub fn ip(&self) -> std::net::IpAddr {
        self.peer.parse::<std::net::SocketAddr>().map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |a| a.ip())
    }

    /// Who is asking, for the authorizer.
    pub fn request_context(&self) -> RequestContext {
        RequestContext { principal: self.principal.to_string(), host: self.ip() }
    }

    /// A group member's host as Kafka shows it: `/IP`.
    pub fn member_host(&self) -> String {
        format!("/{}", self.peer.rsplit_once(':').map_or(&*self.peer, |(ip, _)| ip))
    }
}
