//! Node names exactly as Curator writes them, and the order its consumers take them in.

use std::cmp::Ordering;

use crate::config::QueueKind;

/// Prefix of every Curator `DistributedQueue`-family item.
/// Longest message id (or group) a put accepts, in bytes.
pub(crate) const MAX_ID_LEN: usize = 200;

/// The ids [`is_valid_id`] accepts, as an ECMA-262 pattern (for the OpenAPI document): no character
/// ZooKeeper refuses in a node name. JSON Schema counts characters, so a pattern cannot state the
/// bound in bytes: it says [`MAX_ID_LEN`] characters, which is the bound for ASCII ids.
pub(crate) fn id_pattern() -> String {
    format!(r"^[\x20-\x7e\xa0-\ud7ff\uf900-\uffef]{{1,{MAX_ID_LEN}}}$")
}

pub(crate) const QUEUE_PREFIX: &str = "queue-";
/// Prefix of `SimpleDistributedQueue` and ZooKeeper-recipe items.
pub(crate) const SIMPLE_PREFIX: &str = "qn-";

/// What an item's name says about it, beyond its sequence number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ItemMeta {
    Plain,
    /// `DistributedPriorityQueue`: lower comes out first.
    Priority(i32),
    /// `DistributedDelayQueue`: not deliverable before this epoch-ms time (0 when unparsable, as in Curator).
    DeliverAt(i64),
    /// `DistributedIdQueue`.
    Id(String),
}

/// A parsed child of a queue node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ItemName {
    pub name: String,
    pub meta: ItemMeta,
    /// The server's sequence suffix; `i64::MAX` when it cannot be parsed (sorts last).
    pub sequence: i64,
}

/// How the names of a queue of `kind` are read and ordered. A grouped fifo queue names a grouped
/// message as Curator's `DistributedIdQueue` does (`queue-|group|sequence`), with the group in the
/// id's place, and orders its messages by sequence, as an id queue; every other queue by its kind.
pub(crate) fn naming(kind: QueueKind, grouped: bool) -> QueueKind {
    if grouped && kind == QueueKind::Fifo { QueueKind::Id } else { kind }
}

/// The group of a message of a grouped queue: the id in its name. `None` for a message put
/// without one (it belongs to no group and waits for none).
pub(crate) fn group_of(item: &ItemName) -> Option<&str> {
    match &item.meta {
        ItemMeta::Id(group) => Some(group),
        _ => None,
    }
}

/// The name prefix a put creates (the server appends the 10-digit sequence).
pub(crate) fn put_prefix(kind: QueueKind, meta: &ItemMeta) -> String {
    match (kind, meta) {
        (QueueKind::Simple, _) => SIMPLE_PREFIX.to_owned(),
        (QueueKind::Priority, ItemMeta::Priority(p)) => format!("{QUEUE_PREFIX}{}", priority_to_string(*p)),
        // A plain fifo queue names a delayed message as a delay queue does (see `parse`).
        (QueueKind::Delay | QueueKind::Fifo, ItemMeta::DeliverAt(epoch)) => format!("{QUEUE_PREFIX}|{epoch:08X}|"),
        (QueueKind::Id, ItemMeta::Id(id)) => format!("{QUEUE_PREFIX}|{}|", fix_id(id)),
        _ => QUEUE_PREFIX.to_owned(),
    }
}

/// `DistributedPriorityQueue.priorityToString`: sign digit, then 8 upper-case hex digits.
pub(crate) fn priority_to_string(priority: i32) -> String {
    let bits = u32::from_ne_bytes(priority.to_ne_bytes());
    format!("{}{bits:08X}", if priority >= 0 { '1' } else { '0' })
}

/// `DistributedIdQueue.fixId`: `/` and `|` become `_`.
pub(crate) fn fix_id(id: &str) -> String {
    id.replace(['/', '|'], "_")
}

/// The sequence ZooKeeper gave child `name` of a queue's node (a message, or its lock, which is
/// named as its message is); a node split from a putMulti node has its base's. `None` for a name
/// without one (a foreign node).
///
/// ZooKeeper numbers a node's sequential children in the order it creates them, from a counter
/// of creations alone: not the node's `cversion`, which counts deletions too and runs ahead.
pub(crate) fn sequence_of(name: &str) -> Option<i64> {
    // The server appends "%010d" of a signed int: 10 characters, a '-' included after overflow.
    // A node split from a putMulti node carries `-{index}` after it (see `split_name`).
    let name = split_base(name).unwrap_or(name);
    name.get(name.len().checked_sub(10)?..).and_then(|tail| tail.parse().ok())
}

