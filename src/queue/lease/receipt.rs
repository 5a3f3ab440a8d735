//! Lease receipts: what a client holds to ack, nack or extend a lease.
//!
//! A receipt is the ZooKeeper session id (16 hex digits) and a token (32 hex digits): a sequence
//! number and a MAC of it under a key of this process. So a receipt this process issued and that
//! has ended is told apart from one it never issued (409 against 404) without remembering ended
//! leases, and nobody can forge a live one.

use std::hash::BuildHasher;

/// The MAC key of this process's receipts.
#[derive(Default)]
pub(super) struct ReceiptKey(std::hash::RandomState);

impl ReceiptKey {
    fn mac(&self, session_id: i64, sequence: u64) -> u64 {
        self.0.hash_one((session_id, sequence))
    }

    /// The token of lease number `sequence` of `session_id`.
    pub(super) fn token(&self, session_id: i64, sequence: u64) -> u128 {
        (u128::from(sequence) << 64) | u128::from(self.mac(session_id, sequence))
    }

    /// Whether this process issued `token` for `session_id`.
    pub(super) fn issued(&self, session_id: i64, token: u128) -> bool {
        let sequence = u64::try_from(token >> 64).unwrap_or(u64::MAX);
        let mac = u64::try_from(token & u128::from(u64::MAX)).unwrap_or(0);
        self.mac(session_id, sequence) == mac
    }
}

/// The text of a receipt.
pub(super) fn format(session_id: i64, token: u128) -> String {
    format!("{:016x}{token:032x}", u64::from_ne_bytes(session_id.to_ne_bytes()))
}

/// Parses a receipt; `None` unless it is exactly 48 lower-case hex digits.
pub(super) fn parse(text: &str) -> Option<(i64, u128)> {
    if text.len() != 48 || !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let (session, token) = (text.get(..16)?, text.get(16..)?);
    let session = u64::from_str_radix(session, 16).ok()?;
    let token = u128::from_str_radix(token, 16).ok()?;
    Some((i64::from_ne_bytes(session.to_ne_bytes()), token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_round_trip_and_refuse_garbage() {
        let text = format(0x1000_0123_4567_89ab, 42);
        assert_eq!(text.len(), 48);
        assert_eq!(parse(&text), Some((0x1000_0123_4567_89ab, 42)));
        let negative = format(-5, u128::MAX);
        assert_eq!(parse(&negative), Some((-5, u128::MAX)));
        for bad in ["", "xyz", &"g".repeat(48), &text[..47], &text.to_uppercase(), &"é".repeat(24)] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn tokens_are_recognised_only_by_the_process_and_session_that_issued_them() {
        let key = ReceiptKey::default();
        let (token, second) = (key.token(7, 0), key.token(7, 1));
        assert_ne!(token, second);
        assert!(key.issued(7, token) && key.issued(7, second));
        assert!(!key.issued(8, token), "bound to its session");
        assert!(!key.issued(7, token ^ 1), "a forged MAC");
        assert!(!ReceiptKey::default().issued(7, token), "another process's key");
        assert!(!key.issued(0, 0), "all zeros was never issued");
    }
}
