//! Lease receipts: what a client holds to ack, nack or extend a lease.
//!
//! A receipt is the ZooKeeper session id (16 hex digits) and a token (32 hex digits): a sequence
//! number and a MAC of it under a key of this process. So a receipt this process issued and that
//! has ended is told apart from one it never issued (409 against 404) without remembering ended
//! leases, and nobody can forge a live one (the MAC is HMAC-SHA256 under a random key of the process).

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The MAC key of this process's receipts: 32 random bytes, made at start, never shown.
pub(super) struct ReceiptKey([u8; 32]);

impl Default for ReceiptKey {
    fn default() -> ReceiptKey {
        ReceiptKey(rand::random())
    }
}

impl ReceiptKey {
    /// HMAC-SHA256 of the session id and the sequence, cut to its first 8 bytes.
    #[expect(clippy::expect_used, reason = "HMAC accepts a key of any length: new_from_slice cannot fail")]
    fn mac(&self, session_id: i64, sequence: u64) -> [u8; 8] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC accepts a key of any length");
        mac.update(&session_id.to_be_bytes());
        mac.update(&sequence.to_be_bytes());
        let tag = mac.finalize().into_bytes();
        let mut first = [0u8; 8];
        first.copy_from_slice(tag.get(..8).unwrap_or(&[0; 8]));
        first
    }

    /// The token of lease number `sequence` of `session_id`.
    pub(super) fn token(&self, session_id: i64, sequence: u64) -> u128 {
        (u128::from(sequence) << 64) | u128::from(u64::from_be_bytes(self.mac(session_id, sequence)))
    }

    /// Whether this process issued `token` for `session_id` (compared in constant time).
    pub(super) fn issued(&self, session_id: i64, token: u128) -> bool {
        let sequence = u64::try_from(token >> 64).unwrap_or(u64::MAX);
        let mac = u64::try_from(token & u128::from(u64::MAX)).unwrap_or(0).to_be_bytes();
        self.mac(session_id, sequence).ct_eq(&mac).into()
    }
}

/// A lease receipt as a client sends it back, parsed once where it enters (an HTTP path, a batch
/// ack's entry, a push delivery's own grant): a ZooKeeper session id and a token. Any receipt of
/// the right shape parses; whether this process issued it is for the lease table to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Receipt {
    pub(super) session_id: i64,
    pub(super) token: u128,
}

impl Receipt {
    pub(super) fn new(session_id: i64, token: u128) -> Receipt {
        Receipt { session_id, token }
    }
}

/// Why a text is not a receipt: anything but exactly 48 lower-case hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a lease receipt is the 48 lower-case hex digits of a zkq-lease header")]
pub(crate) struct MalformedReceipt;

impl std::str::FromStr for Receipt {
    type Err = MalformedReceipt;

    fn from_str(text: &str) -> Result<Receipt, MalformedReceipt> {
        if text.len() != 48 || !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(MalformedReceipt);
        }
        let (session, token) = (text.get(..16).ok_or(MalformedReceipt)?, text.get(16..).ok_or(MalformedReceipt)?);
        let session = u64::from_str_radix(session, 16).map_err(|_| MalformedReceipt)?;
        let token = u128::from_str_radix(token, 16).map_err(|_| MalformedReceipt)?;
        Ok(Receipt { session_id: i64::from_ne_bytes(session.to_ne_bytes()), token })
    }
}

impl std::fmt::Display for Receipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}{:032x}", u64::from_ne_bytes(self.session_id.to_ne_bytes()), self.token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_round_trip_and_refuse_garbage() {
        let text = Receipt::new(0x1000_0123_4567_89ab, 42).to_string();
        assert_eq!(text.len(), 48);
        assert_eq!(text.parse(), Ok(Receipt::new(0x1000_0123_4567_89ab, 42)));
        let negative = Receipt::new(-5, u128::MAX).to_string();
        assert_eq!(negative.parse(), Ok(Receipt::new(-5, u128::MAX)));
        for bad in ["", "xyz", &"g".repeat(48), &text[..47], &text.to_uppercase(), &"é".repeat(24)] {
            assert_eq!(bad.parse::<Receipt>(), Err(MalformedReceipt), "{bad:?}");
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
