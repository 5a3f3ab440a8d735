//! A fault-injecting TCP proxy in front of one ZooKeeper server, inside the test process.
//!
//! `tc netem` is not available on the test machines, so lost answers, held requests and refused
//! reconnects are made here. The proxy understands ZooKeeper's framing (a 4-byte big-endian
//! length before every frame; the first frame each way is the connect request/response; then
//! every client frame starts with `xid:i32, type:i32` and every server frame with
//! `xid:i32, zxid:i64, err:i32`), so a fault can target one request by its opcode.
//!
//! API in short:
//! - [`ZkProxy::start`]`(upstream)`: listens on `127.0.0.1:0`; [`ZkProxy::connect_string`] is what
//!   zkq connects to.
//! - [`ZkProxy::arm`]`(ops, fault)`: the next client request whose opcode is in `ops` (on any
//!   connection) gets `fault`: [`Fault::DropBeforeSend`] (both sides closed, the server never
//!   sees it), [`Fault::DropAnswer`] (forwarded; the server's reply with its xid is discarded
//!   and both sides closed: applied, answer lost) or [`Fault::Hold`] (that request and every later
//!   one of its connection wait until [`Armed::release_deliver`] or [`Armed::release_drop_answer`]);
//!   [`Fault::Pass`] forwards it untouched, so that a fault armed after it hits a later request.
//!   [`ZkProxy::arm_then_refuse`] also refuses new connections from the moment the fault closes
//!   the connection, so the client cannot come back to read the outcome until
//!   `refuse(false)`. The returned [`Armed`] tells when it fired ([`Armed::fired`], [`Armed::held`]).
//!   Keep holds short: a held connection answers nothing, not even pings, and zkq's client
//!   drops a connection that answers nothing for its connection timeout (the session timeout,
//!   at most 5 s), and the held request with it. While holding, watch zkq in process
//!   (`TestZkq::registered_metrics`), not by a scrape of `/metrics`: a scrape reads ZooKeeper,
//!   and its reads wait behind the held request for up to a second each.
//! - [`ZkProxy::refuse`]: refuse (close at once) new connections; [`ZkProxy::cut`]: close every
//!   current connection; [`ZkProxy::delay_replies`]: delay every server frame;
//!   [`ZkProxy::count`]: requests forwarded, by opcode.

#![allow(dead_code)] // not every test uses every control

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// ZooKeeper opcodes (`ZooDefs.OpCode`).
pub mod op {
    pub const CREATE: i32 = 1;
    pub const DELETE: i32 = 2;
    pub const EXISTS: i32 = 3;
    pub const GET_DATA: i32 = 4;
    pub const SET_DATA: i32 = 5;
    pub const GET_CHILDREN: i32 = 8;
    pub const SYNC: i32 = 9;
    pub const PING: i32 = 11;
    pub const GET_CHILDREN2: i32 = 12;
    pub const CHECK: i32 = 13;
    pub const MULTI: i32 = 14;
    pub const CREATE2: i32 = 15;
    pub const CREATE_CONTAINER: i32 = 19;
    pub const MULTI_READ: i32 = 22;
    pub const AUTH: i32 = 100;
    pub const SET_WATCHES: i32 = 101;
    pub const SET_WATCHES2: i32 = 105;
    pub const ADD_WATCH: i32 = 106;
    pub const CLOSE_SESSION: i32 = -11;

    /// Every request that can change the tree.
    pub const WRITES: &[i32] = &[CREATE, CREATE2, CREATE_CONTAINER, DELETE, SET_DATA, MULTI, CHECK];
    /// Creates of any kind.
    pub const CREATES: &[i32] = &[CREATE, CREATE2, CREATE_CONTAINER];
}

/// Reply xids that are not answers to a request.
const PING_XID: i32 = -2;
const WATCH_XID: i32 = -1;
/// Larger frames are treated as garbage (ZooKeeper's own jute.maxbuffer is about 1 MiB).
const MAX_FRAME: usize = 64 << 20;

