//! Typed configuration: built-in defaults < TOML file < `ZKQ__SECTION__KEY` environment < flags.
//!
//! This is the only module that reads the environment (`load.rs`). Everything is validated by
//! [`Config::validate`] (`validate.rs`) before any port is bound or ZooKeeper is contacted; a
//! failure names the key, the offending value and what is allowed (`error.rs`), and `main` exits
//! with status 64. The files the configuration names are read by `secrets.rs`, also before start.
//!
//! Invariant: config imports nothing of zkq but the ground floor (`crate::types`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

// The vocabulary lives on the ground floor; these paths keep working for the modules that name it here.
pub use crate::types::AppUrl;
pub use crate::types::acl::{AclEntry, NodeAcl, acl_perms};
pub(crate) use crate::types::{CounterName, JUTE_MAXBUFFER_BYTES, QueueName};
pub use crate::types::{QueueKind, Secret};
pub use error::ConfigError;
pub use load::Overrides;
pub use secrets::{FileSecrets, SqsKeyPair, read_secret_files};

mod error;
mod load;
mod secrets;
#[cfg(test)]
mod tests;
mod validate;

/// Exit status for a configuration error (`EX_USAGE` from sysexits.h).
pub const EXIT_CONFIG: i32 = 64;

/// The whole effective configuration of one zkq process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub zookeeper: ZookeeperConfig,
    pub api: ApiConfig,
    pub admin: AdminConfig,
    /// The SQS-compatible listener (`[sqs]`; off unless `sqs.listen` is set).
    pub sqs: SqsConfig,
    pub log: LogConfig,
    pub take: TakeConfig,
    pub lease: LeaseConfig,
    pub shutdown: ShutdownConfig,
    /// Whether queues that are not declared under `[queues]` are created on first use.
    pub queues_dynamic: bool,
    /// Dynamic queues are grouped fifo queues (`queues.NAME.grouped`).
    pub queues_dynamic_grouped: bool,
    /// Cap on the number of dynamic queues one process serves (bounds metric labels and memory).
    pub max_dynamic_queues: usize,
    /// A dynamic queue nobody used (no request, waiting taker or lease) for this long is closed:
    /// its tasks end and its slot under `max_dynamic_queues` is released.
    #[serde(with = "humantime_serde")]
    pub queue_idle_close: Duration,
    /// A queue's children and locks are watched only while this process has a taker or a read
    /// there (and 30 s after), so a sidecar that only puts receives none of its events.
    pub queues_watch_on_demand: bool,
    /// At most how many sidecars of a queue's fleet watch it and own its new messages (0: every
    /// sidecar that takes from it); the others stand by until one asks for help.
    pub queues_fleet_watchers: usize,
    /// Declared queues, by name.
    pub queues: BTreeMap<QueueName, QueueConfig>,
    /// Whether counters that are not declared under `[counters]` are created on first use.
    pub counters_dynamic: bool,
    /// Declared shared counters, by name.
    pub counters: BTreeMap<CounterName, CounterConfig>,
}

/// A shared counter (Curator `SharedCount`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CounterConfig {
    /// Absolute ZooKeeper path; default `{root}/counters/{name}`.
    pub path: Option<String>,
    /// Value written only if the node does not exist yet (as Curator's seed).
    #[serde(default)]
    pub seed: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ZookeeperConfig {
    /// Connect string: `host:port[,host:port...]`, optionally followed by a chroot `/path`.
    pub connect: String,
    /// Session timeout asked of the server (the server may clamp it to its own bounds).
    #[serde(with = "humantime_serde")]
    pub session_timeout: Duration,
    /// Deadline for a single ZooKeeper call made on behalf of a request.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Absolute path under which zkq keeps its own nodes (dynamic queues, locks, counters).
    pub root: String,
    /// Optional `digest` credentials `user:password`; a secret, never printed.
    pub auth_digest: Option<Secret>,
    /// Upper bound of the reconnect backoff while ZooKeeper is unreachable.
    #[serde(with = "humantime_serde")]
    pub reconnect_backoff_max: Duration,
    /// The servers' `jute.maxbuffer` (Java's default unless they run with `-Djute.maxbuffer`):
    /// the largest request a server reads. zkq sends none larger than this less 4 KiB; it bounds
    /// `api.max_message_bytes` and `api.max_batch_bytes`.
    pub jute_maxbuffer: usize,
    /// ACL of every node zkq creates, as `scheme:id:perms` entries. None: `auth::cdrwa` (only
    /// sessions with zkq's credentials) when credentials are configured, else `world:anyone:cdrwa`.
    pub acl: Option<Vec<AclEntry>>,
    /// TLS on the connection to ZooKeeper.
    pub tls: ZkTlsConfig,
    /// SASL authentication of the session.
    pub sasl: ZkSaslConfig,
}

