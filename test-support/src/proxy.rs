//! A TCP fault proxy for tests that break the network between an agent and the center.
//!
//! [`FaultProxy`] listens on `127.0.0.1:0` and forwards every accepted connection to one
//! upstream address (the center's gRPC port). A test points the agent at [`FaultProxy::url`]
//! and calls [`FaultProxy::set`] to make the network misbehave; the change reaches existing
//! connections and new ones at once, through a `watch` channel, without polling.
//!
//! The proxy knows nothing about HTTP/2: it moves byte chunks. What each [`Fault`] does to
//! them is decided by one pure function ([`Fault::action`]); the tasks only carry it out.
//!
//! **Architecture Invariant:** the proxy only ever connects to its upstream address, which
//! must be a loopback address; it never resolves names or dials anything else.
//!
//! **Architecture Invariant:** a connection never resumes across a gap. A real partition
//! delays bytes (TCP retransmits them); this proxy discards them, so once a connection has
//! lost bytes in a direction, the byte stream is corrupt. When the fault later lets that
//! direction through again (for example `set(Fault::Pass)` after `BlackHole`), the connection
//! is reset rather than resumed, the way a connection that died during a partition is. New
//! connections work normally. A connection that lost nothing resumes where it stopped.
//!
//! [`FaultProxy::redirect`] points new connections at another upstream (a failover behind
//! a stable address); open ones stay where they are.
//!
//! Dropping the proxy stops the listener and every forwarding task; their sockets close.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Largest chunk read from a socket at once.
const CHUNK_BYTES: usize = 16 * 1024;
/// Chunks a direction may hold back (under `Delay`) before it stops reading: at most 1 MiB.
const MAX_QUEUED_CHUNKS: usize = 64;
/// Pause after a failed `accept` (out of file descriptors, say) so the loop cannot spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// What the proxy does to the bytes of its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Bytes flow both ways unchanged.
    Pass,
    /// Every chunk, in either direction, is held this long before it is forwarded; order is kept.
    Delay(Duration),
    /// Bytes reach upstream but its replies are read and discarded: the server does the work and
    /// the client never hears back ("committed but reply lost").
    DropReplies,
    /// Bytes in both directions are read and discarded. Connections are still accepted, but a
    /// connection accepted now does not connect upstream until the fault lets bytes through.
    BlackHole,
    /// Every connection is closed abruptly (RST), open ones now and new ones right after accept.
    /// The proxy keeps listening, so a later `set(Fault::Pass)` heals.
    Reset,
}

/// Which way a chunk travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    ToUpstream,
    ToClient,
}

/// What a connection does with a chunk travelling one way under a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// Write it to the other side once it has been held this long.
    Forward(Duration),
    /// Read it and throw it away.
    Discard,
    /// Reset the whole connection.
    Reset,
}

impl Fault {
    fn action(self, direction: Direction) -> Action {
        match (self, direction) {
            (Fault::Pass, _) | (Fault::DropReplies, Direction::ToUpstream) => Action::Forward(Duration::ZERO),
            (Fault::Delay(hold), _) => Action::Forward(hold),
            (Fault::DropReplies, Direction::ToClient) | (Fault::BlackHole, _) => Action::Discard,
            (Fault::Reset, _) => Action::Reset,
        }
    }
}

