//! What a request's handler knows of the client that sent it: its address, the listener it connected
//! through (Metadata answers with that listener's addresses) and the principal it authenticated as.

use std::sync::Arc;

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
    /// A group member's host as Kafka shows it: `/IP`.
    pub fn member_host(&self) -> String {
        format!("/{}", self.peer.rsplit_once(':').map_or(&*self.peer, |(ip, _)| ip))
    }
}
