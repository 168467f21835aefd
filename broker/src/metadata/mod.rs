//! The broker's side of the cluster metadata: its link to the quorum ([`link`]), its copy of the state
//! ([`image`]), and applying that state to its shards ([`follow`]). Request handlers read the image the
//! follower last published; topic changes go to the quorum through the link.

pub mod follow;
pub mod image;
mod import;
pub mod link;
