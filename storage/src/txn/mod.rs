//! The partition side of Kafka transactions (KIP-98): the control batches that end a transaction, and the
//! aborted-transactions index (`.txnindex`) kept beside each segment.
//!
//! What a partition must do, and where it is done:
//! - A transactional producer's batches (attribute bit 0x10) are judged like any idempotent producer's,
//!   and its first one after no open transaction opens one at its offset
//!   ([`crate::producer_state`] keeps, per producer id, that first offset and the last coordinator epoch).
//! - The transaction coordinator ends a transaction with a COMMIT or ABORT marker: a control batch (0x20)
//!   holding one record ([`marker`]). Only the log writes them, never a client's produce.
//! - An ABORT marker adds an entry to the aborted-transactions index of the segment holding it
//!   ([`index`]), so that a read_committed consumer learns which producers' records to drop.
//! - The last stable offset (LSO) is where read_committed reads stop: the high watermark, held back by the
//!   first offset of every open transaction and of every transaction whose marker is not yet below the
//!   high watermark; never below the log start (`PartitionLog::last_stable_offset`).
//!
//! This module does no I/O: it encodes and decodes bytes, and the log writes them.

pub mod index;
pub mod marker;

pub use index::{AbortedRange, AbortedTxn};
pub use marker::{MarkerKind, TxnMarker};