/// What happens to the request a fault is armed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Close both sides without forwarding: the server never sees the request.
    DropBeforeSend,
    /// Forward it, discard the server's reply, close both sides: applied, answer lost.
    DropAnswer,
    /// Stop forwarding this connection's requests from this one on until released.
    Hold,
    /// Forward it untouched: a placeholder, so that a fault armed after it hits a later request.
    Pass,
    /// Do not forward it; answer it with this ZooKeeper error code (e.g. -118, SESSIONMOVED) and
    /// an empty body, keeping the connection: the server never sees the request.
    AnswerError(i32),
}

/// How a held request is let go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Release {
    Deliver,
    DropAnswer,
}

/// The header of a client request frame (after the connect request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub xid: i32,
    pub opcode: i32,
}

/// The header of a server reply frame (after the connect response).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyHeader {
    pub xid: i32,
    pub zxid: i64,
    pub err: i32,
}

pub fn parse_request(frame: &[u8]) -> Option<RequestHeader> {
    let xid = i32::from_be_bytes(frame.get(0..4)?.try_into().ok()?);
    let opcode = i32::from_be_bytes(frame.get(4..8)?.try_into().ok()?);
    Some(RequestHeader { xid, opcode })
}

pub fn parse_reply(frame: &[u8]) -> Option<ReplyHeader> {
    let xid = i32::from_be_bytes(frame.get(0..4)?.try_into().ok()?);
    let zxid = i64::from_be_bytes(frame.get(4..12)?.try_into().ok()?);
    let err = i32::from_be_bytes(frame.get(12..16)?.try_into().ok()?);
    Some(ReplyHeader { xid, zxid, err })
}

/// Reads one length-prefixed frame; `None` at EOF or on an error.
async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    reader.read_exact(&mut len).await.ok()?;
    let len = usize::try_from(i32::from_be_bytes(len)).ok().filter(|l| *l <= MAX_FRAME)?;
    let mut frame = vec![0u8; len];
    reader.read_exact(&mut frame).await.ok()?;
    Some(frame)
}

fn with_length(frame: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(frame.len() + 4);
    out.extend_from_slice(&(frame.len() as u32).to_be_bytes());
    out.extend_from_slice(frame);
    out
}

struct ArmState {
    ops: Vec<i32>,
    /// Bytes the request's frame must contain (a path, say), when the opcode alone would also
    /// match requests the test does not aim at (e.g. zkq's own marker cleanup, also a multi).
    containing: Option<Vec<u8>>,
    fault: Fault,
    refuse_after: bool,
    /// Set when the fault hit a request: its opcode.
    hit: Mutex<Option<i32>>,
    /// True once the fault did what it does (dropped, answer discarded, or request held).
    fired: watch::Sender<bool>,
    release: watch::Sender<Option<Release>>,
}

/// A fault waiting for (or applied to) a request.
#[derive(Clone)]
pub struct Armed {
    state: Arc<ArmState>,
}

impl Armed {
    /// Waits until the fault did its work: the request was dropped, its answer discarded and the
    /// connection closed, or (for `Hold`) the request is being held.
    pub async fn fired(&self) {
        let mut rx = self.state.fired.subscribe();
        let _ = rx.wait_for(|f| *f).await;
    }

    /// Waits until the held request is being held (same as [`Armed::fired`]).
    pub async fn held(&self) {
        self.fired().await;
    }

    /// Whether the fault has fired.
    pub fn has_fired(&self) -> bool {
        *self.state.fired.borrow()
    }

    /// The opcode of the request the fault hit.
    pub fn opcode(&self) -> Option<i32> {
        *self.state.hit.lock().expect("lock")
    }

    /// Forwards the held request (and everything behind it) normally.
    pub fn release_deliver(&self) {
        self.state.release.send_replace(Some(Release::Deliver));
    }

    /// Forwards the held request, discards its answer and closes the connection.
    pub fn release_drop_answer(&self) {
        self.state.release.send_replace(Some(Release::DropAnswer));
    }
}