/// A listener on `127.0.0.1` that forwards connections to an upstream address and injects
/// the current [`Fault`] into them.
pub struct FaultProxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    upstream: watch::Sender<SocketAddr>,
    accepted: Arc<AtomicU64>,
    accept_task: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on `127.0.0.1:0` and forwards each accepted connection to `upstream`, which must
    /// be a loopback address. Starts with [`Fault::Pass`].
    pub async fn start(upstream: SocketAddr) -> std::io::Result<FaultProxy> {
        loopback(upstream)?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (fault, fault_rx) = watch::channel(Fault::Pass);
        let (upstream, upstream_rx) = watch::channel(upstream);
        let accepted = Arc::new(AtomicU64::new(0));
        let accept_task = tokio::spawn(accept_loop(listener, upstream_rx, fault_rx, Arc::clone(&accepted)));
        Ok(FaultProxy { addr, fault, upstream, accepted, accept_task })
    }

    /// Forwards connections accepted from now on to `upstream` (a loopback address, or
    /// nothing changes and the error says so); open connections keep theirs.
    pub fn redirect(&self, upstream: SocketAddr) -> std::io::Result<()> {
        loopback(upstream)?;
        self.upstream.send_replace(upstream);
        Ok(())
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, for a gRPC client.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Switches the fault; open connections and new ones see it immediately.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// The fault in force.
    pub fn fault(&self) -> Fault {
        *self.fault.borrow()
    }

    /// Connections accepted so far, whatever the fault did to them.
    pub fn connections_accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    /// Aborts the accept task, which owns the listener and (through a `JoinSet`) every
    /// connection task, so all of them stop and their sockets close. The runtime carries the
    /// aborts out at its next turn, not inside this call.
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

/// Refuses an upstream off this machine (the module's architecture invariant).
fn loopback(upstream: SocketAddr) -> std::io::Result<()> {
    if upstream.ip().is_loopback() {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("fault proxy upstream must be a loopback address, got {upstream}"),
    ))
}

async fn accept_loop(
    listener: TcpListener,
    upstream: watch::Receiver<SocketAddr>,
    fault: watch::Receiver<Fault>,
    accepted: Arc<AtomicU64>,
) {
    // Dropped with this future, which aborts every connection task.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            incoming = listener.accept() => match incoming {
                Ok((client, _)) => {
                    accepted.fetch_add(1, Ordering::Relaxed);
                    connections.spawn(serve(client, *upstream.borrow(), fault.clone()));
                }
                Err(_) => tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await,
            },
            // Reap finished connections so the set stays as large as the open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// The connection has to be reset: the fault says so, a side failed, or a gap would be resumed.
struct Reset;

/// A chunk waiting to be written, and when it may be.
struct Chunk {
    due: Instant,
    bytes: Vec<u8>,
}

/// Carries one client connection until both directions end or it has to be reset.
async fn serve(mut client: TcpStream, upstream_addr: SocketAddr, mut fault: watch::Receiver<Fault>) {
    let _ = client.set_nodelay(true);
    let first = match hold_until_forwarding(&mut client, &mut fault).await {
        Ok(first) => first,
        Err(Reset) => return reset(&client),
    };
    let Ok(mut upstream) = TcpStream::connect(upstream_addr).await else {
        return reset(&client);
    };
    let _ = upstream.set_nodelay(true);
    let outcome = {
        let (client_read, client_write) = client.split();
        let (upstream_read, upstream_write) = upstream.split();
        tokio::try_join!(
            pump(client_read, upstream_write, Direction::ToUpstream, first, fault.clone()),
            pump(upstream_read, client_write, Direction::ToClient, VecDeque::new(), fault),
        )
    };
    if outcome.is_err() {
        reset(&client);
        reset(&upstream);
    }
}

/// Makes dropping `stream` send RST instead of FIN.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// Waits, before connecting upstream, until the fault lets client bytes through; meanwhile
/// discards what the client sends. Returns the chunk read as the fault changed, if any.
async fn hold_until_forwarding(
    client: &mut TcpStream,
    fault: &mut watch::Receiver<Fault>,
) -> Result<VecDeque<Chunk>, Reset> {
    let mut buf = vec![0; CHUNK_BYTES];
    let mut eof = false;
    // Client bytes, or its FIN, were swallowed: upstream could never see the stream whole.
    let mut lost = false;
    loop {
        let action = fault.borrow_and_update().action(Direction::ToUpstream);
        match action {
            Action::Reset => return Err(Reset),
            Action::Forward(_) if lost => return Err(Reset),
            Action::Forward(_) => return Ok(VecDeque::new()),
            Action::Discard => {}
        }
        tokio::select! {
            biased;
            changed = fault.changed() => changed.map_err(|_| Reset)?,
            read = client.read(&mut buf), if !eof => match read {
                Err(_) => return Err(Reset),
                Ok(0) => (eof, lost) = (true, true),
                // The fault may have changed since the top of the loop: judge by the current one.
                Ok(n) => match fault.borrow().action(Direction::ToUpstream) {
                    Action::Forward(hold) => {
                        return Ok(VecDeque::from([Chunk { due: Instant::now() + hold, bytes: buf[..n].to_vec() }]));
                    }
                    Action::Discard => lost = true,
                    Action::Reset => return Err(Reset),
                },
            },
        }
    }
}

