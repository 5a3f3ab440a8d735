//! The format of a key's record and the names around it: pure, no I/O. Everything read back from
//! ZooKeeper is untrusted here: a record, bucket or node name that does not parse is `None`, never
//! a panic.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::queue::PutOptions;

/// Longest key accepted, in bytes.
pub(crate) const MAX_KEY_LEN: usize = 200;
/// Format version of a record.
const RECORD_FORMAT: u32 = 1;
/// Width of an expiry bucket, in milliseconds: a record is swept at most this long after it
/// expired (plus the sweep period).
const BUCKET_MS: i64 = 1000;

/// Whether `key` may be an idempotency key: 1 to 200 bytes of visible ASCII (`!` to `~`).
/// The keys [`is_valid_key`] accepts, as an ECMA-262 pattern (for the OpenAPI document).
pub(crate) fn key_pattern() -> String {
    format!(r"^[\x21-\x7e]{{1,{MAX_KEY_LEN}}}$")
}

pub(crate) fn is_valid_key(key: &[u8]) -> bool {
    (1..=MAX_KEY_LEN).contains(&key.len()) && key.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// The record of a key, as stored in its node (JSON). Everything in it is read back as untrusted:
/// a record that does not parse is treated as expired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Record {
    /// Format version ([`RECORD_FORMAT`]).
    v: u32,
    /// The key itself, so that a hash collision is noticed instead of replayed.
    pub(super) key: String,
    /// SHA-256 of what the put stores (body, priority, id), hex.
    pub(super) fingerprint: String,
    /// Epoch ms (the writer's clock) after which the key is free again.
    pub(super) expires_at: i64,
    /// The expiry bucket holding this record's index entry.
    pub(super) bucket: String,
    /// Unique to the transaction that wrote the record: evidence after a lost answer.
    pub(super) token: String,
    /// The message among the nodes its transaction created ([`struct@Copy`]): the hash of its node's
    /// name prefix and data, and which of its unit's identical nodes it is.
    pub(super) content: String,
    pub(super) copy: u32,
    pub(super) copies: u32,
    /// The message's node name, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) message_id: Option<String>,
}

impl Record {
    /// The record a put writes with its message: the name is not known yet (the server appends
    /// the sequence when the transaction applies).
    pub(super) fn new(key: String, fingerprint: String, expires_at: i64, token: String, copy: &Copy) -> Record {
        Record {
            v: RECORD_FORMAT,
            key,
            fingerprint,
            expires_at,
            bucket: bucket_of(expires_at),
            token,
            content: copy.content.clone(),
            copy: copy.copy,
            copies: copy.copies,
            message_id: None,
        }
    }

    /// The same record, naming its message.
    pub(super) fn named(&self, message_id: &str) -> Record {
        Record { message_id: Some(message_id.to_owned()), ..self.clone() }
    }

    /// A record as read from its node; `None` for anything else (another format version, not
    /// JSON, a field missing or of another type).
    pub(super) fn parse(data: &[u8]) -> Option<Record> {
        serde_json::from_slice::<Record>(data).ok().filter(|r| r.v == RECORD_FORMAT)
    }

