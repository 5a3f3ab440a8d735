//! The one place where the client crate's errors are classified.

use zookeeper_client as zkc;

/// What a failed ZooKeeper call means to zkq.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ZkError {
    /// The node does not exist.
    #[error("node does not exist")]
    NoNode,
    /// The node already exists.
    #[error("node already exists")]
    NodeExists,
    /// The node's version is not the expected one (someone else changed or consumed it).
    #[error("node version changed")]
    BadVersion,
    /// The node still has children.
    #[error("node has children")]
    NotEmpty,
    /// No session is connected and none came back before the deadline; nothing was sent.
    #[error("ZooKeeper is not connected")]
    Unavailable,
    /// The request was sent but its answer was lost (connection dropped or deadline passed):
    /// it may or may not have been applied.
    #[error("connection to ZooKeeper lost during the request; outcome unknown")]
    OutcomeUnknown,
    /// The session expired or was closed: every ephemeral node of it is gone.
    #[error("ZooKeeper session lost")]
    SessionLost,
    /// The node's ACL does not allow this session (check `zookeeper.auth_digest`).
    #[error("ZooKeeper refused access: the node's ACL does not allow this session")]
    NotAuthorized,
    /// ZooKeeper refused the request for a reason retrying will not fix (bad argument, quota...).
    #[error("ZooKeeper refused the request: {0}")]
    Rejected(String),
    /// A transaction zkq did not send because it is larger than ZooKeeper reads
    /// ([`super::Zk::max_request_bytes`], encoded with the node ACL and chroot): nothing was sent,
    /// and the same one will never fit.
    #[error(
        "a transaction of {size} bytes is larger than ZooKeeper's request limit ({max} bytes, \
         zookeeper.jute_maxbuffer less room for its log entry); it was not sent"
    )]
    TooLarge { size: usize, max: usize },
}

impl ZkError {
    /// Whether retrying later, with a new or restored session, may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, ZkError::Unavailable | ZkError::OutcomeUnknown | ZkError::SessionLost)
    }

    /// A short, stable label for metrics.
    pub fn outcome_label(&self) -> &'static str {
        match self {
            ZkError::NoNode => "no_node",
            ZkError::NodeExists => "node_exists",
            ZkError::BadVersion => "bad_version",
            ZkError::NotEmpty => "not_empty",
            ZkError::Unavailable => "unavailable",
            ZkError::OutcomeUnknown => "outcome_unknown",
            ZkError::SessionLost => "session_lost",
            ZkError::NotAuthorized => "not_authorized",
            ZkError::Rejected(_) => "rejected",
            ZkError::TooLarge { .. } => "too_large",
        }
    }
}

impl From<zkc::Error> for ZkError {
    fn from(err: zkc::Error) -> Self {
        use zkc::Error as E;
        match err {
            E::NoNode => ZkError::NoNode,
            E::NodeExists => ZkError::NodeExists,
            E::BadVersion => ZkError::BadVersion,
            E::NotEmpty => ZkError::NotEmpty,
            // A check op in a CheckWriter that failed on NoNode/BadVersion.
            E::RuntimeInconsistent => ZkError::BadVersion,
            E::SessionExpired | E::ClientClosed => ZkError::SessionLost,
            E::NoHosts => ZkError::Unavailable,
            E::NoAuth | E::AuthFailed => ZkError::NotAuthorized,
            // A broken connection surfaces as ConnectionLoss, Timeout or a Custom I/O error:
            // the request may have been applied.
            // SessionMoved: the session lives on (it moved to another server while this request
            // was on its way); the crate keeps the session, and ephemeral nodes stay. Whether the
            // request applied is for the evidence to say, as after a lost answer.
            E::ConnectionLoss | E::Timeout | E::Custom(_) | E::Throttled | E::SessionMoved => ZkError::OutcomeUnknown,
            other => ZkError::Rejected(other.to_string()),
        }
    }
}

impl From<zkc::MultiWriteError> for ZkError {
    fn from(err: zkc::MultiWriteError) -> Self {
        zkc::Error::from(err).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_failures_mean_outcome_unknown_and_expiry_means_lost() {
        assert_eq!(ZkError::from(zkc::Error::ConnectionLoss), ZkError::OutcomeUnknown);
        assert_eq!(ZkError::from(zkc::Error::Timeout), ZkError::OutcomeUnknown);
        assert_eq!(ZkError::from(zkc::Error::SessionExpired), ZkError::SessionLost);
        assert_eq!(ZkError::from(zkc::Error::ClientClosed), ZkError::SessionLost);
        assert_eq!(ZkError::from(zkc::Error::SessionMoved), ZkError::OutcomeUnknown, "the session lives on");
        assert_eq!(ZkError::from(zkc::Error::BadVersion), ZkError::BadVersion);
        assert_eq!(ZkError::from(zkc::Error::NoAuth), ZkError::NotAuthorized);
        assert!(matches!(ZkError::from(zkc::Error::QuotaExceeded), ZkError::Rejected(_)));
        assert!(ZkError::OutcomeUnknown.is_transient());
        assert!(!ZkError::NoNode.is_transient());
    }
}
