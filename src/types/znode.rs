//! What ZooKeeper itself accepts: characters in a path, and the size of one packet.

/// Java's default `jute.maxbuffer`: the largest reply (including a child list) a Curator client reads.
pub(crate) const JUTE_MAXBUFFER_BYTES: u64 = 0xfffff;

/// Whether ZooKeeper refuses `c` in a path (`PathUtils.validatePath`, which checks UTF-16 units):
/// U+0000–U+001F, U+007F–U+009F, U+D800–U+F8FF, U+FFF0–U+FFFF, and every character above U+FFFF
/// (Java stores those as surrogates, U+D800–U+DFFF).
pub(crate) fn zookeeper_refuses(c: char) -> bool {
    matches!(u32::from(c), 0x00..=0x1F | 0x7F..=0x9F | 0xD800..=0xF8FF | 0xFFF0..)
}

/// The first character of `text` that ZooKeeper refuses in a node name, if any.
pub(crate) fn refused_char(text: &str) -> Option<char> {
    text.chars().find(|&c| zookeeper_refuses(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_characters_follow_zookeepers_path_rules() {
        for bad in ['\u{0}', '\u{1f}', '\u{7f}', '\u{9f}', '\u{e000}', '\u{f8ff}', '\u{fff0}', '\u{ffff}', '😀'] {
            assert!(zookeeper_refuses(bad), "{:?} must be refused", bad);
        }
        for good in ['a', ' ', '~', '\u{a0}', 'é', '\u{f900}', '\u{ffef}'] {
            assert!(!zookeeper_refuses(good), "{:?} is allowed", good);
        }
        assert_eq!(refused_char("/app/x\u{e000}y"), Some('\u{e000}'));
        assert_eq!(refused_char("/app/é"), None);
    }
}
