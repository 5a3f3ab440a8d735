//! The configuration reference page: every key with its type, default, environment variable,
//! flag and meaning. Keys and defaults come from the configuration types themselves (their
//! serialization walked from `Config::default()`); the meanings are the table below, and the
//! test in this module fails when a key is missing from it or it names a key that is gone.

use std::collections::BTreeMap;

use clap::Args;
use serde_json::Value;

use crate::config::{AppUrl, Config, CounterConfig, Overrides, PushConfig, QueueConfig};

/// One key's row: dotted key (maps as `NAME`), type, the default to show where the types hold
/// none (an `Option` or an empty string), and what the key does.
struct Key {
    key: &'static str,
    kind: &'static str,
    default: Option<&'static str>,
    meaning: &'static str,
}

const fn key(key: &'static str, kind: &'static str, meaning: &'static str) -> Key {
    Key { key, kind, default: None, meaning }
}

const fn key_or(key: &'static str, kind: &'static str, default: &'static str, meaning: &'static str) -> Key {
    Key { key, kind, default: Some(default), meaning }
}

/// Every key, in the order the page lists them.
const KEYS: &[Key] = &[
    key("zookeeper.connect", "string", "connect string, `host:port[,host:port…][/chroot]`"),
    key("zookeeper.session_timeout", "duration", "session timeout asked of the server (2s–10m)"),
    key("zookeeper.request_timeout", "duration", "deadline of one ZooKeeper call made for a request"),
    key(
        "zookeeper.root",
        "ZooKeeper path",
        "where zkq keeps dynamic queues and counters, locks, claim markers, delivery counts and idempotency records",
    ),
    key("zookeeper.auth_digest", "secret string", "`user:password` for `digest` auth, sent on every (re)connection"),
    key("zookeeper.reconnect_backoff_max", "duration", "cap of the reconnect backoff while ZooKeeper is down"),
    key(
        "zookeeper.jute_maxbuffer",
        "bytes",
        "the servers' `jute.maxbuffer`, 1048575 (Java's default) to 67108864: raise it only once every server runs \
         with that `-Djute.maxbuffer` or more, since a server drops the connection of a larger request. zkq sends no \
         request over this less 4096; it bounds `api.max_message_bytes` and `api.max_batch_bytes`. See \
         [messages over 1 MB](../queues.md#messages-over-1-mb)",
    ),
    key_or(
        "zookeeper.acl",
        "list of strings",
        "`[\"auth::cdrwa\"]` with credentials, else `[\"world:anyone:cdrwa\"]`",
        "ACL of every node zkq creates, `scheme:id:perms` entries; checked at start, see [ACLs](../security.md#acls)",
    ),
    key("zookeeper.tls.enabled", "boolean", "reach every server of `connect` over TLS (its `secureClientPort`)"),
    key(
        "zookeeper.tls.ca_file",
        "file path",
        "PEM bundle of the CAs that sign the servers' certificates (CRLs allowed); required with TLS",
    ),
    key(
        "zookeeper.tls.cert_file",
        "file path",
        "PEM client certificate chain, for mutual TLS; with `key_file` or not at all",
    ),
    key(
        "zookeeper.tls.key_file",
        "file path",
        "the client certificate's key (PKCS#8, PKCS#1 or SEC1); with `cert_file` or not at all",
    ),
    key(
        "zookeeper.tls.verify_hostname",
        "boolean",
        "check that each server's certificate names the host it is reached by",
    ),
    key(
        "zookeeper.tls.reload_interval",
        "duration",
        "how often the TLS files are read again (1s–24h); changed, valid certificates serve every new connection",
    ),
    key("zookeeper.sasl.mechanism", "`DIGEST-MD5`", "SASL authentication of the session; none means no SASL"),
    key("zookeeper.sasl.username", "string", "the user of the server's JAAS `Server` section"),
    key("zookeeper.sasl.password", "secret string", "the SASL password; exactly one of `password` and `password_file`"),
    key("zookeeper.sasl.password_file", "file path", "a file holding the SASL password (trailing line breaks ignored)"),
    key("api.listen", "address", "queue API; loopback: the app in the pod is the client"),
    key(
        "api.max_message_bytes",
        "bytes",
        "largest message body, 1 to `zookeeper.jute_maxbuffer` less 48575 (1000000 with Java's default): a message \
         is one znode",
    ),
    key(
        "api.max_delay",
        "duration",
        "longest `?delay=` (and furthest `?deliver_at=`) of a put to a delay queue; beyond it, 400",
    ),
    key(
        "api.max_connections",
        "integer",
        "connections served at once; when all are held, a new connection gets the slot of one without a request in flight (never finished a head first, then idle, longest waiting first), else waits in the listen backlog ([Connections](../api.md#connections))",
    ),
    key(
        "api.max_concurrent_requests",
        "integer",
        "requests handled at once (long-polls included); beyond it 503 `overloaded` with `Retry-After`",
    ),
    key(
        "api.header_read_timeout",
        "duration",
        "time a client has to finish a request's headers once it sent their first byte (slowloris); then the connection is closed",
    ),
    key(
        "api.body_read_timeout",
        "duration",
        "time a client has to send a request's whole body once its headers arrived (a stalled or trickled upload); then 408 `request_timeout`, nothing done, and the connection is closed",
    ),
    key(
        "api.idle_timeout",
        "duration",
        "a connection that sends nothing for this long, new or after its last response, is closed (a request being handled, a long-poll included, never counts as idle)",
    ),
    key(
        "api.max_peek_bytes",
        "bytes",
        "message bytes one peek answers at most: it stops before the next body would pass it, but always shows the first message",
    ),
    key(
        "api.max_batch",
        "integer",
        "messages one batch request carries at most (batch put, `?max=` on take and lease, batch ack); 1–1000, beyond it 400",
    ),
    key(
        "api.max_batch_bytes",
        "bytes",
        "message bytes of one batch put (one ZooKeeper transaction: 1024 to three quarters of \
         `zookeeper.jute_maxbuffer`, 786432 with Java's default) and of one `?max=` answer (the first message is always taken); a larger batch put answers 413",
    ),
    key(
        "api.token_file",
        "file path",
        "a file holding the API token (printable ASCII, trailing line breaks ignored; read at start): every API request must send it in `zkq-api-token`, else 401",
    ),
    key("api.refuse_cross_origin", "boolean", "refuse (403) requests a web browser sends for a page of another origin"),
    key("admin.listen", "address", "`/livez`, `/readyz`, `/metrics`"),
    key("admin.max_connections", "integer", "as `api.max_connections`, for the admin listener"),
    key("admin.header_read_timeout", "duration", "as `api.header_read_timeout`, for the admin listener"),
    key("admin.idle_timeout", "duration", "as `api.idle_timeout`, for the admin listener"),
    key("log.format", "`text` or `json`", "log line format (on stderr)"),
    key("log.level", "string", "a `tracing` filter, e.g. `zkq=debug,info`"),
    key("take.max_wait", "duration", "longest wait of a take or a put; a longer `?wait=` is cut to it"),
    key(
        "take.claim_marker_age",
        "duration",
        "a claim marker this old by ZooKeeper's clock (its `ctime`) was left by a stopped zkq and is removed; \
         a lost answer still unsettled after three quarters of it is given up (logged), never guessed \
         (at least twice `zookeeper.request_timeout`)",
    ),
    key("lease.default_visibility", "duration", "visibility timeout of a lease that asks for none"),
    key(
        "lease.max_visibility",
        "duration",
        "longest visibility a lease or extend may ask for (longer is cut to it; shorter than 1s is raised to 1s)",
    ),
    key(
        "lease.max_per_queue",
        "integer",
        "leases one queue may have out at once (bounds memory); beyond it a lease answers 429 `too_many_leases` with `Retry-After`",
    ),
    key("shutdown.grace", "duration", "time to drain on SIGTERM/SIGINT before exiting anyway"),
    key_or(
        "sqs.listen",
        "address",
        "none: not served",
        "address of the [SQS-compatible API](../sqs.md) (AWS SDKs, the AWS CLI); without `sqs.access_key_id` it checks no signatures: keep it on loopback",
    ),
    key("sqs.account_id", "12 digits", "the account id in queue URLs and ARNs"),
    key("sqs.region", "region name", "the region in queue ARNs"),
    key_or(
        "sqs.access_key_id",
        "string",
        "none: any signature",
        "the access key id every SQS request must be signed with (AWS Signature Version 4); with `sqs.secret_access_key_file`, and required with `api.token_file`",
    ),
    key_or("sqs.secret_access_key_file", "path", "none", "file holding the secret access key of `sqs.access_key_id`"),
    key(
        "sqs.binary_bodies",
        "`base64` or `refuse`",
        "what `ReceiveMessage` does with a body that is not SQS text (not UTF-8, or characters SQS refuses) on a queue without its own `sqs_binary_bodies`: hands it out base64-encoded, or refuses it (released at once for other consumers; past `max_deliveries` it moves to `dead_letter`)",
    ),
    key("queues_dynamic", "boolean", "create undeclared queues on their first put"),
    key(
        "queues_dynamic_grouped",
        "boolean",
        "dynamic queues are [grouped](../groups.md) fifo queues (every zkq on the ensemble must say the same)",
    ),
    key(
        "max_dynamic_queues",
        "integer",
        "cap on dynamic queues (bounds memory and metric labels); a put to a new queue beyond it answers 404 `queue_not_found`",
    ),
    key(
        "queue_idle_close",
        "duration",
        "a dynamic queue unused this long (no request, waiting taker or lease) is closed and its slot released; it reopens on the next request",
    ),
    key(
        "queues_watch_on_demand",
        "boolean",
        "watch a queue's children and locks only while this zkq has a taker, lease request or peek there (and for 30 s after): a sidecar that only puts then receives none of the queue's events ([sizing a fleet](../fleet.md)); grouped, `max_items` and dead-lettering queues are always watched",
    ),
    key(
        "queues_fleet_watchers",
        "integer",
        "at most this many of the sidecars that take from a queue watch it and own its new messages, the same ones in every sidecar's view; the others stand by (no watch, no events) until a watching one asks for help because messages it owns waited unclaimed at two looks a second apart (a backlog); 0: every sidecar that takes watches ([sizing a fleet](../fleet.md)); grouped, delay, `max_items` and dead-lettering queues are watched by every member",
    ),
    key("counters_dynamic", "boolean", "create undeclared counters on their first set or add"),
    key_or("counters.NAME.path", "ZooKeeper path", "`{root}/counters/NAME`", "the counter's ZooKeeper path"),
    key("counters.NAME.seed", "32-bit integer", "value written only if the node does not exist"),
    key(
        "queues.NAME.kind",
        "`fifo`, `priority`, `delay`, `id` or `simple`",
        "the Curator recipe the queue follows ([queue kinds](../queues.md))",
    ),
    key_or(
        "queues.NAME.path",
        "ZooKeeper path",
        "`{root}/queues/NAME`",
        "the queue's ZooKeeper path (not at or under `{root}/idempotency`, where zkq keeps its idempotency records; nor is `lock_path`)",
    ),
    key_or(
        "queues.NAME.lock_path",
        "ZooKeeper path",
        "`{root}/locks/NAME` for undeclared paths, else none",
        "Curator's lock path (none for `simple` queues); leases need one",
    ),
    key(
        "queues.NAME.max_items",
        "integer",
        "puts wait (up to `?wait=`) while the queue holds this many children; `zkq check-config` recommends one",
    ),
    key(
        "queues.NAME.max_deliveries",
        "integer",
        "leases after which a message moves to `dead_letter` (needs `dead_letter`)",
    ),
    key(
        "queues.NAME.dead_letter",
        "queue name",
        "the queue that receives messages past `max_deliveries` and undecodable nodes",
    ),
    key(
        "queues.NAME.idempotency_window",
        "duration",
        "how long a put's `Idempotency-Key` is remembered (10s–1h; undeclared queues use the default)",
    ),
    key_or(
        "queues.NAME.retention",
        "duration",
        "none: kept until consumed",
        "how long a message is kept, from its node's creation (ZooKeeper's clock): older ones are deleted, never delivered (1s–14d; see [retention](../queues.md#retention))",
    ),
    key(
        "queues.NAME.grouped",
        "boolean",
        "[message groups](../groups.md): each message may carry a group; one message of a group in flight at a time, in put order, groups in parallel (`fifo` and `id` queues; needs a lock path)",
    ),
    key_or(
        "queues.NAME.sqs_binary_bodies",
        "`base64` or `refuse`",
        "`sqs.binary_bodies`",
        "this queue's answer to a body that is not SQS text, through the [SQS-compatible API](../sqs.md)",
    ),
    key_or(
        "queues.NAME.push.url",
        "URL",
        "none: required in a `push` table",
        "[push delivery](../push.md) to `http://host[:port][/path]` (no TLS, no credentials, at most 2048 bytes); the host must be loopback (`127.0.0.1`, `[::1]`, `localhost`) unless `allow_remote`; the queue needs a lock path (not `simple`)",
    ),
    key(
        "queues.NAME.push.allow_remote",
        "boolean",
        "allow a `url` or `readiness_url` off the pod (messages then travel as plain HTTP)",
    ),
    key(
        "queues.NAME.push.concurrency",
        "integer",
        "deliveries in flight at once from this zkq (1–1000, at most `lease.max_per_queue`); 1 keeps Curator's order",
    ),
    key(
        "queues.NAME.push.visibility",
        "duration",
        "each delivery's lease (1s–`lease.max_visibility`), extended while the app's request is open",
    ),
    key(
        "queues.NAME.push.request_timeout",
        "duration",
        "time the app has to answer a delivery, connection included (100ms–1h)",
    ),
    key(
        "queues.NAME.push.backoff_initial",
        "duration",
        "first pause after a failed delivery or a failed connection, doubling each time (10ms–1h)",
    ),
    key(
        "queues.NAME.push.backoff_max",
        "duration",
        "longest pause (`backoff_initial`–1h); an app's `Retry-After` is honoured beyond it, up to 1 hour",
    ),
    key(
        "queues.NAME.push.backoff_jitter",
        "number",
        "each pause is shortened by up to this fraction at random (0.0–1.0)",
    ),
    key(
        "queues.NAME.push.readiness_url",
        "URL",
        "deliver only while a GET of this URL answers 2xx (same rules as `url`)",
    ),
    key("queues.NAME.push.readiness_interval", "duration", "how often `readiness_url` is asked (100ms–1h)"),
    key(
        "queues.NAME.push.content_type",
        "string",
        "`Content-Type` of every delivery (1–256 printable ASCII characters): Curator's format stores no type per message",
    ),
    key(
        "queues.NAME.push.event_type",
        "string",
        "CloudEvents `ce-type` of each delivery (1–256 printable ASCII characters)",
    ),
];