#[derive(Default)]
struct Shared {
    armed: Mutex<Vec<Arc<ArmState>>>,
    refusing: AtomicBool,
    reply_delay: Mutex<Duration>,
    connections: Mutex<HashMap<u64, CancellationToken>>,
    next_connection: AtomicU64,
    counts: Mutex<HashMap<i32, u64>>,
    accepted: AtomicU64,
}

impl Shared {
    /// Takes the first armed fault that matches `opcode` (and the frame's content, if it asks).
    fn take_fault(&self, opcode: i32, frame: &[u8]) -> Option<Arc<ArmState>> {
        let mut armed = self.armed.lock().expect("lock");
        let matches = |a: &Arc<ArmState>| {
            a.ops.contains(&opcode)
                && a.containing
                    .as_ref()
                    .is_none_or(|needle| frame.windows(needle.len()).any(|w| w == needle.as_slice()))
        };
        let index = armed.iter().position(matches)?;
        let state = armed.remove(index);
        *state.hit.lock().expect("lock") = Some(opcode);
        Some(state)
    }
}

/// A fault-injecting proxy in front of one ZooKeeper server.
pub struct ZkProxy {
    addr: SocketAddr,
    upstream: String,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl ZkProxy {
    /// Starts a proxy on `127.0.0.1:0` in front of `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> ZkProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared::default());
        let stop = CancellationToken::new();
        let (accept_shared, accept_stop, target) = (shared.clone(), stop.clone(), upstream.to_owned());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = accept_stop.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((client, _)) = accepted else { continue };
                if accept_shared.refusing.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                accept_shared.accepted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(client, target.clone(), accept_shared.clone(), accept_stop.child_token()));
            }
        });
        ZkProxy { addr, upstream: upstream.to_owned(), shared, stop }
    }

    /// `127.0.0.1:PORT` of the proxy.
    pub fn connect_string(&self) -> String {
        self.addr.to_string()
    }

    /// The server behind the proxy.
    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// Arms `fault` for the next client request whose opcode is in `ops`.
    pub fn arm(&self, ops: &[i32], fault: Fault) -> Armed {
        self.arm_inner(ops, None, fault, false)
    }

    /// Like [`ZkProxy::arm`], and refuses new connections from the moment the fault closes the
    /// connection (until `refuse(false)`).
    pub fn arm_then_refuse(&self, ops: &[i32], fault: Fault) -> Armed {
        self.arm_inner(ops, None, fault, true)
    }

    /// Like [`ZkProxy::arm_then_refuse`], for the next such request whose frame contains
    /// `containing` (e.g. a path under one queue), so that other requests of the same opcode
    /// pass: zkq's marker cleanup is a multi too, and may go first.
    pub fn arm_containing_then_refuse(&self, ops: &[i32], containing: &str, fault: Fault) -> Armed {
        self.arm_inner(ops, Some(containing.as_bytes().to_vec()), fault, true)
    }

    /// Like [`ZkProxy::arm`], for the next such request whose frame contains `containing`.
    pub fn arm_containing(&self, ops: &[i32], containing: &str, fault: Fault) -> Armed {
        self.arm_inner(ops, Some(containing.as_bytes().to_vec()), fault, false)
    }

    fn arm_inner(&self, ops: &[i32], containing: Option<Vec<u8>>, fault: Fault, refuse_after: bool) -> Armed {
        assert!(containing.as_ref().is_none_or(|c| !c.is_empty()), "an empty needle matches every frame");
        let state = Arc::new(ArmState {
            ops: ops.to_vec(),
            containing,
            fault,
            refuse_after,
            hit: Mutex::new(None),
            fired: watch::channel(false).0,
            release: watch::channel(None).0,
        });
        self.shared.armed.lock().expect("lock").push(state.clone());
        Armed { state }
    }

    /// Forgets every fault that has not hit a request yet.
    pub fn disarm_all(&self) {
        self.shared.armed.lock().expect("lock").clear();
    }

    /// Refuses (closes at once) new connections while `on`.
    pub fn refuse(&self, on: bool) {
        self.shared.refusing.store(on, Ordering::SeqCst);
    }

    /// Closes every current connection (both sides).
    pub fn cut(&self) {
        for token in self.shared.connections.lock().expect("lock").values() {
            token.cancel();
        }
    }

    /// Delays every frame from the server by `delay` (zero: none).
    pub fn delay_replies(&self, delay: Duration) {
        *self.shared.reply_delay.lock().expect("lock") = delay;
    }

    /// Requests with `opcode` forwarded to the server so far.
    pub fn count(&self, opcode: i32) -> u64 {
        self.shared.counts.lock().expect("lock").get(&opcode).copied().unwrap_or(0)
    }

    /// Connections accepted (not refused) so far.
    pub fn connections_accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.shared.connections.lock().expect("lock").len()
    }
}

