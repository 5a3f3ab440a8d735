//! A configuration that cannot be used, and how the loader's errors become one that names the key,
//! the value and what is allowed.

use std::fmt;

use crate::types::{CounterName, NameError, QueueName};

/// A configuration that cannot be used, with enough detail to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted key, e.g. `zookeeper.session_timeout`; empty when the error is not about one key.
    pub key: String,
    pub value: String,
    pub allowed: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "invalid configuration: {}", self.allowed)
        } else {
            write!(f, "invalid configuration: {} = {}: {}", self.key, self.value, self.allowed)
        }
    }
}

impl std::error::Error for ConfigError {}

pub(super) fn invalid(key: impl Into<String>, value: impl fmt::Debug, allowed: impl Into<String>) -> ConfigError {
    ConfigError { key: key.into(), value: format!("{value:?}"), allowed: allowed.into() }
}

/// What a key accepts, for error messages about values the types refused.
fn allowed_for(key: &str) -> &'static str {
    let last = key.rsplit('.').next().unwrap_or(key);
    // A list's entry (`zookeeper.acl[1]`) accepts what its list's entries accept.
    let last = last.split('[').next().unwrap_or(last);
    match last {
        "acl" => "entries scheme:id:perms, like world:anyone:r, auth::cdrwa or digest:app:<hash>:cdrwa",
        "format" => "one of: text, json",
        "kind" => "one of: fifo, priority, delay, id, simple",
        "dead_letter" => "the name of another queue",
        "listen" => "a socket address like 127.0.0.1:8080 or 0.0.0.0:9090",
        "queues_dynamic" | "allow_remote" => "true or false",
        "concurrency" => "a whole number like 1 or 8",
        "backoff_jitter" => "a number between 0.0 and 1.0",
        "visibility" | "backoff_initial" | "readiness_interval" => {
            "a duration written like \"20s\", \"500ms\" or \"2m\""
        },
        _ if key.ends_with("timeout")
            || key.ends_with("delay")
            || key.ends_with("wait")
            || key.ends_with("grace")
            || key.ends_with("close")
            || key.ends_with("window")
            || key.ends_with("max") =>
        {
            "a duration written like \"20s\", \"500ms\" or \"2m\""
        },
        _ => "see docs/reference/configuration.md (or `zkq reference config`)",
    }
}

/// The first name of table `table` (`queues` or `counters`) that its name type refuses: serde
/// names only the table when a key of it fails, so the key is found here, to be named as
/// `queues.NAME`.
fn refused_name(merged: &config::Config, table: &str) -> Option<ConfigError> {
    let mut names: Vec<String> = merged.get_table(table).ok()?.into_keys().collect();
    names.sort();
    let mut names = names.into_iter();
    let refused: NameError = match table {
        "queues" => names.find_map(|name| QueueName::parse(name).err()),
        "counters" => names.find_map(|name| CounterName::parse(name).err()),
        _ => None,
    }?;
    Some(invalid(format!("{table}.{}", refused.text()), refused.text(), refused.why()))
}

pub(super) fn from_config_error(err: config::ConfigError, merged: Option<&config::Config>) -> ConfigError {
    use config::ConfigError as E;
    // `At` layers carry the key the error is about; the innermost error says what is wrong.
    let mut key = String::new();
    let mut inner = &err;
    while let E::At { error, key: at, .. } = inner {
        if let Some(at) = at {
            key = at.clone();
        }
        inner = error;
    }
    let text = inner.to_string();
    match inner {
        E::Type { key: Some(at), .. } if key.is_empty() => key = at.clone(),
        // serde reports an unknown field only in its message ("unknown field `x`, expected ...").
        E::Message(message) if message.starts_with("unknown field") => {
            let field = message.split('`').nth(1).unwrap_or("?");
            let key = if key.is_empty() { field.to_owned() } else { format!("{key}.{field}") };
            return ConfigError {
                key,
                value: "(set)".to_owned(),
                allowed: format!(
                    "unknown key; unknown keys are errors, check the spelling against the README ({text})"
                ),
            };
        },
        // A required key left out.
        E::NotFound(missing) => {
            return ConfigError { key: missing.clone(), value: "(not set)".to_owned(), allowed: "required".to_owned() };
        },
        E::FileParse { uri, .. } => {
            let file = uri.clone().unwrap_or_default();
            return ConfigError { key: "--config".to_owned(), value: file, allowed: format!("not valid TOML: {text}") };
        },
        _ => {},
    }
    if let Some(refused) = merged.and_then(|merged| refused_name(merged, &key)) {
        return refused;
    }
    let value =
        merged.and_then(|m| m.get_string(&key).ok()).map_or_else(|| "(unreadable)".to_owned(), |v| format!("{v:?}"));
    if key.is_empty() {
        return ConfigError { key, value, allowed: text };
    }
    ConfigError { allowed: format!("{} ({text})", allowed_for(&key)), key, value }
}