/// The name of the node a split node came from, if `name` is one: `{base}-{4 to 9 digits}`
/// after a parsable sequence.
fn split_base(name: &str) -> Option<&str> {
    let (base, index) = name.rsplit_once('-')?;
    let sequence = base.get(base.len().checked_sub(10)?..)?;
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    ((4..=9).contains(&index.len()) && digits(index) && sequence.parse::<i64>().is_ok()).then_some(base)
}

/// The order ZooKeeper stored the message of node `name` in, as one number that grows with it:
/// its node's sequence, then (for a node split from a putMulti node) its index in that node.
/// Sequences go on across a queue deleted and made anew (`catalog.rs`), so the number never repeats
/// within a queue's name. `None` for a name without a sequence, or one past the 32-bit counter.
pub(crate) fn order_of(name: &str) -> Option<u128> {
    let sequence = u128::try_from(sequence_of(name)?).ok()?;
    let index = match split_base(name) {
        Some(base) => name.get(base.len() + 1..)?.parse::<u128>().ok()?,
        None => 0,
    };
    Some(sequence * 1_000_000_000 + index)
}

/// The `n` of `names` ZooKeeper stored first ([`order_of`]; names without a sequence are left
/// out), oldest first. Memory stays O(n) however many names there are.
pub(crate) fn oldest<'a>(names: impl IntoIterator<Item = &'a str>, n: usize) -> Vec<String> {
    let mut first: Vec<(u128, &str)> = Vec::with_capacity(n.min(64));
    for name in names {
        let Some(order) = order_of(name) else { continue };
        if first.len() >= n && first.last().is_some_and(|(last, _)| order >= *last) {
            continue;
        }
        let pos = first.partition_point(|(o, _)| *o < order);
        first.insert(pos, (order, name));
        first.truncate(n);
    }
    first.into_iter().map(|(_, name)| name.to_owned()).collect()
}

/// Whether `name` is a node split from a Curator putMulti node (named by zkq, not sequential).
pub(crate) fn is_split(name: &str) -> bool {
    split_base(name).is_some()
}

/// The name of item `index` (1-based) of the `count` items split off a Curator putMulti node
/// `name`. Curator orders `{name}-0001` right after `{name}` and before the next sequence, for
/// every kind (the sequence and delay fields keep their places); the index has one width per
/// node so the split items keep their order.
#[cfg(test)]
pub(crate) fn split_name(name: &str, index: usize, count: usize) -> String {
    split_name_with_width(name, index, split_width(count))
}

/// The width of the split indexes of a node split in one transaction into `count` items.
pub(crate) fn split_width(count: usize) -> usize {
    count.to_string().len().max(4)
}

/// The widest split index: the width zkq gives every split of a node it splits in more than one
/// transaction, so that they sort in item order whatever was left in the node at each step.
pub(crate) const WIDEST_SPLIT_INDEX: usize = 9;

/// The name of item `index` split off node `name`, the index padded to `width` digits.
pub(crate) fn split_name_with_width(name: &str, index: usize, width: usize) -> String {
    format!("{name}-{index:0width$}")
}

/// `DistributedDelayQueue.getEpoch`: hex between the last two `|`; 0 on any failure.
fn delay_epoch(name: &str) -> i64 {
    let Some(index2) = name.rfind('|') else { return 0 };
    let Some(index1) = name[..index2].rfind('|') else { return 0 };
    if index1 == 0 || index2 <= index1 + 1 {
        return 0;
    }
    i64::from_str_radix(&name[index1 + 1..index2], 16).unwrap_or(0)
}

/// `DistributedIdQueue.parseId`: the text between the first two `|`.
fn parse_id(name: &str) -> Option<String> {
    let first = name.find('|')?;
    let second = name[first + 1..].find('|')? + first + 1;
    Some(name[first + 1..second].to_owned())
}

fn parse_priority(name: &str) -> Option<i32> {
    // `get` (never indexing or `split_at`): a foreign name may hold any character here.
    let encoded = name.strip_prefix(QUEUE_PREFIX)?.get(..9)?;
    let (sign, hex) = (encoded.get(..1)?, encoded.get(1..)?);
    if !hex.bytes().all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b)) {
        return None;
    }
    let bits = u32::from_str_radix(hex, 16).ok()?;
    let value = i32::from_ne_bytes(bits.to_ne_bytes());
    match sign {
        "1" if value >= 0 => Some(value),
        "0" if value < 0 => Some(value),
        _ => None,
    }
}