/// Every key the configuration types serialize, with its default: `Config::default()`, and one
/// declared queue (with push delivery and the default idempotency window) and counter under `NAME`.
fn serialized_defaults() -> Result<BTreeMap<String, Value>, serde_json::Error> {
    let mut keys = BTreeMap::new();
    let mut top = serde_json::to_value(Config::default())?;
    if let Value::Object(map) = &mut top {
        map.remove("queues");
        map.remove("counters");
    }
    walk("", &top, &mut keys);
    let mut queue: QueueConfig = serde_json::from_value(serde_json::json!({}))?;
    // `url` has no default (key_or says so); any URL stands in for it here.
    let url = AppUrl::parse("http://127.0.0.1/").map_err(serde::de::Error::custom)?;
    queue.push = Some(PushConfig::to(url));
    queue.idempotency_window = Some(Config::default().idempotency_window("NAME"));
    walk("queues.NAME", &serde_json::to_value(queue)?, &mut keys);
    keys.insert("queues.NAME.push.url".to_owned(), Value::Null);
    // Unset, it is `sqs.binary_bodies` (key_or says so).
    keys.insert("queues.NAME.sqs_binary_bodies".to_owned(), Value::Null);
    keys.insert("queues.NAME.retention".to_owned(), Value::Null);
    let counter: CounterConfig = serde_json::from_value(serde_json::json!({}))?;
    walk("counters.NAME", &serde_json::to_value(counter)?, &mut keys);
    Ok(keys)
}