/// Moves bytes one way, doing to each chunk what the fault in force says. Returns `Ok` once
/// the reader's EOF has been passed on as a write shutdown.
async fn pump(
    mut reader: ReadHalf<'_>,
    mut writer: WriteHalf<'_>,
    direction: Direction,
    mut queue: VecDeque<Chunk>,
    mut fault: watch::Receiver<Fault>,
) -> Result<(), Reset> {
    let mut buf = vec![0; CHUNK_BYTES];
    // Bytes of the front chunk already written.
    let mut written = 0;
    let mut eof = false;
    // Bytes, or the FIN, were discarded: this direction has a gap and must never resume.
    let mut lost = false;
    loop {
        let action = fault.borrow_and_update().action(direction);
        match action {
            Action::Reset => return Err(Reset),
            Action::Forward(_) if lost => return Err(Reset),
            Action::Forward(_) => {
                if eof && queue.is_empty() {
                    return writer.shutdown().await.map_err(|_| Reset);
                }
            }
            Action::Discard => {
                lost |= !queue.is_empty() || eof;
                queue.clear();
                written = 0;
            }
        }
        let now = Instant::now();
        let due = queue.front().map(|chunk| chunk.due);
        tokio::select! {
            biased;
            changed = fault.changed() => changed.map_err(|_| Reset)?,
            sent = writer.write(queue.front().map_or(&[][..], |chunk| &chunk.bytes[written..])),
                if due.is_some_and(|due| due <= now) =>
            {
                match sent {
                    Ok(0) | Err(_) => return Err(Reset),
                    Ok(n) => {
                        written += n;
                        if queue.front().is_some_and(|chunk| written == chunk.bytes.len()) {
                            queue.pop_front();
                            written = 0;
                        }
                    }
                }
            }
            () = tokio::time::sleep_until(due.unwrap_or(now)), if due.is_some_and(|due| due > now) => {}
            read = reader.read(&mut buf), if !eof && queue.len() < MAX_QUEUED_CHUNKS => match read {
                Err(_) => return Err(Reset),
                Ok(0) => eof = true,
                // The fault may have changed since the top of the loop: judge by the current one.
                Ok(n) => match fault.borrow().action(direction) {
                    Action::Forward(hold) => queue.push_back(Chunk { due: Instant::now() + hold, bytes: buf[..n].to_vec() }),
                    Action::Discard => lost = true,
                    Action::Reset => return Err(Reset),
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Action, Direction, Fault};
    use std::time::Duration;

    #[test]
    fn each_fault_maps_to_an_action_per_direction() {
        let hold = Duration::from_millis(5);
        let cases = [
            (Fault::Pass, Action::Forward(Duration::ZERO), Action::Forward(Duration::ZERO)),
            (Fault::Delay(hold), Action::Forward(hold), Action::Forward(hold)),
            (Fault::DropReplies, Action::Forward(Duration::ZERO), Action::Discard),
            (Fault::BlackHole, Action::Discard, Action::Discard),
            (Fault::Reset, Action::Reset, Action::Reset),
        ];
        for (fault, to_upstream, to_client) in cases {
            assert_eq!(fault.action(Direction::ToUpstream), to_upstream, "{fault:?} to upstream");
            assert_eq!(fault.action(Direction::ToClient), to_client, "{fault:?} to client");
        }
    }
}
