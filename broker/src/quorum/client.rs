//! A blocking client of the quorum port, for tools and tests: write a command through a voter, or ask a
//! voter what it holds. (Brokers reach their embedded voter through [`super::service::Voter`].)

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use shardlog_net::peer::{PeerFrameReader, decode_message, encode_frame, encode_message};

use super::network::{CallError, MAX_FRAME_BYTES, WireWrite};
use super::state::Command;
use super::wire::{WireStatus, WireWriteResult, kind};

/// One connection to a voter's quorum port.
#[derive(Debug)]
pub struct QuorumClient {
    stream: TcpStream,
    reader: PeerFrameReader,
    buf: Vec<u8>,
}

impl QuorumClient {
    /// Connects to `addr`; every call then waits at most `timeout` for its answer.
    pub fn connect(addr: &str, timeout: Duration) -> Result<QuorumClient, CallError> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(QuorumClient { stream, reader: PeerFrameReader::new(MAX_FRAME_BYTES), buf: vec![0u8; 64 << 10] })
    }

    fn call(&mut self, request_kind: u16, body: &[u8], answer_kind: u16) -> Result<bytes::Bytes, CallError> {
        self.stream.write_all(&encode_frame(request_kind, body))?;
        let frame = loop {
            if let Some(frame) = self.reader.next_frame()? {
                break frame;
            }
            let n = self.stream.read(&mut self.buf)?;
            if n == 0 {
                return Err(CallError::Closed);
            }
            self.reader.extend(&self.buf[..n]);
        };
        match frame.kind {
            k if k == answer_kind => Ok(frame.body),
            kind::FAILED => Err(CallError::Refused(decode_message(&frame.body)?)),
            other => Err(CallError::Frame(shardlog_net::peer::PeerFrameError::UnexpectedType(other))),
        }
    }

    /// Commits `command` through this voter (it forwards to the leader) and returns how it applied.
    pub fn write(&mut self, command: Command) -> Result<WireWriteResult, CallError> {
        let body = encode_message(&WireWrite { command, forwarded: false });
        Ok(decode_message(&self.call(kind::WRITE, &body, kind::WRITE_RESULT)?)?)
    }

    /// What this voter holds.
    pub fn status(&mut self) -> Result<WireStatus, CallError> {
        Ok(decode_message(&self.call(kind::STATUS, &[], kind::STATUS_RESULT)?)?)
    }
}