fn walk(prefix: &str, value: &Value, keys: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) => {
            for (name, value) in map {
                let key = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
                walk(&key, value, keys);
            }
        },
        leaf => {
            keys.insert(prefix.to_owned(), leaf.clone());
        },
    }
}

/// The flag that overrides each key, read from the flags' help, which names the key in
/// parentheses (`(zookeeper.connect)`).
fn flags() -> BTreeMap<String, String> {
    let command = Overrides::augment_args(clap::Command::new("zkq"));
    let mut flags = BTreeMap::new();
    for arg in command.get_arguments() {
        let (Some(long), Some(help)) = (arg.get_long(), arg.get_help()) else { continue };
        let help = help.to_string();
        if let Some(key) = help.split_once('(').and_then(|(_, rest)| rest.split_once(')')).map(|(key, _)| key) {
            flags.insert(key.to_owned(), format!("--{long}"));
        }
    }
    flags
}

/// The environment variable of a key: `ZKQ__` and the key's parts joined by `__`, upper case.
fn env_var(key: &str, kind: &str) -> String {
    if kind.starts_with("list") {
        return "(TOML only)".to_owned();
    }
    format!("`ZKQ__{}`", key.replace('.', "__").to_ascii_uppercase())
}

fn show_default(value: Option<&Value>, fallback: Option<&str>) -> String {
    match (value, fallback) {
        (Some(Value::Null) | None, Some(text)) => text.to_owned(),
        (Some(Value::String(value)), Some(text)) if value.is_empty() => text.to_owned(),
        (Some(Value::Null) | None, None) => "none".to_owned(),
        (Some(Value::String(value)), None) if value.is_empty() => "none".to_owned(),
        (Some(Value::String(value)), _) => format!("`{value}`"),
        (Some(other), _) => format!("`{other}`"),
    }
}

