//! Security: who a client or peer is, and what it may do. Each part is a room of its own below.

pub mod sasl;