/// TLS to ZooKeeper (its `secureClientPort`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ZkTlsConfig {
    /// Every server of `zookeeper.connect` is reached over TLS.
    pub enabled: bool,
    /// PEM bundle of the CA certificates that sign the servers' certificates (CRLs allowed).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for servers with `ssl.clientAuth=need` (mutual TLS).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file` (PKCS#8, PKCS#1 or SEC1); never logged.
    pub key_file: Option<PathBuf>,
    /// Check that each server's certificate names the host it was reached by.
    pub verify_hostname: bool,
    /// How often the three files are read again; changed certificates serve the next connection.
    #[serde(with = "humantime_serde")]
    pub reload_interval: Duration,
}

impl Default for ZkTlsConfig {
    fn default() -> Self {
        ZkTlsConfig {
            enabled: false,
            ca_file: None,
            cert_file: None,
            key_file: None,
            verify_hostname: true,
            reload_interval: Duration::from_secs(60),
        }
    }
}

/// SASL authentication to ZooKeeper.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ZkSaslConfig {
    /// The mechanism; none means no SASL.
    pub mechanism: Option<SaslMechanism>,
    /// The user of the server's JAAS `Server` section (`user_<name>="..."`).
    pub username: Option<String>,
    /// The password; a secret, never printed. Exactly one of `password` and `password_file`.
    pub password: Option<Secret>,
    /// A file holding the password (a mounted Secret); trailing line breaks are ignored.
    pub password_file: Option<PathBuf>,
}

/// SASL mechanisms zkq speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SaslMechanism {
    /// DIGEST-MD5, what ZooKeeper's `DigestLoginModule` serves.
    #[serde(rename = "DIGEST-MD5", alias = "digest-md5")]
    DigestMd5,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Address of the queue API. Loopback by default: the app in the same pod is the client.
    pub listen: SocketAddr,
    /// Largest message body accepted by a put, in bytes (after Curator's envelope it must fit a znode).
    pub max_message_bytes: usize,
    /// Longest `delay` (and furthest `deliver_at`) a put to a delay queue may ask for.
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
    /// Connections served at once; when all are held, one without a request in flight is closed
    /// for a new connection (docs/api.md, Connections), else it waits in the listen backlog.
    pub max_connections: usize,
    /// Requests handled at once; further ones are answered 503 `overloaded` at once.
    pub max_concurrent_requests: usize,
    /// Time a client has to finish a request's headers once it sent their first byte.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection that sends nothing for this long (new, or after its last response) is closed.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Time a client has to send a request's whole body once its headers arrived; then 408.
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// Message bytes one peek answers at most (at least one message is always shown).
    pub max_peek_bytes: usize,
    /// Messages one batch request (batch put, `?max=` take or lease, batch ack) carries at most.
    pub max_batch: usize,
    /// Message bytes of one batch put, and of one batch take or lease answer (at least one
    /// message is always taken); a batch put is one ZooKeeper transaction, which must stay under
    /// the server's `jute.maxbuffer` (1 MiB by default).
    pub max_batch_bytes: usize,
    /// A file holding the API token (a mounted Secret): when set, every API request must carry
    /// it in the `zkq-api-token` header. Read once at start.
    pub token_file: Option<PathBuf>,
    /// Refuse requests a web browser sends for a page of another origin (`Origin` or
    /// `Sec-Fetch-Site` headers), so no web page can use the loopback API.
    pub refuse_cross_origin: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Address of `/livez`, `/readyz` and `/metrics`.
    pub listen: SocketAddr,
    /// Connections served at once; when all are held, one without a request in flight is closed
    /// for a new connection (docs/api.md, Connections), else it waits in the listen backlog.
    pub max_connections: usize,
    /// Time a client has to finish a request's headers once it sent their first byte.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection that sends nothing for this long (new, or after its last response) is closed.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
}

