//! Curator's `ItemSerializer` payload: `00010001`, then `01 <len:i32 BE> <bytes>` per item, then `02`.

/// `ItemSerializer.VERSION`.
const VERSION: [u8; 4] = [0x00, 0x01, 0x00, 0x01];
const ITEM_OPCODE: u8 = 0x01;
const EOF_OPCODE: u8 = 0x02;

/// Wraps items the way Curator's `put` (one item) and `putMulti` (several) do.
pub fn encode<'a>(items: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&VERSION);
    for item in items {
        out.push(ITEM_OPCODE);
        // Items are bounded by api.max_message_bytes (≤ 1 MB), far below i32::MAX.
        let len = i32::try_from(item.len()).unwrap_or(i32::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(item);
    }
    out.push(EOF_OPCODE);
    out
}

/// The bytes after the envelope's EOF opcode (where zkq keeps a message's attributes, see
/// `attributes.rs`); empty when there are none or `data` is not an envelope.
pub fn after_end(data: &[u8]) -> &[u8] {
    let Some(mut cursor) = data.strip_prefix(&VERSION) else { return &[] };
    loop {
        match cursor.split_first() {
            Some((&EOF_OPCODE, rest)) => return rest,
            Some((&ITEM_OPCODE, after)) => {
                let Some(len) = after.get(..4).and_then(|b| <[u8; 4]>::try_from(b).ok()).map(i32::from_be_bytes) else {
                    return &[];
                };
                let Some(rest) = usize::try_from(len).ok().and_then(|len| after.get(4 + len..)) else { return &[] };
                cursor = rest;
            },
            _ => return &[],
        }
    }
}

/// The length of [`encode`]'s output for items of these lengths: the version and the end
/// marker, then an opcode and a length before each item.
pub fn encoded_len(item_lens: impl IntoIterator<Item = usize>) -> usize {
    VERSION.len() + 1 + item_lens.into_iter().map(|len| 1 + 4 + len).sum::<usize>()
}

/// Why a node's data is not Curator's envelope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("does not start with Curator's version 00010001")]
    BadVersion,
    #[error("unknown opcode {0:#04x}")]
    BadOpcode(u8),
    #[error("negative item length")]
    NegativeLength,
    #[error("ends before the EOF opcode")]
    Truncated,
    /// gzip-compressed (Curator 5.8+ `enableCompression()`); not supported.
    #[error("is gzip-compressed (Curator enableCompression), which zkq does not read")]
    Compressed,
}

/// Reads every item, in order, as Curator's `ItemSerializer.deserialize` does
/// (bytes after the EOF opcode are ignored, as there).
pub fn decode(data: &[u8]) -> Result<Vec<Vec<u8>>, DecodeError> {
    if data.starts_with(&[0x1f, 0x8b]) {
        return Err(DecodeError::Compressed);
    }
    let Some(rest) = data.strip_prefix(&VERSION) else {
        return Err(DecodeError::BadVersion);
    };
    let mut items = Vec::new();
    let mut cursor = rest;
    loop {
        let (&opcode, after) = cursor.split_first().ok_or(DecodeError::Truncated)?;
        match opcode {
            EOF_OPCODE => return Ok(items),
            ITEM_OPCODE => {
                let len_bytes: [u8; 4] =
                    after.get(..4).and_then(|b| b.try_into().ok()).ok_or(DecodeError::Truncated)?;
                let len = i32::from_be_bytes(len_bytes);
                let len = usize::try_from(len).map_err(|_| DecodeError::NegativeLength)?;
                let body = after.get(4..4 + len).ok_or(DecodeError::Truncated)?;
                items.push(body.to_vec());
                cursor = &after[4 + len..];
            },
            other => return Err(DecodeError::BadOpcode(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_after_the_end_are_found_and_ignored_by_decode() {
        let mut data = encode([b"hi".as_slice(), b"there".as_slice()]);
        assert!(after_end(&data).is_empty());
        data.extend_from_slice(b"ZKQA");
        assert_eq!(after_end(&data), b"ZKQA");
        assert_eq!(decode(&data), Ok(vec![b"hi".to_vec(), b"there".to_vec()]));
        assert!(after_end(b"not an envelope").is_empty());
        assert!(after_end(&[0, 1, 0, 1, 1, 0x7f, 0xff, 0xff, 0xff]).is_empty(), "a length past the end");
    }

    proptest::proptest! {
        #![proptest_config(crate::test_support::proptest_config())]

        #[test]
        fn decoding_any_bytes_never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = decode(&data);
        }

        #[test]
        fn decoding_an_envelope_with_trailing_junk_gives_its_items(
            items in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..64), 0..8),
            junk in proptest::collection::vec(proptest::num::u8::ANY, 0..32),
        ) {
            let mut data = encode(items.iter().map(Vec::as_slice));
            let valid_len = data.len();
            for end in 0..valid_len {
                proptest::prop_assert!(decode(&data[..end]).is_err(), "prefix of {} bytes decoded", end);
            }
            data.extend_from_slice(&junk);
            proptest::prop_assert_eq!(decode(&data), Ok(items));
        }
    }

    fn hex(bytes: &[u8]) -> String {
        hex::encode(bytes)
    }

    #[test]
    fn matches_curators_verified_bytes() {
        // Observed with Curator 5.4.0 (docs/curator-format.md §1.2).
        assert_eq!(hex(&encode([b"hi".as_slice()])), "000100010100000002686902");
        assert_eq!(hex(&encode([b"".as_slice()])), "00010001010000000002");
        assert_eq!(hex(&encode([b"a".as_slice(), b"bc".as_slice()])), "000100010100000001610100000002626302");
    }

    #[test]
    fn decodes_single_multi_and_empty_items() {
        assert_eq!(decode(&encode([b"hi".as_slice()])), Ok(vec![b"hi".to_vec()]));
        assert_eq!(
            decode(&encode([b"a".as_slice(), b"".as_slice(), b"bc".as_slice()])),
            Ok(vec![b"a".to_vec(), vec![], b"bc".to_vec()])
        );
        let mut trailing = encode([b"x".as_slice()]);
        trailing.extend_from_slice(b"junk");
        assert_eq!(decode(&trailing), Ok(vec![b"x".to_vec()]));
    }

    #[test]
    fn refuses_what_curator_refuses() {
        assert_eq!(decode(b"raw bytes"), Err(DecodeError::BadVersion));
        assert_eq!(decode(&[0, 1, 0, 1, 9]), Err(DecodeError::BadOpcode(9)));
        assert_eq!(decode(&[0, 1, 0, 1, 1, 0xff, 0xff, 0xff, 0xff]), Err(DecodeError::NegativeLength));
        assert_eq!(decode(&[0, 1, 0, 1, 1, 0, 0, 0, 5, b'a']), Err(DecodeError::Truncated));
        assert_eq!(decode(&[0, 1, 0, 1]), Err(DecodeError::Truncated));
        assert_eq!(decode(&[0x1f, 0x8b, 8, 0]), Err(DecodeError::Compressed));
    }
}