/// Parses a child name of a queue of `kind`; `None` for foreign nodes (never touched).
pub(crate) fn parse(kind: QueueKind, name: &str) -> Option<ItemName> {
    let prefix = if kind == QueueKind::Simple { SIMPLE_PREFIX } else { QUEUE_PREFIX };
    if !name.starts_with(prefix) {
        return None;
    }
    let meta = match kind {
        // A delayed message of a plain fifo queue is named as a delay queue's (`queue-|HEX|seq`):
        // it sorts after every plain name, and zkq holds it back until it is due. A Curator
        // `DistributedQueue` consumer does not read the time: it takes the message at once.
        QueueKind::Fifo if name.strip_prefix(QUEUE_PREFIX).is_some_and(|rest| rest.starts_with('|')) => {
            ItemMeta::DeliverAt(delay_epoch(name))
        },
        QueueKind::Fifo | QueueKind::Simple => ItemMeta::Plain,
        // A requeued priority item (Curator drops the priority) has a plain name: it sorts first.
        QueueKind::Priority => parse_priority(name).map_or(ItemMeta::Plain, ItemMeta::Priority),
        QueueKind::Delay => ItemMeta::DeliverAt(delay_epoch(name)),
        QueueKind::Id => parse_id(name).map_or(ItemMeta::Plain, ItemMeta::Id),
    };
    Some(ItemName { name: name.to_owned(), meta, sequence: sequence_of(name).unwrap_or(i64::MAX) })
}

/// Delivery order, as a single Curator consumer of that kind takes items.
pub(crate) fn compare(kind: QueueKind, a: &ItemName, b: &ItemName) -> Ordering {
    match kind {
        // Curator sorts full names as strings: for priority names that is priority, then sequence.
        QueueKind::Fifo | QueueKind::Priority | QueueKind::Simple => a.name.cmp(&b.name),
        // Numerically by epoch (not by the hex text), then by sequence (then split index).
        QueueKind::Delay => {
            due_time(a).cmp(&due_time(b)).then(a.sequence.cmp(&b.sequence)).then_with(|| a.name.cmp(&b.name))
        },
        // By the name without `|id|`, i.e. by sequence.
        QueueKind::Id => a.sequence.cmp(&b.sequence).then_with(|| a.name.cmp(&b.name)),
    }
}

/// When an item may be delivered (epoch ms); 0 for kinds without a delay.
pub(crate) fn due_time(item: &ItemName) -> i64 {
    match item.meta {
        ItemMeta::DeliverAt(epoch) => epoch,
        _ => 0,
    }
}

// ZooKeeper's character rule is shared with config and http, so it lives on the ground floor.
pub(crate) use crate::types::refused_char;

/// Whether `id` may be a `DistributedIdQueue` id: 1 to 200 bytes, none of them refused by ZooKeeper.
pub(crate) fn is_valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN && refused_char(id).is_none()
}

