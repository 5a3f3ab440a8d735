//! Names of queues and counters: one URL segment and one ZooKeeper node name. Parsed once where
//! they enter (a request's path, the configuration, `zkq inspect`'s argument), trusted after; a
//! counter's name is another type than a queue's, so one cannot be passed as the other.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

/// Longest queue or counter name accepted, in bytes.
pub(crate) const MAX_NAME_LEN: usize = 200;

/// The names [`check_name`] accepts, as an ECMA-262 pattern (for the OpenAPI document).
pub(crate) fn name_pattern() -> String {
    format!(r"^(?!\.{{1,2}}$)[A-Za-z0-9._-]{{1,{MAX_NAME_LEN}}}$")
}

/// What may appear as one URL segment and one ZooKeeper node name; the error says what is allowed.
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err("must be 1 to 200 characters");
    }
    if name == "." || name == ".." {
        return Err("must not be . or ..");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        return Err("may contain only A-Z a-z 0-9 . _ -");
    }
    Ok(())
}

/// A refused name: `queue name "a b" may contain only A-Z a-z 0-9 . _ -`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} name {text:?} {why}")]
pub struct NameError {
    /// `queue` or `counter`.
    kind: &'static str,
    text: String,
    why: &'static str,
}

impl NameError {
    /// The refused text, as given.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// What the rule allows, without the name: `must be 1 to 200 characters`.
    pub fn why(&self) -> &'static str {
        self.why
    }
}

/// Declares a checked name type: a `String` that passed [`check_name`], usable wherever a `&str`
/// is read (`Deref`, `AsRef`, `Borrow`, so a map keyed by names is looked up with a `&str`).
macro_rules! name_type {
    ($(#[doc = $doc:literal])+ $name:ident, $kind:literal) => {
        $(#[doc = $doc])+
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// Checks `text` against the name rule.
            pub fn parse(text: impl Into<String>) -> Result<$name, NameError> {
                let text = text.into();
                match check_name(&text) {
                    Ok(()) => Ok($name(text)),
                    Err(why) => Err(NameError { kind: $kind, text, why }),
                }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;

            fn try_from(text: String) -> Result<$name, NameError> {
                $name::parse(text)
            }
        }

        impl FromStr for $name {
            type Err = NameError;

            fn from_str(text: &str) -> Result<$name, NameError> {
                $name::parse(text)
            }
        }

        impl From<$name> for String {
            fn from(name: $name) -> String {
                name.0
            }
        }

        impl Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        /// As its text: `{:?}` of a name reads `"orders"`, as it did when names were strings.
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        /// Through [`TryFrom<String>`], refused inside the visitor (not after it, as
        /// `#[serde(try_from)]` would): a deserializer that knows where it is then names the
        /// place, as axum names the path parameter.
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<$name, D::Error> {
                struct Visitor;

                impl serde::de::Visitor<'_> for Visitor {
                    type Value = $name;

                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str(concat!("a ", $kind, " name"))
                    }

                    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<$name, E> {
                        $name::parse(text).map_err(E::custom)
                    }

                    fn visit_string<E: serde::de::Error>(self, text: String) -> Result<$name, E> {
                        $name::parse(text).map_err(E::custom)
                    }
                }

                deserializer.deserialize_str(Visitor)
            }
        }
    };
}

name_type! {
    /// A queue's name: 1–200 characters of `A-Z a-z 0-9 . _ -`, not `.` or `..`.
    QueueName, "queue"
}

name_type! {
    /// A counter's name: the same rule as a queue's, another type.
    CounterName, "counter"
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;

    #[test]
    fn names_follow_the_url_segment_rule() {
        for good in ["orders", "orders.v2_high-prio", "a", "...", "-", &"x".repeat(200)] {
            assert_eq!(QueueName::parse(good).map(String::from).as_deref(), Ok(good));
            assert!(CounterName::parse(good).is_ok(), "{good:?} is a counter name too");
        }
        for bad in ["", ".", "..", "a/b", "a b", "ü", "a\0", "%2F", &"x".repeat(201)] {
            assert!(QueueName::parse(bad).is_err(), "{bad:?} must be refused");
            assert!(CounterName::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn a_refusal_says_which_name_and_why() {
        let err = QueueName::parse("a b").expect_err("a space");
        assert_eq!(err.to_string(), r#"queue name "a b" may contain only A-Z a-z 0-9 . _ -"#);
        assert_eq!((err.text(), err.why()), ("a b", "may contain only A-Z a-z 0-9 . _ -"));
        let err = CounterName::parse("").expect_err("empty");
        assert_eq!(err.to_string(), r#"counter name "" must be 1 to 200 characters"#);
        let err = "..".parse::<QueueName>().expect_err("dot dot");
        assert_eq!(err.to_string(), r#"queue name ".." must not be . or .."#);
    }

    #[test]
    fn a_name_reads_as_its_text() {
        let name = QueueName::parse("orders").expect("valid");
        assert_eq!(name.as_str(), "orders");
        assert_eq!(&*name, "orders");
        assert_eq!(name, "orders");
        assert_eq!(name.to_string(), "orders");
        assert_eq!(format!("{name:?}"), r#""orders""#, "quoted in messages as the text was");
        let by_name: HashMap<QueueName, u32> = HashMap::from([(name.clone(), 1)]);
        assert_eq!(by_name.get("orders"), Some(&1), "a map keyed by names is read with a &str");
        let sorted: BTreeMap<CounterName, u32> = BTreeMap::from([(CounterName::parse("b").expect("valid"), 2)]);
        assert_eq!(sorted.get("b"), Some(&2));
    }

    #[test]
    fn serde_takes_only_valid_names() {
        let name: QueueName = serde_json::from_str(r#""orders""#).expect("valid");
        assert_eq!(serde_json::to_string(&name).expect("serializes"), r#""orders""#);
        let err = serde_json::from_str::<QueueName>(r#""a/b""#).expect_err("refused at load");
        assert!(err.to_string().contains(r#"queue name "a/b" may contain only"#), "{err}");
        let map: BTreeMap<CounterName, i32> = serde_json::from_str(r#"{"hits": 1}"#).expect("valid keys");
        assert_eq!(map.get("hits"), Some(&1));
        let err = serde_json::from_str::<BTreeMap<CounterName, i32>>(r#"{"..": 1}"#).expect_err("a bad key");
        assert!(err.to_string().contains(r#"counter name ".." must not be . or .."#), "{err}");
    }
}