/// The SQS-compatible API: AWS SDKs, the AWS CLI and SQS workers use zkq's queues through it
/// (docs/sqs.md). Its connection limits are the API listener's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SqsConfig {
    /// Address of the SQS-compatible listener; none (the default) serves none.
    pub listen: Option<SocketAddr>,
    /// The account id in queue URLs and ARNs (12 digits).
    pub account_id: String,
    /// The region in queue ARNs.
    pub region: String,
    /// The access key id SQS requests must be signed with (AWS Signature Version 4), with the
    /// secret of `secret_access_key_file`; both or neither, and both when `api.token_file` is
    /// set. Without them any signature, or none, is accepted.
    pub access_key_id: Option<String>,
    /// A file holding the secret access key of `access_key_id`.
    pub secret_access_key_file: Option<PathBuf>,
    /// How `ReceiveMessage` hands out a body that is not SQS text, on a queue whose own
    /// `sqs_binary_bodies` says nothing (dynamic queues).
    pub binary_bodies: BinaryBodies,
}

/// What the SQS-compatible API does with a message body that is not SQS text (not UTF-8, or with
/// characters SQS refuses): Curator producers write any bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BinaryBodies {
    /// Received base64-encoded (standard alphabet), never altered.
    #[default]
    Base64,
    /// Not handed out through SQS: released at once, so it waits for another consumer (zkq's own
    /// API, Curator) or, past `max_deliveries`, moves to the dead-letter queue.
    Refuse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A `tracing` filter such as `info` or `zkq=debug,info`.
    pub level: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TakeConfig {
    /// Longest `wait` a long-polling take or lease may ask for.
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
    /// Age (by ZooKeeper's clock: a marker's `ctime`) after which a claim marker counts as left
    /// by a zkq that stopped mid-claim and is removed; a settlement of a lost answer stops
    /// trusting a missing marker before that.
    #[serde(with = "humantime_serde")]
    pub claim_marker_age: Duration,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseConfig {
    /// Visibility timeout of a lease when the request gives none.
    #[serde(with = "humantime_serde")]
    pub default_visibility: Duration,
    /// Longest visibility a lease or an extend may ask for.
    #[serde(with = "humantime_serde")]
    pub max_visibility: Duration,
    /// Leases one queue may have out at once; beyond it a lease answers 429 `too_many_leases`.
    pub max_per_queue: usize,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            default_visibility: Duration::from_secs(30),
            max_visibility: Duration::from_secs(12 * 3600),
            max_per_queue: 10_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// Time allowed on SIGTERM/SIGINT to finish puts and release leases before exiting anyway.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    #[serde(default = "default_kind")]
    pub kind: QueueKind,
    /// Absolute ZooKeeper path of the queue; default `{root}/queues/{name}`.
    pub path: Option<String>,
    /// Absolute ZooKeeper path of Curator's lock nodes; default `{root}/locks/{name}`
    /// (none for `simple` queues, which Curator never locks).
    pub lock_path: Option<String>,
    /// Puts wait (up to their `wait`) while the queue holds this many children.
    pub max_items: Option<u32>,
    /// Deliveries (leases) after which a message moves to `dead_letter` instead.
    pub max_deliveries: Option<u32>,
    /// Queue that receives messages past `max_deliveries`, and undecodable nodes.
    pub dead_letter: Option<QueueName>,
    /// Push delivery to the app (`[queues.NAME.push]`); none: the app pulls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<PushConfig>,
    /// How long a put's `Idempotency-Key` is remembered (default [`DEFAULT_IDEMPOTENCY_WINDOW`]).
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub idempotency_window: Option<Duration>,
    /// Messages carry a group key: strict put order and one message in flight per group, groups
    /// in parallel (fifo and id queues; see docs/groups.md).
    #[serde(default)]
    pub grouped: bool,
    /// How the SQS-compatible API hands out a body that is not SQS text; default
    /// `sqs.binary_bodies`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqs_binary_bodies: Option<BinaryBodies>,
    /// How long a message is kept, from its node's creation: older ones are deleted, never
    /// delivered ([`MIN_RETENTION`] to [`MAX_RETENTION`]). None: kept until consumed.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub retention: Option<Duration>,
}

/// The shortest and longest `queues.NAME.retention` (SQS's longest `MessageRetentionPeriod`).
pub const MIN_RETENTION: Duration = Duration::from_secs(1);
pub const MAX_RETENTION: Duration = Duration::from_secs(1_209_600);

/// How long an `Idempotency-Key` is remembered when the queue's configuration says nothing.
pub const DEFAULT_IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(300);
/// The shortest and longest `queues.NAME.idempotency_window`. After a lost answer, a put trusts
/// "my record is not there" as "not stored" only within half its window (another zkq's clock may
/// run up to half a window ahead and sweep the record sooner): 10 s leaves 5 s of clock skew and
/// of time to ask. ZooKeeper holds one record per key in memory for the whole window, so a long
/// window costs the ensemble put rate × window nodes.
pub const MIN_IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(10);
pub const MAX_IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(3600);

fn default_kind() -> QueueKind {
    QueueKind::Fifo
}

/// Push delivery of a declared queue: zkq leases each message and POSTs it to the app, which
/// needs no consumer loop of its own (`[queues.NAME.push]`). `url` is required; every other key
/// has a default ([`PushConfig::to`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushConfig {
    /// The app's endpoint, `http://host:port/path`; a loopback host unless `allow_remote`.
    pub url: AppUrl,
    /// Allow a `url` or `readiness_url` whose host is not loopback (messages travel unencrypted).
    #[serde(default)]
    pub allow_remote: bool,
    /// Deliveries in flight at once from this zkq; 1 keeps Curator's order for a single consumer.
    #[serde(default = "push_defaults::concurrency")]
    pub concurrency: usize,
    /// Visibility of each delivery's lease; extended while the app's request is still open.
    #[serde(with = "humantime_serde", default = "push_defaults::thirty_seconds")]
    pub visibility: Duration,
    /// Time the app has to answer one delivery (connect, request and answer).
    #[serde(with = "humantime_serde", default = "push_defaults::thirty_seconds")]
    pub request_timeout: Duration,
    /// First pause after a failed delivery (or while the app cannot be reached); doubles each time.
    #[serde(with = "humantime_serde", default = "push_defaults::one_second")]
    pub backoff_initial: Duration,
    /// Longest pause between attempts (an app's `Retry-After` may ask for more, up to an hour).
    #[serde(with = "humantime_serde", default = "push_defaults::backoff_max")]
    pub backoff_max: Duration,
    /// Each pause is shortened by up to this fraction (0.0 to 1.0) at random.
    #[serde(default = "push_defaults::backoff_jitter")]
    pub backoff_jitter: f64,
    /// Optional: zkq delivers only while a GET of this URL answers 2xx.
    #[serde(default)]
    pub readiness_url: Option<AppUrl>,
    /// How often `readiness_url` is asked.
    #[serde(with = "humantime_serde", default = "push_defaults::one_second")]
    pub readiness_interval: Duration,
    /// `Content-Type` of each delivery (zkq stores bodies only, so the subscription says it).
    #[serde(default = "push_defaults::content_type")]
    pub content_type: String,
    /// CloudEvents `ce-type` of each delivery.
    #[serde(default = "push_defaults::event_type")]
    pub event_type: String,
}