impl crate::server::ConnectTarget for ZkProxy {
    fn connect_string(&self) -> String {
        ZkProxy::connect_string(self)
    }
}

impl Drop for ZkProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Removes a connection from the table when its tasks end.
struct Registered {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(token) = self.shared.connections.lock().expect("lock").remove(&self.id) {
            token.cancel();
        }
    }
}

/// Ends a connection because of a fault: refuse first if asked, then close both sides.
fn close_for(state: &ArmState, shared: &Shared, closed: &CancellationToken) {
    if state.refuse_after {
        shared.refusing.store(true, Ordering::SeqCst);
    }
    closed.cancel();
    state.fired.send_replace(true);
}

async fn serve(client: TcpStream, upstream: String, shared: Arc<Shared>, closed: CancellationToken) {
    let Ok(server) = TcpStream::connect(&upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let id = shared.next_connection.fetch_add(1, Ordering::SeqCst);
    shared.connections.lock().expect("lock").insert(id, closed.clone());
    let _registered = Registered { shared: shared.clone(), id };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Replies to discard: xid → the fault that asked for it.
    let drops: Arc<Mutex<HashMap<i32, Arc<ArmState>>>> = Arc::default();
    // Replies the proxy makes up itself (`Fault::AnswerError`), for the downward side to send.
    let (inject, mut injected) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();

    let upward = {
        let (shared, closed, drops) = (shared.clone(), closed.clone(), drops.clone());
        async move {
            let mut first = true;
            loop {
                let frame = tokio::select! {
                    _ = closed.cancelled() => return,
                    frame = read_frame(&mut client_read) => frame,
                };
                let Some(frame) = frame else { return closed.cancel() };
                if !first && let Some(header) = parse_request(&frame) {
                    if let Some(state) = shared.take_fault(header.opcode, &frame) {
                        let fault = match state.fault {
                            Fault::Hold => {
                                state.fired.send_replace(true);
                                let mut release = state.release.subscribe();
                                let decided = tokio::select! {
                                    _ = closed.cancelled() => return,
                                    r = release.wait_for(Option::is_some) => r.ok().and_then(|r| *r),
                                };
                                match decided {
                                    Some(Release::DropAnswer) => Some(Fault::DropAnswer),
                                    _ => None,
                                }
                            },
                            other => Some(other),
                        };
                        match fault {
                            Some(Fault::Pass) => {
                                state.fired.send_replace(true);
                            },
                            Some(Fault::DropBeforeSend) => return close_for(&state, &shared, &closed),
                            Some(Fault::DropAnswer) => {
                                drops.lock().expect("lock").insert(header.xid, state.clone());
                            },
                            Some(Fault::AnswerError(err)) => {
                                let mut reply = Vec::with_capacity(16);
                                reply.extend_from_slice(&header.xid.to_be_bytes());
                                reply.extend_from_slice(&0i64.to_be_bytes());
                                reply.extend_from_slice(&err.to_be_bytes());
                                let _ = inject.send(reply);
                                state.fired.send_replace(true);
                                first = false;
                                continue;
                            },
                            _ => {},
                        }
                    }
                    *shared.counts.lock().expect("lock").entry(header.opcode).or_default() += 1;
                }
                first = false;
                if server_write.write_all(&with_length(&frame)).await.is_err() {
                    return closed.cancel();
                }
            }
        }
    };
    let downward = {
        let (shared, closed, drops) = (shared.clone(), closed.clone(), drops.clone());
        async move {
            let mut first = true;
            loop {
                let frame = tokio::select! {
                    _ = closed.cancelled() => return,
                    Some(reply) = injected.recv() => {
                        if client_write.write_all(&with_length(&reply)).await.is_err() {
                            return closed.cancel();
                        }
                        continue;
                    },
                    frame = read_frame(&mut server_read) => frame,
                };
                let Some(frame) = frame else { return closed.cancel() };
                if !first
                    && let Some(reply) = parse_reply(&frame)
                    && reply.xid != PING_XID
                    && reply.xid != WATCH_XID
                {
                    let dropped = drops.lock().expect("lock").remove(&reply.xid);
                    if let Some(state) = dropped {
                        return close_for(&state, &shared, &closed);
                    }
                }
                first = false;
                let delay = *shared.reply_delay.lock().expect("lock");
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                if client_write.write_all(&with_length(&frame)).await.is_err() {
                    return closed.cancel();
                }
            }
        }
    };
    tokio::join!(upward, downward);
    // A fault whose reply never came (the server went away) still counts as fired.
    let pending: Vec<Arc<ArmState>> = drops.lock().expect("lock").drain().map(|(_, s)| s).collect();
    for state in pending {
        close_for(&state, &shared, &closed);
    }
}

/// Which ops a set of opcodes names, for messages.
pub fn op_names(ops: &HashSet<i32>) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = ops.iter().map(|o| op_name(*o)).collect();
    names.sort_unstable();
    names
}

