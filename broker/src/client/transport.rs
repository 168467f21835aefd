//! The byte stream under a [`super::Connection`]: a TCP socket, or TLS over one, split into a reading
//! half and a writing half that may run on two threads (pipelining).
//!
//! Over TLS both halves share one rustls `ClientConnection` behind a mutex, and each has its own clone of
//! the socket. The lock is never held across a blocking socket call:
//! - The reader reads raw bytes from its socket without the lock, then locks to feed them to rustls and
//!   take the plaintext out.
//! - The writer locks to encrypt its plaintext and take the TLS records out, then writes them to its
//!   socket after unlocking.
//!
//! Records must reach the socket in the order rustls made them, and both halves may have records to
//! send (the reader when rustls must answer a key update). So whoever takes records out holds the
//! `sending` mutex from before taking them until they are written; the order is always `sending`, then
//! the connection, never the other way round.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, MutexGuard};

use rustls::ClientConnection;

/// Raw bytes read from the socket per read.
const RAW_READ_BYTES: usize = 64 << 10;

/// What both TLS halves share.
pub(crate) struct Shared {
    tls: Mutex<ClientConnection>,
    /// Held while records are taken out of `tls` and written to the socket (the writing socket clone
    /// lives here, so holding it is the right to write).
    sending: Mutex<TcpStream>,
}

impl Shared {
    fn tls(&self) -> MutexGuard<'_, ClientConnection> {
        // A panic while holding it leaves rustls in an unknown state: the connection is unusable.
        self.tls.lock().expect("no panic while the TLS state is locked")
    }

    /// Writes out every record rustls has ready.
    fn flush_records(&self) -> io::Result<()> {
        let mut socket = self.sending.lock().expect("no panic while sending");
        let mut records = Vec::new();
        {
            let mut tls = self.tls();
            while tls.wants_write() {
                tls.write_tls(&mut records)?;
            }
        }
        socket.write_all(&records)
    }
}

/// The reading half.
pub(crate) enum ReadHalf {
    Plain(TcpStream),
    Tls { socket: TcpStream, shared: Arc<Shared>, raw: Vec<u8>, raw_start: usize },
}

/// The writing half.
pub(crate) enum WriteHalf {
    Plain(TcpStream),
    Tls { shared: Arc<Shared> },
}

impl std::fmt::Debug for ReadHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadHalf::Plain(s) => f.debug_tuple("Plain").field(s).finish(),
            ReadHalf::Tls { socket, .. } => f.debug_tuple("Tls").field(socket).finish(),
        }
    }
}

impl std::fmt::Debug for WriteHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WriteHalf::Plain(_) => "Plain",
            WriteHalf::Tls { .. } => "Tls",
        })
    }
}

/// Splits a plain socket.
pub(crate) fn plain(socket: TcpStream) -> io::Result<(ReadHalf, WriteHalf)> {
    Ok((ReadHalf::Plain(socket.try_clone()?), WriteHalf::Plain(socket)))
}

/// Runs the TLS handshake on `socket` (blocking, within its read timeout), then splits it.
pub(crate) fn tls(mut socket: TcpStream, mut tls: ClientConnection) -> io::Result<(ReadHalf, WriteHalf)> {
    // Requests are bounded by the caller; rustls' default limit would make a large one fail half written.
    tls.set_buffer_limit(None);
    while tls.is_handshaking() {
        tls.complete_io(&mut socket)?;
    }
    let shared = Arc::new(Shared { tls: Mutex::new(tls), sending: Mutex::new(socket.try_clone()?) });
    let read = ReadHalf::Tls { socket, shared: shared.clone(), raw: Vec::new(), raw_start: 0 };
    Ok((read, WriteHalf::Tls { shared }))
}

impl ReadHalf {
    /// The socket, for its options (the receive timeout is shared by every clone of it).
    pub(crate) fn socket(&self) -> &TcpStream {
        match self {
            ReadHalf::Plain(s) => s,
            ReadHalf::Tls { socket, .. } => socket,
        }
    }
}

impl Read for ReadHalf {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let (socket, shared, raw, raw_start) = match self {
            ReadHalf::Plain(s) => return s.read(buf),
            ReadHalf::Tls { socket, shared, raw, raw_start } => (socket, shared, raw, raw_start),
        };
        loop {
            let wants_write = {
                let mut tls = shared.tls();
                match tls.reader().read(buf) {
                    // Plaintext there, or (0) the broker's close_notify.
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                // Feed what is left of the last raw read; rustls may take only part of it at a time.
                if *raw_start < raw.len() {
                    let taken = tls.read_tls(&mut &raw[*raw_start..])?;
                    *raw_start += taken;
                    tls.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                }
                tls.wants_write()
            };
            if wants_write {
                shared.flush_records()?;
            }
            if *raw_start < raw.len() {
                continue;
            }
            // Nothing left to feed and no plaintext: read more from the socket, without the lock.
            raw.resize(RAW_READ_BYTES, 0);
            let n = match socket.read(raw) {
                Ok(n) => n,
                Err(e) => {
                    raw.clear();
                    *raw_start = 0;
                    return Err(e);
                }
            };
            raw.truncate(n);
            *raw_start = 0;
            if n == 0 {
                // The broker closed the socket: rustls tells a clean close from a truncated one.
                let mut tls = shared.tls();
                tls.read_tls(&mut &[][..])?;
                tls.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                return match tls.reader().read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                    other => other,
                };
            }
        }
    }
}

impl Write for WriteHalf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            WriteHalf::Plain(s) => s.write_all(buf),
            WriteHalf::Tls { shared } => {
                let mut socket = shared.sending.lock().expect("no panic while sending");
                let mut records = Vec::with_capacity(buf.len() + 1024);
                {
                    let mut tls = shared.tls();
                    tls.writer().write_all(buf)?;
                    while tls.wants_write() {
                        tls.write_tls(&mut records)?;
                    }
                }
                socket.write_all(&records)
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            WriteHalf::Plain(s) => s.flush(),
            WriteHalf::Tls { shared } => shared.flush_records(),
        }
    }
}