impl PushConfig {
    /// A subscription delivering to `url`, every other key at its default.
    pub fn to(url: AppUrl) -> PushConfig {
        PushConfig {
            url,
            allow_remote: false,
            concurrency: push_defaults::concurrency(),
            visibility: push_defaults::thirty_seconds(),
            request_timeout: push_defaults::thirty_seconds(),
            backoff_initial: push_defaults::one_second(),
            backoff_max: push_defaults::backoff_max(),
            backoff_jitter: push_defaults::backoff_jitter(),
            readiness_url: None,
            readiness_interval: push_defaults::one_second(),
            content_type: push_defaults::content_type(),
            event_type: push_defaults::event_type(),
        }
    }
}

/// The defaults of a push subscription's keys (serde asks for each by a function).
mod push_defaults {
    use std::time::Duration;

    pub(super) fn concurrency() -> usize {
        1
    }
    pub(super) fn thirty_seconds() -> Duration {
        Duration::from_secs(30)
    }
    pub(super) fn one_second() -> Duration {
        Duration::from_secs(1)
    }
    pub(super) fn backoff_max() -> Duration {
        Duration::from_secs(60)
    }
    pub(super) fn backoff_jitter() -> f64 {
        0.2
    }
    pub(super) fn content_type() -> String {
        "application/octet-stream".to_owned()
    }
    pub(super) fn event_type() -> String {
        "zkq.message".to_owned()
    }
}

/// Most deliveries one push subscription may have in flight.
pub const MAX_PUSH_CONCURRENCY: usize = 1000;