/// Whether `name` can be a child of a queue of `kind` (used to check ids given in URLs).
pub(crate) fn is_item_name(kind: QueueKind, name: &str) -> bool {
    !name.contains('/') && name != "." && name != ".." && parse(kind, name).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [QueueKind; 5] =
        [QueueKind::Fifo, QueueKind::Priority, QueueKind::Delay, QueueKind::Id, QueueKind::Simple];

    /// Names that look like queue items often: a prefix, a few `|`, hex and digits, any characters.
    fn item_like() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let piece = prop_oneof![
            Just("queue-".to_owned()),
            Just("qn-".to_owned()),
            Just("|".to_owned()),
            "[0-9A-F]{1,10}",
            proptest::char::any().prop_map(String::from),
        ];
        proptest::collection::vec(piece, 0..6).prop_map(|parts| parts.concat())
    }

    fn meta_for(kind: QueueKind) -> impl proptest::strategy::Strategy<Value = ItemMeta> {
        use proptest::prelude::*;
        match kind {
            QueueKind::Priority => any::<i32>().prop_map(ItemMeta::Priority).boxed(),
            QueueKind::Delay => (1i64..=0xFFFF_FFFF_FFFF).prop_map(ItemMeta::DeliverAt).boxed(),
            QueueKind::Id => "[a-zA-Z0-9 ._é-]{1,20}".prop_map(ItemMeta::Id).boxed(),
            QueueKind::Fifo | QueueKind::Simple => Just(ItemMeta::Plain).boxed(),
        }
    }

    proptest::proptest! {
        #![proptest_config(crate::test_support::proptest_config())]

        #[test]
        fn parsing_any_name_never_panics(name in item_like(), other in proptest::prelude::any::<String>()) {
            for kind in KINDS {
                let _ = parse(kind, &name);
                let _ = parse(kind, &other);
                let _ = is_item_name(kind, &name);
            }
        }

        #[test]
        fn order_is_a_total_order(names in proptest::collection::vec(item_like(), 3)) {
            for kind in KINDS {
                let items: Vec<ItemName> = names
                    .iter()
                    .map(|n| format!("{}{n}", if kind == QueueKind::Simple { SIMPLE_PREFIX } else { QUEUE_PREFIX }))
                    .filter_map(|n| parse(kind, &n))
                    .collect();
                for a in &items {
                    proptest::prop_assert_eq!(compare(kind, a, a), Ordering::Equal);
                    for b in &items {
                        proptest::prop_assert_eq!(compare(kind, a, b), compare(kind, b, a).reverse());
                        for c in &items {
                            if compare(kind, a, b).is_le() && compare(kind, b, c).is_le() {
                                proptest::prop_assert!(compare(kind, a, c).is_le());
                            }
                        }
                    }
                }
            }
        }

        #[test]
        fn put_names_parse_back_to_their_meta(
            (kind, meta) in proptest::strategy::Strategy::prop_flat_map(proptest::sample::select(KINDS.to_vec()), |k| (proptest::strategy::Just(k), meta_for(k))),
            sequence in 0i64..=2_147_483_647,
        ) {
            let name = format!("{}{sequence:010}", put_prefix(kind, &meta));
            let parsed = parse(kind, &name);
            proptest::prop_assert!(parsed.is_some(), "{} did not parse", name);
            let parsed = parsed.unwrap_or_else(|| unreachable!());
            let expected = match (&meta, kind) {
                (ItemMeta::Id(id), _) => ItemMeta::Id(fix_id(id)),
                (other, _) => other.clone(),
            };
            proptest::prop_assert_eq!(parsed.meta, expected);
            proptest::prop_assert_eq!(parsed.sequence, sequence);
        }
    }

    #[test]
    fn priority_names_match_curator() {
        // docs/curator-format.md §2 worked examples.
        assert_eq!(priority_to_string(i32::MIN), "080000000");
        assert_eq!(priority_to_string(-255), "0FFFFFF01");
        assert_eq!(priority_to_string(-1), "0FFFFFFFF");
        assert_eq!(priority_to_string(0), "100000000");
        assert_eq!(priority_to_string(10), "10000000A");
        assert_eq!(priority_to_string(i32::MAX), "17FFFFFFF");
        let parsed = parse(QueueKind::Priority, "queue-0FFFFFFFF0000000002").expect("a queue item");
        assert_eq!(parsed.meta, ItemMeta::Priority(-1));
        assert_eq!(parsed.sequence, 2);
    }

    #[test]
    fn delay_and_id_prefixes_match_curator() {
        assert_eq!(put_prefix(QueueKind::Delay, &ItemMeta::DeliverAt(1_700_000_000_000)), "queue-|18BCFE56800|");
        assert_eq!(put_prefix(QueueKind::Id, &ItemMeta::Id("a/b|c".into())), "queue-|a_b_c|");
        let delay = parse(QueueKind::Delay, "queue-|3BB2CC3D800|0000000001").expect("item");
        assert_eq!(delay.meta, ItemMeta::DeliverAt(4_102_444_800_000));
        assert_eq!(parse(QueueKind::Delay, "queue-0000000007").expect("item").meta, ItemMeta::DeliverAt(0));
        let id = parse(QueueKind::Id, "queue-|plain|0000000001").expect("item");
        assert_eq!(id.meta, ItemMeta::Id("plain".into()));
        assert_eq!(id.sequence, 1);
    }

    #[test]
    fn foreign_nodes_are_not_items() {
        assert!(parse(QueueKind::Fifo, "foreign-node").is_none());
        assert!(parse(QueueKind::Fifo, "qn-0000000001").is_none());
        assert!(parse(QueueKind::Simple, "queue-0000000001").is_none());
        assert!(!is_item_name(QueueKind::Fifo, "../queue-1"));
    }

    #[test]
    fn order_is_curators() {
        let sorted = |kind, names: &[&str]| {
            let mut items: Vec<ItemName> = names.iter().filter_map(|n| parse(kind, n)).collect();
            items.sort_by(|a, b| compare(kind, a, b));
            items.into_iter().map(|i| i.name).collect::<Vec<_>>()
        };
        // A requeued priority item (plain name) sorts before every priority name, as in Curator.
        assert_eq!(
            sorted(
                QueueKind::Priority,
                &[
                    "queue-1000000000000000000",
                    "queue-0800000000000000003",
                    "queue-0000000009",
                    "queue-0FFFFFFFF0000000002"
                ]
            ),
            ["queue-0000000009", "queue-0800000000000000003", "queue-0FFFFFFFF0000000002", "queue-1000000000000000000"]
        );
        // Delay: numeric, not lexicographic ("FFFFFFFF" < "100000000" as numbers).
        assert_eq!(
            sorted(QueueKind::Delay, &["queue-|100000000|0000000000", "queue-|FFFFFFFF|0000000001"]),
            ["queue-|FFFFFFFF|0000000001", "queue-|100000000|0000000000"]
        );
        // Id: by sequence, whatever the id.
        assert_eq!(
            sorted(QueueKind::Id, &["queue-|zz|0000000000", "queue-|aa|0000000001"]),
            ["queue-|zz|0000000000", "queue-|aa|0000000001"]
        );
    }

    #[test]
    fn split_put_multi_items_sort_right_after_their_node_in_every_kind() {
        assert_eq!(split_name("queue-0000000042", 1, 3), "queue-0000000042-0001");
        assert_eq!(split_name("queue-0000000042", 12345, 20000), "queue-0000000042-12345");
        assert_eq!(split_name("queue-0000000042", 7, 20000), "queue-0000000042-00007");
        let cases = [
            (QueueKind::Fifo, "queue-0000000042", "queue-0000000043"),
            (QueueKind::Priority, "queue-1000000050000000042", "queue-1000000050000000043"),
            (QueueKind::Delay, "queue-|18BCFE56800|0000000042", "queue-|18BCFE56800|0000000043"),
            (QueueKind::Id, "queue-|a|0000000042", "queue-|b|0000000043"),
        ];
        for (kind, node, next) in cases {
            let names = [node.to_owned(), split_name(node, 1, 2), split_name(node, 2, 2), next.to_owned()];
            let mut items: Vec<ItemName> = names.iter().rev().filter_map(|n| parse(kind, n)).collect();
            items.sort_by(|a, b| compare(kind, a, b));
            let sorted: Vec<&str> = items.iter().map(|i| i.name.as_str()).collect();
            assert_eq!(sorted, names.iter().map(String::as_str).collect::<Vec<_>>(), "{kind:?}");
            assert_eq!(items[1].meta, items[0].meta, "{kind:?}: a split item keeps its kind fields");
            assert_eq!(items[1].sequence, 42);
        }
        assert_eq!(sequence_of("queue-0000000042-12"), None, "not a split name");
    }

    #[test]
    fn foreign_names_with_any_characters_parse_without_panicking() {
        for name in ["queue-é0000000", "queue-1é0000000", "queue-€", "queue-", "queue-|é|", "queue-||", "qn-é"] {
            for kind in [QueueKind::Fifo, QueueKind::Priority, QueueKind::Delay, QueueKind::Id, QueueKind::Simple] {
                let _ = parse(kind, name);
                let _ = is_item_name(kind, name);
            }
        }
        assert_eq!(parse(QueueKind::Priority, "queue-é0000000").map(|i| i.meta), Some(ItemMeta::Plain));
    }

    #[test]
    fn ids_may_hold_any_character_zookeeper_accepts() {
        // The rule itself is tested in types/znode.rs; here, what ids and names make of it.
        assert!(is_valid_id("order 17/é"));
        assert!(!is_valid_id("tab\there"));
        assert!(!is_valid_id(""));
    }

    #[test]
    fn a_childs_sequence_is_read_from_its_name_a_split_nodes_from_its_base() {
        assert_eq!(order_of("queue-0000000041"), Some(41_000_000_000));
        assert_eq!(order_of("queue-0000000041-0002"), Some(41_000_000_002), "a split node's index follows");
        assert!(order_of("queue-0000000041-0002") < order_of("queue-0000000042"));
        assert_eq!(order_of("queue--000000001"), None, "past the 32-bit counter");
        assert_eq!(order_of("foreign"), None);
        assert_eq!(sequence_of("queue-0000000041"), Some(41));
        assert_eq!(sequence_of("queue-10000000050000000042"), Some(42), "a priority name");
        assert_eq!(sequence_of("queue-0000000050-0001"), Some(50), "a split node is as old as its base");
        assert_eq!(sequence_of("foreign"), None);
        assert_eq!(sequence_of(""), None);
    }

    #[test]
    fn sequences_parse_including_overflow() {
        assert_eq!(sequence_of("queue-0000000042"), Some(42));
        assert_eq!(sequence_of("queue-10000000A0000000001"), Some(1));
        assert_eq!(sequence_of("qn--000000001"), Some(-1));
        assert_eq!(sequence_of("foreign"), None);
    }
}
