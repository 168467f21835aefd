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
            let mut tls = shared.tls();
            match tls.reader().read(buf) {
                // Plaintext there, or (0) the broker's close_notify.
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            // Feed what is left of the last raw read (rustls may take only part of it at a time), then
            // look for plaintext again.
            if *raw_start < raw.len() {
                *raw_start += tls.read_tls(&mut &raw[*raw_start..])?;
                tls.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                let wants_write = tls.wants_write();
                drop(tls);
                if wants_write {
                    shared.flush_records()?;
                }
                continue;
            }
            drop(tls);
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

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::Arc;

    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

    use super::*;

    /// A TLS server on a thread that sends back every byte it reads, and a client for it.
    fn echo_over_tls() -> (ReadHalf, WriteHalf, std::thread::JoinHandle<()>) {
        let issued = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let certificate: CertificateDer<'static> = issued.cert.der().clone();
        let key = PrivateKeyDer::try_from(issued.signing_key.serialize_der()).unwrap();
        let provider = crate::security::tls::provider();
        let server_config = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![certificate.clone()], key)
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (socket, _) = listener.accept().unwrap();
            let tls = rustls::ServerConnection::new(Arc::new(server_config)).unwrap();
            let mut stream = rustls::StreamOwned::new(tls, socket);
            let mut buf = vec![0u8; 50_000];
            loop {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => stream.write_all(&buf[..n]).unwrap(),
                }
            }
        });
        let mut roots = rustls::RootCertStore::empty();
        roots.add(certificate).unwrap();
        let client_config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from("localhost").unwrap();
        let client = rustls::ClientConnection::new(Arc::new(client_config), name).unwrap();
        let (read, write) = tls(TcpStream::connect(addr).unwrap(), client).unwrap();
        (read, write, server)
    }

    #[test]
    fn the_halves_of_a_tls_connection_write_and_read_at_once_on_two_threads() {
        let (mut read, mut write, server) = echo_over_tls();
        // Messages from 1 byte to several TLS records long, all sent before most answers are read.
        let messages: Vec<Vec<u8>> =
            (0..200u32).map(|i| vec![(i % 251) as u8; 1 + (i as usize * 997) % 70_000]).collect();
        let expected: Vec<u8> = messages.concat();
        let writer = std::thread::spawn(move || {
            for message in &messages {
                write.write_all(message).unwrap();
            }
            write
        });
        let mut echoed = vec![0u8; expected.len()];
        read.read_exact(&mut echoed).unwrap();
        assert!(echoed == expected, "the bytes come back in order and whole");
        drop(writer.join().unwrap());
        drop(read);
        server.join().unwrap();
    }
}