pub fn op_name(opcode: i32) -> &'static str {
    match opcode {
        op::CREATE => "create",
        op::DELETE => "delete",
        op::EXISTS => "exists",
        op::GET_DATA => "getData",
        op::SET_DATA => "setData",
        op::GET_CHILDREN => "getChildren",
        op::SYNC => "sync",
        op::PING => "ping",
        op::GET_CHILDREN2 => "getChildren2",
        op::CHECK => "check",
        op::MULTI => "multi",
        op::CREATE2 => "create2",
        op::CREATE_CONTAINER => "createContainer",
        op::MULTI_READ => "multiRead",
        op::AUTH => "auth",
        op::SET_WATCHES => "setWatches",
        op::SET_WATCHES2 => "setWatches2",
        op::ADD_WATCH => "addWatch",
        op::CLOSE_SESSION => "closeSession",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_and_reply_headers_parse_big_endian() {
        let mut request = 7i32.to_be_bytes().to_vec();
        request.extend_from_slice(&op::MULTI.to_be_bytes());
        request.extend_from_slice(b"payload");
        assert_eq!(parse_request(&request), Some(RequestHeader { xid: 7, opcode: 14 }));
        let ping = [(-2i32).to_be_bytes(), op::PING.to_be_bytes()].concat();
        assert_eq!(parse_request(&ping), Some(RequestHeader { xid: PING_XID, opcode: 11 }));
        assert_eq!(parse_request(&[0, 0, 0]), None);

        let mut reply = 9i32.to_be_bytes().to_vec();
        reply.extend_from_slice(&0x1_0000_0002i64.to_be_bytes());
        reply.extend_from_slice(&(-101i32).to_be_bytes());
        assert_eq!(parse_reply(&reply), Some(ReplyHeader { xid: 9, zxid: 0x1_0000_0002, err: -101 }));
        assert_eq!(parse_reply(&reply[..15]), None);
    }

    #[tokio::test]
    async fn frames_round_trip_through_the_length_prefix() {
        let mut bytes = with_length(b"abc");
        bytes.extend(with_length(b""));
        bytes.extend_from_slice(&[0, 0, 0, 9, 1]); // truncated
        let mut reader = bytes.as_slice();
        assert_eq!(read_frame(&mut reader).await.as_deref(), Some(b"abc".as_slice()));
        assert_eq!(read_frame(&mut reader).await.as_deref(), Some(b"".as_slice()));
        assert_eq!(read_frame(&mut reader).await, None);
        let huge = (-1i32).to_be_bytes();
        assert_eq!(read_frame(&mut huge.as_slice()).await, None);
    }
}