/// The configuration reference page (`docs/reference/configuration.md`), as
/// `zkq reference config` prints it.
pub(super) fn configuration_markdown() -> Result<String, serde_json::Error> {
    let defaults = serialized_defaults()?;
    let flags = flags();
    let mut page = String::from(
        "# Configuration keys\n\n\
         <!-- Generated by `zkq reference config` from the configuration types and their defaults; do not edit. -->\n\n\
         Layers, lowest first: these defaults, the TOML file given by `--config`, the environment variables, \
         the flags. Everything is checked before any port is bound; a bad value or an unknown key exits with \
         status 64 naming the key. Durations are written like `\"20s\"`, `\"5m\"`, `\"30days\"`; `NAME` is a \
         declared queue's or counter's name. [Configuration](../configuration.md) explains the layers, \
         `zkq check-config` and worked examples.\n\n\
         | key | type | default | environment | flag | meaning |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    for row in KEYS {
        let flag = flags.get(row.key).map(|flag| format!("`{flag}`")).unwrap_or_default();
        page.push_str(&format!(
            "| `{}` | {} | {} | {} | {flag} | {} |\n",
            row.key,
            row.kind,
            show_default(defaults.get(row.key), row.default),
            env_var(row.key, row.kind),
            row.meaning.replace('|', "\\|"),
        ));
    }
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_every_key_the_configuration_has_and_no_other() {
        let defaults = serialized_defaults().expect("serializes");
        let listed: Vec<&str> = KEYS.iter().map(|row| row.key).collect();
        let missing: Vec<&String> = defaults.keys().filter(|key| !listed.contains(&key.as_str())).collect();
        assert!(missing.is_empty(), "keys without a row in src/reference/config.rs: {missing:?}");
        let gone: Vec<&&str> = listed.iter().filter(|key| !defaults.contains_key(**key)).collect();
        assert!(gone.is_empty(), "rows in src/reference/config.rs for keys the configuration no longer has: {gone:?}");
        for (key, flag) in flags() {
            assert!(listed.contains(&key.as_str()), "{flag} names {key}, which has no row");
        }
        assert_eq!(flags().len(), 6, "every flag but --config names its key: {:?}", flags());
    }

    #[test]
    fn durations_shown_as_defaults_parse_as_durations() {
        let defaults = serialized_defaults().expect("serializes");
        for row in KEYS.iter().filter(|row| row.kind == "duration") {
            if let Some(Value::String(text)) = defaults.get(row.key) {
                assert!(humantime::parse_duration(text).is_ok(), "{}: {text}", row.key);
            }
        }
    }

    #[test]
    fn every_environment_variable_shown_sets_its_key() {
        let env = std::collections::HashMap::from([
            ("ZKQ__API__MAX_BATCH".to_owned(), "7".to_owned()),
            ("ZKQ__ZOOKEEPER__TLS__RELOAD_INTERVAL".to_owned(), "2m".to_owned()),
            ("ZKQ__MAX_DYNAMIC_QUEUES".to_owned(), "9".to_owned()),
        ]);
        let config = Config::load_with_env(&Overrides::default(), env).expect("loads");
        assert_eq!(config.api.max_batch, 7);
        assert_eq!(config.zookeeper.tls.reload_interval, std::time::Duration::from_secs(120));
        assert_eq!(config.max_dynamic_queues, 9);
    }
}
