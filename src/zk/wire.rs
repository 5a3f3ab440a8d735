//! The encoded size of the requests zkq sends, as ZooKeeper's jute encoding lays them out: what
//! the server checks against its `jute.maxbuffer` before it reads a request. A request over that
//! limit is not refused: the server closes the connection, and every call in flight on it loses
//! its answer. So every transaction zkq builds is measured here, with the session's real ACL and
//! chroot, before it is sent.

use super::TxnOp;

/// What a request leaves of `jute.maxbuffer`. The server turns a transaction into a log entry and
/// a proposal to its followers a little larger than the request (a header, and a byte per create),
/// and the followers read proposals within `jute.maxbuffer` plus `jute.maxbuffer.extrasize`
/// (1 KiB): 4 KiB of room keeps every transaction readable by every server.
const LOG_ENTRY_ROOM: usize = 4096;

/// The largest request zkq sends to servers that read requests of up to `jute_maxbuffer` bytes
/// (`zookeeper.jute_maxbuffer`: Java's default 0xfffff, unless they run with `-Djute.maxbuffer`).
pub const fn max_request_bytes(jute_maxbuffer: usize) -> usize {
    jute_maxbuffer.saturating_sub(LOG_ENTRY_ROOM)
}

/// A request's header: xid and operation code.
const REQUEST_HEADER: usize = 4 + 4;
/// The header of each operation of a multi, and the closing one: type, done, error.
const MULTI_HEADER: usize = 4 + 1 + 4;
/// A jute `int` (versions, flags, vector lengths, permissions).
const INT: usize = 4;

/// A jute string or buffer: its length, then its bytes.
const fn buffer(len: usize) -> usize {
    INT + len
}

/// How zkq's requests are encoded on one session: the ACL every create carries and the chroot
/// the client puts before every path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestSizer {
    /// The encoded ACL vector of a create.
    acl_bytes: usize,
    /// The chroot's length ("/a/b" adds 4 bytes to every path; none adds 0).
    chroot_len: usize,
}

impl RequestSizer {
    /// `acl` holds each entry's scheme and id lengths.
    pub(crate) fn new(acl: impl IntoIterator<Item = (usize, usize)>, chroot_len: usize) -> RequestSizer {
        let acl_bytes = INT + acl.into_iter().map(|(scheme, id)| INT + buffer(scheme) + buffer(id)).sum::<usize>();
        RequestSizer { acl_bytes, chroot_len }
    }

    fn path(&self, path: &str) -> usize {
        buffer(self.chroot_len + path.len())
    }

    /// What one operation adds to a multi request (its multi header included).
    pub(crate) fn op_bytes(&self, op: &TxnOp) -> usize {
        MULTI_HEADER
            + match op {
                // CreateRequest: path, data, acl, flags.
                TxnOp::Create { path, data, .. } => self.path(path) + buffer(data.len()) + self.acl_bytes + INT,
                // DeleteRequest and CheckVersionRequest: path, version.
                TxnOp::Delete { path, .. } | TxnOp::Check { path, .. } => self.path(path) + INT,
                // SetDataRequest: path, data, version.
                TxnOp::SetData { path, data, .. } => self.path(path) + buffer(data.len()) + INT,
            }
    }

    /// The encoded size of a multi request of `ops` (what `jute.maxbuffer` is checked against).
    pub(crate) fn multi_bytes<'a>(&self, ops: impl IntoIterator<Item = &'a TxnOp>) -> usize {
        REQUEST_HEADER + ops.into_iter().map(|op| self.op_bytes(op)).sum::<usize>() + MULTI_HEADER
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zk::NodeMode;

    /// A multi of one create of "/q/a" with data "hi" and the open ACL (world:anyone), then one
    /// delete of "/q/a", laid out as ZooKeeper's jute records (`MultiHeader`, `CreateRequest`,
    /// `DeleteRequest`) are.
    #[test]
    fn sizes_match_the_jute_layout_byte_for_byte() {
        let open = RequestSizer::new([("world".len(), "anyone".len())], 0);
        let create = TxnOp::Create { path: "/q/a".to_owned(), data: b"hi".to_vec(), mode: NodeMode::Persistent };
        // header 9 + path 4+4 + data 4+2 + acl (4 + 4 + 4+5 + 4+6) + flags 4
        assert_eq!(open.op_bytes(&create), 9 + 8 + 6 + 27 + 4);
        let delete = TxnOp::Delete { path: "/q/a".to_owned(), version: None };
        assert_eq!(open.op_bytes(&delete), 9 + 8 + 4);
        assert_eq!(open.multi_bytes([&create, &delete]), 8 + 54 + 21 + 9);
    }

    #[test]
    fn a_chroot_and_a_longer_acl_make_every_create_larger() {
        let open = RequestSizer::new([(5, 6)], 0);
        let digest = RequestSizer::new([(6, 40), (5, 6)], 0);
        let chrooted = RequestSizer::new([(5, 6)], "/tenant".len());
        let create = TxnOp::Create { path: "/q/a".to_owned(), data: vec![0; 100], mode: NodeMode::Persistent };
        assert_eq!(digest.op_bytes(&create) - open.op_bytes(&create), 4 + 4 + 6 + 4 + 40);
        assert_eq!(chrooted.op_bytes(&create) - open.op_bytes(&create), 7);
    }
}