    pub(super) fn to_bytes(&self) -> Vec<u8> {
        // A struct of strings and integers always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The message among those one transaction created: the hash of its node (name prefix and data),
/// and which of the `copies` identical nodes of its unit it is (in the order of the unit's ops).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Copy {
    pub(super) content: String,
    pub(super) copy: u32,
    pub(super) copies: u32,
}

/// The fingerprint of what a put stores: SHA-256 over the body, the priority and the id (the
/// delivery time is left out: a relative `delay` differs at every retry).
pub(super) fn fingerprint(body: &[u8], options: &PutOptions) -> String {
    let mut hash = Sha256::new();
    hash.update(b"zkq-put-1\0");
    hash.update((body.len() as u64).to_be_bytes());
    hash.update(body);
    match options.priority {
        Some(priority) => {
            hash.update(b"p");
            hash.update(priority.to_be_bytes());
        },
        None => hash.update(b"-"),
    }
    match &options.id {
        Some(id) => {
            hash.update(b"i");
            hash.update((id.len() as u64).to_be_bytes());
            hash.update(id.as_bytes());
        },
        None => hash.update(b"-"),
    }
    hex(&hash.finalize())
}

pub(super) fn key_hash(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    hex(digest.get(..16).unwrap_or(&digest))
}

fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// The bucket (its end, epoch ms, as a node name) of a record expiring at `expires_at`.
pub(super) fn bucket_of(expires_at: i64) -> String {
    let end = (expires_at.max(0) / BUCKET_MS).saturating_add(1).saturating_mul(BUCKET_MS);
    format!("{end:015}")
}

/// The end (epoch ms) a bucket's name says; `None` for foreign names.
pub(super) fn bucket_end(name: &str) -> Option<i64> {
    if name.len() != 15 || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The hash of a node as a put creates it: its name's prefix (without the sequence) and its data.
pub(super) fn content_of(prefix: &str, data: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(b"zkq-node-1\0");
    hash.update((prefix.len() as u64).to_be_bytes());
    hash.update(prefix.as_bytes());
    hash.update(data);
    let digest = hash.finalize();
    hex(digest.get(..16).unwrap_or(&digest))
}

/// The prefix a sequential node's name was created with: the name without its 10-digit sequence.
pub(super) fn created_prefix(name: &str) -> Option<&str> {
    let cut = name.len().checked_sub(10)?;
    let (prefix, sequence) = (name.get(..cut)?, name.get(cut..)?);
    sequence.bytes().all(|b| b.is_ascii_digit()).then_some(prefix)
}

/// The name `copy` stands for among `block` (the nodes one transaction created, in sequence order,
/// with their contents): the `copy`-th node of its content when exactly `copies` such are there;
/// `None` when fewer are (consumed since) or more (another put stored the same node in that
/// transaction, and `copy` counts only its own unit's), as the name cannot be told then.
pub(super) fn pick(block: &[(String, String)], copy: &Copy) -> Option<String> {
    let same: Vec<&String> =
        block.iter().filter(|(_, content)| *content == copy.content).map(|(name, _)| name).collect();
    if same.len() != usize::try_from(copy.copies).unwrap_or(usize::MAX) {
        return None;
    }
    same.get(usize::try_from(copy.copy).unwrap_or(usize::MAX)).map(|name| (*name).clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_one_to_two_hundred_bytes_of_visible_ascii() {
        assert!(is_valid_key(b"order-42"));
        assert!(is_valid_key(b"!~"));
        assert!(is_valid_key(&[b'k'; 200]));
        for bad in [&b""[..], &[b'k'; 201], b"a b", b"tab\there", b"caf\xc3\xa9", b"\x7f", b"new\nline"] {
            assert!(!is_valid_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn fingerprints_tell_bodies_priorities_and_ids_apart_but_not_delays() {
        let plain = PutOptions::default();
        let base = fingerprint(b"body", &plain);
        assert_eq!(base, fingerprint(b"body", &plain));
        assert_eq!(base.len(), 64);
        assert_ne!(base, fingerprint(b"body2", &plain));
        assert_ne!(base, fingerprint(b"body", &PutOptions { priority: Some(0), ..PutOptions::default() }));
        assert_ne!(base, fingerprint(b"body", &PutOptions { id: Some(String::new()), ..PutOptions::default() }));
        assert_eq!(base, fingerprint(b"body", &PutOptions { deliver_at: Some(5), ..PutOptions::default() }));
        // The length prefix keeps body and fields apart.
        assert_ne!(
            fingerprint(b"p", &PutOptions::default()),
            fingerprint(b"", &PutOptions { priority: Some(0), ..PutOptions::default() })
        );
    }

    #[test]
    fn record_names_are_stable_hex_hashes_of_the_key() {
        // SHA-256("abc") starts ba7816bf8f01cfea414140de5dae2223.
        assert_eq!(key_hash("abc"), "ba7816bf8f01cfea414140de5dae2223");
        assert_ne!(key_hash("abc"), key_hash("abd"));
    }

    #[test]
    fn buckets_end_after_their_records_expire_and_sort_by_name() {
        assert_eq!(bucket_of(1_732_370_000_000), "001732370001000");
        assert_eq!(bucket_of(1_732_370_000_999), "001732370001000");
        assert_eq!(bucket_end(&bucket_of(1_732_370_000_500)), Some(1_732_370_001_000));
        assert!(bucket_of(999) < bucket_of(1_000));
        for foreign in ["", "12", "00173237000100x", "0017323700010000", "é"] {
            assert_eq!(bucket_end(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn records_round_trip_and_anything_else_does_not_parse() {
        let copy = Copy { content: content_of("queue-", b"x"), copy: 0, copies: 1 };
        let record = Record::new("k".into(), "f".into(), 7, "t".into(), &copy);
        assert_eq!((record.bucket.as_str(), record.message_id.as_ref()), (bucket_of(7).as_str(), None));
        assert_eq!(Record::parse(&record.to_bytes()), Some(record.clone()));
        let named = record.named("queue-0000000001");
        assert_eq!(named.message_id.as_deref(), Some("queue-0000000001"));
        assert_eq!(Record::parse(&named.to_bytes()), Some(named.clone()));
        let future = Record { v: 2, ..named };
        assert_eq!(Record::parse(&future.to_bytes()), None, "an unknown format is not trusted");
        for garbage in [&b""[..], b"{}", b"\xff\x00", b"[1,2]", b"{\"v\":1}"] {
            assert_eq!(Record::parse(garbage), None);
        }
    }

    #[test]
    fn a_node_is_known_by_its_name_prefix_and_data() {
        assert_eq!(created_prefix("queue-0000000042"), Some("queue-"));
        assert_eq!(created_prefix("queue-5-0000000042"), Some("queue-5-"));
        for foreign in ["", "000000004", "queue-00000000x2", "xé000000004"] {
            assert_eq!(created_prefix(foreign), None, "{foreign:?}");
        }
        let base = content_of("queue-", b"body");
        assert_eq!(base.len(), 32);
        assert_ne!(base, content_of("queue-1-", b"body"), "another priority is another node");
        assert_ne!(base, content_of("queue-", b"body2"));
        // The length prefix keeps name and data apart.
        assert_ne!(content_of("queue-a", b"b"), content_of("queue-", b"ab"));
    }

    #[test]
    fn identical_nodes_of_one_transaction_are_told_apart_by_their_order_while_all_are_there() {
        let (a, b) = (content_of("queue-", b"a"), content_of("queue-", b"b"));
        let block: Vec<(String, String)> =
            [("queue-0000000010", &a), ("queue-0000000011", &b), ("queue-0000000012", &a)]
                .into_iter()
                .map(|(name, content)| (name.to_owned(), content.clone()))
                .collect();
        let of = |content: &String, copy, copies| Copy { content: content.clone(), copy, copies };
        assert_eq!(pick(&block, &of(&b, 0, 1)).as_deref(), Some("queue-0000000011"));
        assert_eq!(pick(&block, &of(&a, 0, 2)).as_deref(), Some("queue-0000000010"));
        assert_eq!(pick(&block, &of(&a, 1, 2)).as_deref(), Some("queue-0000000012"));
        // Another unit stored the same node, or one of ours was consumed: not told apart.
        assert_eq!(pick(&block, &of(&a, 0, 1)), None);
        assert_eq!(pick(&block, &of(&a, 2, 3)), None);
        assert_eq!(pick(&block, &of(&content_of("queue-", b"c"), 0, 1)), None);
        assert_eq!(pick(&[], &of(&b, 0, 1)), None);
    }

    proptest::proptest! {
        #![proptest_config(crate::test_support::proptest_config())]

        /// Whatever a node holds, reading it as a record (or its name as a bucket or a created
        /// node) answers, and never panics.
        #[test]
        fn reading_anything_never_panics(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
            text in ".{0,40}",
        ) {
            let _ = Record::parse(&data);
            let _ = Record::parse(text.as_bytes());
            let _ = bucket_end(&text);
            let _ = created_prefix(&text);
        }

        #[test]
        fn records_round_trip_whatever_they_hold(
            key in "[!-~]{1,200}",
            expires_at in proptest::prelude::any::<i64>(),
            token in ".{0,40}",
            content in ".{0,40}",
            (copy, copies) in (0u32..1000, 1u32..1000),
            name in proptest::option::of(".{0,40}"),
        ) {
            let record = Record::new(key, "f".repeat(64), expires_at, token, &Copy { content, copy, copies });
            let record = match name {
                Some(name) => record.named(&name),
                None => record,
            };
            proptest::prop_assert_eq!(Record::parse(&record.to_bytes()), Some(record));
        }

        /// The sweeper takes a bucket's name for its end, and the names sort as the ends do.
        #[test]
        fn every_record_expires_before_its_bucket_ends(a in 0i64..999_999_999_998_000, b in 0i64..999_999_999_998_000) {
            let end = bucket_end(&bucket_of(a));
            proptest::prop_assert!(end.is_some_and(|end| a < end && end <= a + BUCKET_MS), "{a}: {end:?}");
            proptest::prop_assert_eq!(bucket_of(a).cmp(&bucket_of(b)), (a / BUCKET_MS).cmp(&(b / BUCKET_MS)));
        }

        #[test]
        fn a_sequential_name_gives_back_its_prefix(prefix in "[a-z0-9-]{0,20}", sequence in 0u32..=u32::MAX) {
            let name = format!("{prefix}{sequence:010}");
            proptest::prop_assert_eq!(created_prefix(&name), Some(prefix.as_str()));
        }
    }
}