impl Default for Config {
    fn default() -> Self {
        Config {
            zookeeper: ZookeeperConfig::default(),
            api: ApiConfig::default(),
            admin: AdminConfig::default(),
            sqs: SqsConfig::default(),
            log: LogConfig::default(),
            take: TakeConfig::default(),
            lease: LeaseConfig::default(),
            shutdown: ShutdownConfig::default(),
            queues_dynamic: true,
            queues_dynamic_grouped: false,
            max_dynamic_queues: 1000,
            queue_idle_close: Duration::from_secs(600),
            queues_watch_on_demand: true,
            queues_fleet_watchers: 3,
            queues: BTreeMap::new(),
            counters_dynamic: true,
            counters: BTreeMap::new(),
        }
    }
}

impl Default for ZookeeperConfig {
    fn default() -> Self {
        ZookeeperConfig {
            connect: "127.0.0.1:2181".to_owned(),
            session_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(10),
            root: "/zkq".to_owned(),
            auth_digest: None,
            reconnect_backoff_max: Duration::from_secs(5),
            // Java's default, 1 MiB less a byte.
            jute_maxbuffer: 0xf_ffff,
            acl: None,
            tls: ZkTlsConfig::default(),
            sasl: ZkSaslConfig::default(),
        }
    }
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_message_bytes: 512 * 1024,
            max_delay: Duration::from_secs(30 * 24 * 3600),
            max_connections: 1024,
            max_concurrent_requests: 512,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_read_timeout: Duration::from_secs(30),
            max_peek_bytes: 8 * 1024 * 1024,
            max_batch: 100,
            max_batch_bytes: 512 * 1024,
            token_file: None,
            refuse_cross_origin: true,
        }
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], 9090)),
            max_connections: 64,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

impl Default for SqsConfig {
    fn default() -> Self {
        SqsConfig {
            listen: None,
            account_id: "000000000000".to_owned(),
            region: "us-east-1".to_owned(),
            access_key_id: None,
            secret_access_key_file: None,
            binary_bodies: BinaryBodies::Base64,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { format: LogFormat::Text, level: "info,zookeeper_client=warn".to_owned() }
    }
}

impl Default for TakeConfig {
    fn default() -> Self {
        TakeConfig { max_wait: Duration::from_secs(20), claim_marker_age: Duration::from_secs(3600) }
    }
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig { grace: Duration::from_secs(10) }
    }
}

impl Config {
    /// The idempotency window of queue `name` (declared or dynamic).
    pub fn idempotency_window(&self, name: &str) -> Duration {
        self.queues.get(name).and_then(|q| q.idempotency_window).unwrap_or(DEFAULT_IDEMPOTENCY_WINDOW)
    }

    /// The configuration as TOML with secrets replaced, for `zkq check-config`.
    pub fn to_redacted_toml(&self) -> String {
        // Secret serializes as "<redacted>": no secret can reach this text.
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render configuration: {e}\n"))
    }

    /// Whether the session authenticates (digest credentials or SASL): then the nodes zkq
    /// creates are, by default, for sessions with the same credentials only.
    pub fn has_credentials(&self) -> bool {
        self.zookeeper.auth_digest.is_some() || self.zookeeper.sasl.mechanism.is_some()
    }

    /// The ACL of the nodes zkq creates.
    pub fn node_acl(&self) -> NodeAcl {
        match &self.zookeeper.acl {
            Some(entries) => NodeAcl::List(entries.clone()),
            None if self.has_credentials() => NodeAcl::CreatorAll,
            None => NodeAcl::Open,
        }
    }

    /// `zkq check-config` advice: declared queues without `max_items`, with a value that keeps
    /// their child list readable by Curator consumers.
    pub fn max_items_recommendations(&self) -> Vec<String> {
        let mut names: Vec<&QueueName> = self.queues.keys().collect();
        names.sort();
        names
            .into_iter()
            .filter_map(|name| {
                let queue = self.queues.get(name)?;
                if queue.max_items.is_some() {
                    return None;
                }
                Some(format!(
                    "queues.{name}.max_items is not set: beyond about {} {} children the child list exceeds \
                     Java's default jute.maxbuffer and Curator consumers fail; recommended max_items = {}",
                    JUTE_MAXBUFFER_BYTES / (4 + queue.kind.typical_name_len()),
                    queue.kind.as_str(),
                    queue.kind.recommended_max_items()
                ))
            })
            .collect()
    }
}
