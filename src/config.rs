//! Typed configuration: built-in defaults < TOML file < `ZKQ__SECTION__KEY` environment < flags.
//!
//! This is the only module that reads the environment. Everything is validated by
//! [`Config::validate`] before any port is bound or ZooKeeper is contacted; a failure names
//! the key, the offending value and what is allowed, and `main` exits with status 64.

#![allow(clippy::disallowed_methods, reason = "src/config.rs owns the environment")]

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

// The vocabulary lives on the ground floor; these paths keep working for the modules that name it here.
use crate::types::AppUrl;
pub use crate::types::{JUTE_MAXBUFFER_BYTES, MAX_NAME_LEN, MAX_PUSH_URL_LEN, QueueKind, Secret, check_name};

/// Exit status for a configuration error (`EX_USAGE` from sysexits.h).
pub const EXIT_CONFIG: i32 = 64;

/// The whole effective configuration of one zkq process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub zookeeper: ZookeeperConfig,
    pub api: ApiConfig,
    pub admin: AdminConfig,
    pub log: LogConfig,
    pub take: TakeConfig,
    pub lease: LeaseConfig,
    pub shutdown: ShutdownConfig,
    /// Whether queues that are not declared under `[queues]` are created on first use.
    pub queues_dynamic: bool,
    /// Cap on the number of dynamic queues one process serves (bounds metric labels and memory).
    pub max_dynamic_queues: usize,
    /// A dynamic queue nobody used (no request, waiting taker or lease) for this long is closed:
    /// its tasks end and its slot under `max_dynamic_queues` is released.
    #[serde(with = "humantime_serde")]
    pub queue_idle_close: Duration,
    /// Declared queues, by name.
    pub queues: BTreeMap<String, QueueConfig>,
    /// Whether counters that are not declared under `[counters]` are created on first use.
    pub counters_dynamic: bool,
    /// Declared shared counters, by name.
    pub counters: BTreeMap<String, CounterConfig>,
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
    /// ACL of every node zkq creates, as `scheme:id:perms` entries. None: `auth::cdrwa` (only
    /// sessions with zkq's credentials) when credentials are configured, else `world:anyone:cdrwa`.
    pub acl: Option<Vec<String>>,
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
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// Requests handled at once; further ones are answered 503 `overloaded` at once.
    pub max_concurrent_requests: usize,
    /// Time a client has to finish a request's headers once it sent their first byte.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection that sends nothing for this long (new, or after its last response) is closed.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
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
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// Time a client has to finish a request's headers once it sent their first byte.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection that sends nothing for this long (new, or after its last response) is closed.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
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
    pub dead_letter: Option<String>,
    /// Push delivery to the app (`[queues.NAME.push]`); none: the app pulls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<PushConfig>,
    /// How long a put's `Idempotency-Key` is remembered (default [`DEFAULT_IDEMPOTENCY_WINDOW`]).
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub idempotency_window: Option<Duration>,
}

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
/// needs no consumer loop of its own (`[queues.NAME.push]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PushConfig {
    /// The app's endpoint, `http://host:port/path`; a loopback host unless `allow_remote`.
    pub url: String,
    /// Allow a `url` or `readiness_url` whose host is not loopback (messages travel unencrypted).
    pub allow_remote: bool,
    /// Deliveries in flight at once from this zkq; 1 keeps Curator's order for a single consumer.
    pub concurrency: usize,
    /// Visibility of each delivery's lease; extended while the app's request is still open.
    #[serde(with = "humantime_serde")]
    pub visibility: Duration,
    /// Time the app has to answer one delivery (connect, request and answer).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// First pause after a failed delivery (or while the app cannot be reached); doubles each time.
    #[serde(with = "humantime_serde")]
    pub backoff_initial: Duration,
    /// Longest pause between attempts (an app's `Retry-After` may ask for more, up to an hour).
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// Each pause is shortened by up to this fraction (0.0 to 1.0) at random.
    pub backoff_jitter: f64,
    /// Optional: zkq delivers only while a GET of this URL answers 2xx.
    pub readiness_url: Option<String>,
    /// How often `readiness_url` is asked.
    #[serde(with = "humantime_serde")]
    pub readiness_interval: Duration,
    /// `Content-Type` of each delivery (zkq stores bodies only, so the subscription says it).
    pub content_type: String,
    /// CloudEvents `ce-type` of each delivery.
    pub event_type: String,
}

impl Default for PushConfig {
    fn default() -> Self {
        PushConfig {
            url: String::new(),
            allow_remote: false,
            concurrency: 1,
            visibility: Duration::from_secs(30),
            request_timeout: Duration::from_secs(30),
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            backoff_jitter: 0.2,
            readiness_url: None,
            readiness_interval: Duration::from_secs(1),
            content_type: "application/octet-stream".to_owned(),
            event_type: "zkq.message".to_owned(),
        }
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
            log: LogConfig::default(),
            take: TakeConfig::default(),
            lease: LeaseConfig::default(),
            shutdown: ShutdownConfig::default(),
            queues_dynamic: true,
            max_dynamic_queues: 1000,
            queue_idle_close: Duration::from_secs(600),
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

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { format: LogFormat::Text, level: "info,zookeeper_client=warn".to_owned() }
    }
}

impl Default for TakeConfig {
    fn default() -> Self {
        TakeConfig { max_wait: Duration::from_secs(20) }
    }
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig { grace: Duration::from_secs(10) }
    }
}

/// Values given on the command line; each one overrides every other source. This is the one list
/// of flags: `main.rs` flattens it into its parser, and [`Overrides::keys`] names each flag's key.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Overrides {
    /// TOML configuration file.
    #[arg(long = "config", value_name = "PATH", global = true)]
    pub config_file: Option<PathBuf>,
    /// ZooKeeper connect string (zookeeper.connect), e.g. zk1:2181,zk2:2181/chroot.
    #[arg(long, value_name = "HOSTS", global = true)]
    pub zk_connect: Option<String>,
    /// Root path for zkq's own nodes (zookeeper.root).
    #[arg(long, value_name = "PATH", global = true)]
    pub zk_root: Option<String>,
    /// Address of the queue API (api.listen).
    #[arg(long, value_name = "ADDR", global = true)]
    pub api_listen: Option<String>,
    /// Address of /livez, /readyz and /metrics (admin.listen).
    #[arg(long, value_name = "ADDR", global = true)]
    pub admin_listen: Option<String>,
    /// Log format: text or json (log.format).
    #[arg(long, value_name = "FORMAT", global = true)]
    pub log_format: Option<String>,
    /// Log filter, e.g. info or zkq=debug,info (log.level).
    #[arg(long, value_name = "FILTER", global = true)]
    pub log_level: Option<String>,
}

impl Overrides {
    /// Each configuration flag with the key it overrides.
    fn keys(&self) -> [(&'static str, &Option<String>); 6] {
        [
            ("zookeeper.connect", &self.zk_connect),
            ("zookeeper.root", &self.zk_root),
            ("api.listen", &self.api_listen),
            ("admin.listen", &self.admin_listen),
            ("log.format", &self.log_format),
            ("log.level", &self.log_level),
        ]
    }
}

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

fn invalid(key: impl Into<String>, value: impl fmt::Debug, allowed: impl Into<String>) -> ConfigError {
    ConfigError { key: key.into(), value: format!("{value:?}"), allowed: allowed.into() }
}

impl Config {
    /// Loads from every source, using the process environment, and validates.
    pub fn load(overrides: &Overrides) -> Result<Config, ConfigError> {
        let env: HashMap<String, String> = std::env::vars().filter(|(k, _)| k.starts_with("ZKQ__")).collect();
        Self::load_with_env(overrides, env)
    }

    /// Loads from every source with an explicit environment (for tests), and validates.
    pub fn load_with_env(overrides: &Overrides, env: HashMap<String, String>) -> Result<Config, ConfigError> {
        let mut builder = config::Config::builder();
        if let Some(path) = &overrides.config_file {
            if !path.is_file() {
                return Err(invalid("--config", path, "no such file; give the path of a TOML file"));
            }
            builder = builder.add_source(config::File::from(path.as_path()).format(config::FileFormat::Toml));
        }
        builder = builder.add_source(
            config::Environment::with_prefix("ZKQ")
                .prefix_separator("__")
                .separator("__")
                .source(Some(env.into_iter().map(|(k, v)| (k.to_ascii_uppercase(), v)).collect())),
        );
        for (key, value) in overrides.keys() {
            if let Some(value) = value {
                builder = builder.set_override(key, value.as_str()).map_err(|e| invalid(key, value, e.to_string()))?;
            }
        }
        let merged = builder.build().map_err(|e| from_config_error(e, None))?;
        let config: Config = merged.clone().try_deserialize().map_err(|e| from_config_error(e, Some(&merged)))?;
        config.validate()?;
        Ok(config)
    }

    /// Every check that involves more than one value's type: ranges, paths, cross-field rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let zk = &self.zookeeper;
        if zk.connect.trim().is_empty() {
            return Err(invalid("zookeeper.connect", &zk.connect, "a connect string like 127.0.0.1:2181,host2:2181"));
        }
        let (hosts, chroot) = match zk.connect.find('/') {
            Some(i) => (&zk.connect[..i], Some(&zk.connect[i..])),
            None => (zk.connect.as_str(), None),
        };
        for host in hosts.split(',') {
            let port_ok = host.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !port_ok {
                return Err(invalid(
                    "zookeeper.connect",
                    &zk.connect,
                    format!("`{host}` is not host:port; use a list like 127.0.0.1:2181,host2:2181[/chroot]"),
                ));
            }
        }
        if let Some(chroot) = chroot {
            check_zk_path("zookeeper.connect", chroot)?;
        }
        check_duration(
            "zookeeper.session_timeout",
            zk.session_timeout,
            Duration::from_secs(2),
            Duration::from_secs(600),
        )?;
        check_duration(
            "zookeeper.request_timeout",
            zk.request_timeout,
            Duration::from_millis(100),
            Duration::from_secs(300),
        )?;
        check_duration(
            "zookeeper.reconnect_backoff_max",
            zk.reconnect_backoff_max,
            Duration::from_millis(100),
            Duration::from_secs(300),
        )?;
        check_zk_path("zookeeper.root", &zk.root)?;
        if zk.root == "/" {
            return Err(invalid("zookeeper.root", &zk.root, "must be a node below /, such as /zkq"));
        }
        self.validate_security()?;
        if self.api.listen == self.admin.listen && self.api.listen.port() != 0 {
            return Err(invalid("admin.listen", self.admin.listen, "must differ from api.listen"));
        }
        // Curator's envelope adds 10 bytes; ZooKeeper refuses packets over jute.maxbuffer (1 MiB - 1).
        if !(1..=1_000_000).contains(&self.api.max_message_bytes) {
            return Err(invalid(
                "api.max_message_bytes",
                self.api.max_message_bytes,
                "between 1 and 1000000 bytes (a znode holds at most jute.maxbuffer = 1 MiB)",
            ));
        }
        check_duration(
            "api.max_delay",
            self.api.max_delay,
            Duration::from_secs(1),
            Duration::from_secs(3650 * 24 * 3600),
        )?;
        for (key, value) in [
            ("api.max_connections", self.api.max_connections),
            ("api.max_concurrent_requests", self.api.max_concurrent_requests),
            ("admin.max_connections", self.admin.max_connections),
        ] {
            if !(1..=1_000_000).contains(&value) {
                return Err(invalid(key, value, "between 1 and 1000000"));
            }
        }
        for (key, value) in [
            ("api.header_read_timeout", self.api.header_read_timeout),
            ("admin.header_read_timeout", self.admin.header_read_timeout),
            ("api.idle_timeout", self.api.idle_timeout),
            ("admin.idle_timeout", self.admin.idle_timeout),
        ] {
            check_duration(key, value, Duration::from_millis(100), Duration::from_secs(600))?;
        }
        if self.log.level.trim().is_empty() || tracing_subscriber::EnvFilter::builder().parse(&self.log.level).is_err()
        {
            return Err(invalid("log.level", &self.log.level, "a filter like info, debug or zkq=debug,info"));
        }
        check_duration("take.max_wait", self.take.max_wait, Duration::ZERO, Duration::from_secs(3600))?;
        check_duration(
            "lease.max_visibility",
            self.lease.max_visibility,
            Duration::from_secs(1),
            Duration::from_secs(7 * 24 * 3600),
        )?;
        check_duration(
            "lease.default_visibility",
            self.lease.default_visibility,
            Duration::from_millis(100),
            self.lease.max_visibility,
        )?;
        if self.lease.max_per_queue == 0 {
            return Err(invalid("lease.max_per_queue", 0, "at least 1"));
        }
        if self.api.max_peek_bytes == 0 {
            return Err(invalid("api.max_peek_bytes", 0, "at least 1"));
        }
        if !(1..=1000).contains(&self.api.max_batch) {
            return Err(invalid("api.max_batch", self.api.max_batch, "between 1 and 1000"));
        }
        if !(1024..=768 * 1024).contains(&self.api.max_batch_bytes) {
            return Err(invalid(
                "api.max_batch_bytes",
                self.api.max_batch_bytes,
                "between 1024 and 786432 (a batch put is one transaction under ZooKeeper's 1 MiB request limit)",
            ));
        }
        check_duration("shutdown.grace", self.shutdown.grace, Duration::ZERO, Duration::from_secs(3600))?;
        check_duration(
            "queue_idle_close",
            self.queue_idle_close,
            Duration::from_secs(1),
            Duration::from_secs(7 * 24 * 3600),
        )?;
        if self.max_dynamic_queues > 100_000 {
            return Err(invalid("max_dynamic_queues", self.max_dynamic_queues, "at most 100000"));
        }
        for (name, queue) in &self.queues {
            let key = format!("queues.{name}");
            if let Err(why) = check_name(name) {
                return Err(invalid(key, name, why));
            }
            // zkq keeps idempotency records there and its sweepers delete what they find.
            let records = format!("{}/idempotency", self.zookeeper.root);
            let among_records = |path: &str| path == records || path.starts_with(&format!("{records}/"));
            if let Some(path) = &queue.path {
                check_zk_path(&format!("{key}.path"), path)?;
                if path.contains('|') {
                    return Err(invalid(format!("{key}.path"), path, "must not contain `|` (Curator refuses it)"));
                }
                if among_records(path) {
                    return Err(invalid(
                        format!("{key}.path"),
                        path,
                        format!("must not be at or under {records}, where zkq keeps its idempotency records"),
                    ));
                }
            }
            if let Some(lock_path) = &queue.lock_path {
                check_zk_path(&format!("{key}.lock_path"), lock_path)?;
                if among_records(lock_path) {
                    return Err(invalid(
                        format!("{key}.lock_path"),
                        lock_path,
                        format!("must not be at or under {records}, where zkq keeps its idempotency records"),
                    ));
                }
                if queue.kind == QueueKind::Simple {
                    return Err(invalid(
                        format!("{key}.lock_path"),
                        lock_path,
                        "simple queues have no lock path (Curator's SimpleDistributedQueue never locks)",
                    ));
                }
                if Some(lock_path) == queue.path.as_ref() {
                    return Err(invalid(format!("{key}.lock_path"), lock_path, "must differ from the queue path"));
                }
            }
            if queue.max_items == Some(0) {
                return Err(invalid(format!("{key}.max_items"), 0, "at least 1, or leave it out for no limit"));
            }
            if queue.max_deliveries == Some(0) {
                return Err(invalid(format!("{key}.max_deliveries"), 0, "at least 1, or leave it out for no limit"));
            }
            if let Some(dead_letter) = &queue.dead_letter {
                if let Err(why) = check_name(dead_letter) {
                    return Err(invalid(format!("{key}.dead_letter"), dead_letter, why));
                }
                if dead_letter == name {
                    return Err(invalid(format!("{key}.dead_letter"), dead_letter, "must be another queue"));
                }
                if !self.queues_dynamic && !self.queues.contains_key(dead_letter) {
                    return Err(invalid(
                        format!("{key}.dead_letter"),
                        dead_letter,
                        "must be a declared queue when queues_dynamic = false",
                    ));
                }
            }
            if let Some(window) = queue.idempotency_window {
                check_duration(
                    &format!("{key}.idempotency_window"),
                    window,
                    MIN_IDEMPOTENCY_WINDOW,
                    MAX_IDEMPOTENCY_WINDOW,
                )?;
            }
            if queue.max_deliveries.is_some() && queue.dead_letter.is_none() {
                return Err(invalid(
                    format!("{key}.max_deliveries"),
                    queue.max_deliveries,
                    "needs a dead_letter queue to move messages to",
                ));
            }
            if let Some(push) = &queue.push {
                self.validate_push(&key, queue, push)?;
            }
        }
        for (name, counter) in &self.counters {
            let key = format!("counters.{name}");
            if let Err(why) = check_name(name) {
                return Err(invalid(key, name, why));
            }
            if let Some(path) = &counter.path {
                check_zk_path(&format!("{key}.path"), path)?;
            }
        }
        Ok(())
    }

    /// Checks `[queues.NAME.push]` (`key` is `queues.NAME`).
    fn validate_push(&self, key: &str, queue: &QueueConfig, push: &PushConfig) -> Result<(), ConfigError> {
        let key = format!("{key}.push");
        // A push delivery is a lease: the queue needs Curator's lock path.
        let lockable = queue.kind != QueueKind::Simple && (queue.lock_path.is_some() || queue.path.is_none());
        if !lockable {
            let why = if queue.kind == QueueKind::Simple {
                "simple queues cannot be pushed: a push delivery is a lease and simple queues have no lock path"
            } else {
                "a queue attached by path needs its lock_path to be pushed (a push delivery is a lease)"
            };
            return Err(invalid(key, queue.kind.as_str(), why));
        }
        for (name, url) in [("url", Some(&push.url)), ("readiness_url", push.readiness_url.as_ref())] {
            let Some(url) = url else { continue };
            let parsed = AppUrl::parse(url).map_err(|why| invalid(format!("{key}.{name}"), url, why))?;
            if !push.allow_remote && !parsed.is_loopback() {
                return Err(invalid(
                    format!("{key}.{name}"),
                    url,
                    "the host must be loopback (127.0.0.1, [::1] or localhost: the app in the same pod); set \
                     allow_remote = true to push elsewhere (over plain HTTP)",
                ));
            }
        }
        let max_concurrency = MAX_PUSH_CONCURRENCY.min(self.lease.max_per_queue);
        if !(1..=max_concurrency).contains(&push.concurrency) {
            return Err(invalid(
                format!("{key}.concurrency"),
                push.concurrency,
                format!("between 1 and {max_concurrency} (at most {MAX_PUSH_CONCURRENCY} and lease.max_per_queue)"),
            ));
        }
        check_duration(
            &format!("{key}.visibility"),
            push.visibility,
            Duration::from_secs(1),
            self.lease.max_visibility,
        )?;
        let hour = Duration::from_secs(3600);
        check_duration(&format!("{key}.request_timeout"), push.request_timeout, Duration::from_millis(100), hour)?;
        check_duration(&format!("{key}.backoff_initial"), push.backoff_initial, Duration::from_millis(10), hour)?;
        check_duration(&format!("{key}.backoff_max"), push.backoff_max, push.backoff_initial, hour)?;
        check_duration(
            &format!("{key}.readiness_interval"),
            push.readiness_interval,
            Duration::from_millis(100),
            hour,
        )?;
        if !(0.0..=1.0).contains(&push.backoff_jitter) {
            return Err(invalid(format!("{key}.backoff_jitter"), push.backoff_jitter, "between 0.0 and 1.0"));
        }
        for (name, value) in [("content_type", &push.content_type), ("event_type", &push.event_type)] {
            let printable = value.bytes().all(|b| b == b' ' || b.is_ascii_graphic());
            if value.is_empty() || value.len() > 256 || !printable || value.trim() != value {
                return Err(invalid(
                    format!("{key}.{name}"),
                    value,
                    "1 to 256 printable ASCII characters (it is sent as an HTTP header)",
                ));
            }
        }
        Ok(())
    }

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

    /// The ACL of the nodes zkq creates (the configuration is validated: every entry parses).
    pub fn node_acl(&self) -> NodeAcl {
        match &self.zookeeper.acl {
            Some(entries) => NodeAcl::List(entries.iter().filter_map(|e| AclEntry::parse(e).ok()).collect()),
            None if self.has_credentials() => NodeAcl::CreatorAll,
            None => NodeAcl::Open,
        }
    }

    /// TLS, SASL, credentials, the ACL list and the API token: what can be checked without
    /// reading a file (files are read at start, see `app::load_secrets`).
    fn validate_security(&self) -> Result<(), ConfigError> {
        let zk = &self.zookeeper;
        if let Some(auth) = &zk.auth_digest
            && auth.expose().split_once(':').is_none_or(|(user, _)| user.is_empty())
        {
            return Err(invalid("zookeeper.auth_digest", "<redacted>", "must be user:password"));
        }
        let tls = &zk.tls;
        if tls.enabled {
            if tls.ca_file.is_none() {
                return Err(invalid(
                    "zookeeper.tls.ca_file",
                    "(unset)",
                    "TLS needs the PEM file of the CA that signs the servers' certificates",
                ));
            }
            if tls.cert_file.is_some() != tls.key_file.is_some() {
                let (key, value) = match &tls.cert_file {
                    Some(cert) => ("zookeeper.tls.key_file", format!("(unset; cert_file = {})", cert.display())),
                    None => ("zookeeper.tls.cert_file", "(unset; key_file is set)".to_owned()),
                };
                return Err(ConfigError {
                    key: key.to_owned(),
                    value,
                    allowed: "a client certificate needs its key: set both cert_file and key_file, or neither"
                        .to_owned(),
                });
            }
            check_duration(
                "zookeeper.tls.reload_interval",
                tls.reload_interval,
                Duration::from_secs(1),
                Duration::from_secs(24 * 3600),
            )?;
        } else if let Some((key, path)) = [
            ("zookeeper.tls.ca_file", &tls.ca_file),
            ("zookeeper.tls.cert_file", &tls.cert_file),
            ("zookeeper.tls.key_file", &tls.key_file),
        ]
        .into_iter()
        .find_map(|(key, path)| path.as_ref().map(|p| (key, p)))
        {
            return Err(invalid(key, path, "is set but zookeeper.tls.enabled = false; enable TLS or remove it"));
        }
        for (key, path) in [
            ("zookeeper.tls.ca_file", &tls.ca_file),
            ("zookeeper.tls.cert_file", &tls.cert_file),
            ("zookeeper.tls.key_file", &tls.key_file),
            ("zookeeper.sasl.password_file", &zk.sasl.password_file),
            ("api.token_file", &self.api.token_file),
        ] {
            if let Some(path) = path {
                check_file_path(key, path)?;
            }
        }
        let sasl = &zk.sasl;
        match sasl.mechanism {
            Some(SaslMechanism::DigestMd5) => {
                if sasl.username.as_deref().is_none_or(|u| u.trim().is_empty()) {
                    return Err(invalid(
                        "zookeeper.sasl.username",
                        sasl.username.as_deref().unwrap_or("(unset)"),
                        "DIGEST-MD5 needs the user name of the server's JAAS Server section",
                    ));
                }
                if sasl.password.is_some() == sasl.password_file.is_some() {
                    return Err(invalid(
                        "zookeeper.sasl.password",
                        "<redacted>",
                        "set exactly one of zookeeper.sasl.password and zookeeper.sasl.password_file",
                    ));
                }
            },
            None => {
                if let Some((key, _)) = [
                    ("zookeeper.sasl.username", sasl.username.is_some()),
                    ("zookeeper.sasl.password", sasl.password.is_some()),
                    ("zookeeper.sasl.password_file", sasl.password_file.is_some()),
                ]
                .into_iter()
                .find(|(_, set)| *set)
                {
                    return Err(invalid(
                        key,
                        "(set)",
                        "is set but zookeeper.sasl.mechanism is not; set mechanism = \"DIGEST-MD5\"",
                    ));
                }
            },
        }
        if let Some(entries) = &zk.acl {
            self.validate_acl(entries)?;
        }
        Ok(())
    }

    /// Every entry parses, `auth` has credentials to refer to, and some entry lets zkq's own
    /// session read, write, create and delete (else zkq would lock itself out of its nodes).
    fn validate_acl(&self, entries: &[String]) -> Result<(), ConfigError> {
        if entries.is_empty() {
            return Err(invalid(
                "zookeeper.acl",
                entries,
                "at least one entry, like \"auth::cdrwa\"; leave the key out for the default",
            ));
        }
        let mut granted = 0u8;
        let mut unverifiable = false;
        for text in entries {
            let entry = AclEntry::parse(text).map_err(|why| invalid("zookeeper.acl", text, why))?;
            let ours = match entry.scheme.as_str() {
                "world" => true,
                "auth" => {
                    if !self.has_credentials() {
                        return Err(invalid(
                            "zookeeper.acl",
                            text,
                            "`auth` means \"sessions with zkq's credentials\", but none are configured \
                             (zookeeper.auth_digest or zookeeper.sasl); ZooKeeper refuses such an ACL",
                        ));
                    }
                    true
                },
                "digest" => match &self.zookeeper.auth_digest {
                    Some(auth) => {
                        let (user, hash) = entry.id.split_once(':').unwrap_or((&entry.id, ""));
                        let ours = auth.expose().split_once(':').is_some_and(|(u, _)| u == user);
                        if ours && hash != digest_hash(auth.expose()) {
                            return Err(invalid(
                                "zookeeper.acl",
                                text,
                                format!(
                                    "the hash for user {user} does not match zookeeper.auth_digest; it is \
                                     base64(sha1(\"{user}:password\")), e.g. printf '%s' '{user}:password' | \
                                     openssl dgst -binary -sha1 | base64"
                                ),
                            ));
                        }
                        ours
                    },
                    None => false,
                },
                "sasl" => {
                    self.zookeeper.sasl.mechanism.is_some()
                        && self.zookeeper.sasl.username.as_deref() == Some(&entry.id)
                },
                _ => {
                    // ip and x509 ids depend on the network and the certificate: not checked here.
                    unverifiable = true;
                    false
                },
            };
            if ours {
                granted |= entry.perms;
            }
        }
        let needed = acl_perms::READ | acl_perms::WRITE | acl_perms::CREATE | acl_perms::DELETE;
        if granted & needed != needed && !unverifiable {
            return Err(invalid(
                "zookeeper.acl",
                entries,
                "no entry lets zkq's own session read, write, create and delete (crwd) the nodes it \
                 creates: add \"auth::cdrwa\" (with credentials) or an entry for zkq's own user",
            ));
        }
        Ok(())
    }
}

/// ZooKeeper's permission bits.
pub mod acl_perms {
    pub const READ: u8 = 1;
    pub const WRITE: u8 = 2;
    pub const CREATE: u8 = 4;
    pub const DELETE: u8 = 8;
    pub const ADMIN: u8 = 16;
}

/// One entry of `zookeeper.acl`: who (`scheme:id`) may do what (`perms`, ZooKeeper's bits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclEntry {
    pub scheme: String,
    pub id: String,
    pub perms: u8,
}

impl AclEntry {
    /// Parses `scheme:id:perms` as ZooKeeper's CLI writes it, e.g. `world:anyone:r`,
    /// `digest:app:Nz4n…=:cdrwa`, `ip:10.0.0.0/8:r`, `auth::cdrwa`.
    pub fn parse(text: &str) -> Result<AclEntry, String> {
        let shape = "an entry scheme:id:perms, like world:anyone:r, auth::cdrwa or digest:app:<hash>:cdrwa";
        let (scheme, rest) = text.split_once(':').ok_or_else(|| shape.to_owned())?;
        let (id, letters) = rest.rsplit_once(':').ok_or_else(|| shape.to_owned())?;
        let mut perms = 0u8;
        for letter in letters.chars() {
            let bit = match letter {
                'r' => acl_perms::READ,
                'w' => acl_perms::WRITE,
                'c' => acl_perms::CREATE,
                'd' => acl_perms::DELETE,
                'a' => acl_perms::ADMIN,
                other => return Err(format!("unknown permission {other:?}: permissions are letters of cdrwa")),
            };
            if perms & bit != 0 {
                return Err(format!("permission {letter:?} given twice"));
            }
            perms |= bit;
        }
        if perms == 0 {
            return Err("no permissions: give letters of cdrwa".to_owned());
        }
        match scheme {
            "world" if id != "anyone" => return Err("the world scheme has the one id `anyone`".to_owned()),
            "auth" if !id.is_empty() => {
                return Err(
                    "the auth scheme takes no id (write auth::cdrwa): it means zkq's own credentials".to_owned()
                );
            },
            "digest" => {
                use base64::Engine;
                let valid = id.split_once(':').is_some_and(|(user, hash)| {
                    !user.is_empty()
                        && base64::engine::general_purpose::STANDARD.decode(hash).is_ok_and(|sha1| sha1.len() == 20)
                });
                if !valid {
                    return Err(
                        "a digest id is user:base64(sha1(\"user:password\")), 28 characters after the user".to_owned()
                    );
                }
            },
            "ip" => {
                let (addr, bits) = match id.split_once('/') {
                    Some((addr, bits)) => (addr, Some(bits)),
                    None => (id, None),
                };
                let max = match addr.parse::<std::net::IpAddr>() {
                    Ok(std::net::IpAddr::V4(_)) => 32,
                    Ok(std::net::IpAddr::V6(_)) => 128,
                    Err(_) => return Err("an ip id is an address or address/bits, like 10.0.0.0/8".to_owned()),
                };
                if bits.is_some_and(|b| !b.parse::<u8>().is_ok_and(|b| b <= max)) {
                    return Err(format!("the prefix length of an ip id is 0 to {max}"));
                }
            },
            "sasl" | "x509" if id.is_empty() => return Err(format!("the {scheme} scheme needs an id")),
            "world" | "auth" | "sasl" | "x509" => {},
            other => {
                return Err(format!("unknown scheme {other:?}: zkq knows world, auth, digest, ip, sasl and x509"));
            },
        }
        Ok(AclEntry { scheme: scheme.to_owned(), id: id.to_owned(), perms })
    }
}

/// The ACL zkq gives the nodes it creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAcl {
    /// `world:anyone:cdrwa`: no credentials are configured.
    Open,
    /// `auth::cdrwa`: sessions with the same credentials as zkq's.
    CreatorAll,
    /// `zookeeper.acl`, as configured.
    List(Vec<AclEntry>),
}

/// The id ZooKeeper's digest scheme derives from `user:password`: `user:base64(sha1(user:password))`'s hash part.
fn digest_hash(credentials: &str) -> String {
    use base64::Engine;
    let sha1 = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, credentials.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(sha1.as_ref())
}

/// A file key names an absolute path (the file itself is read at start).
fn check_file_path(key: &str, path: &Path) -> Result<(), ConfigError> {
    if path.as_os_str().is_empty() {
        return Err(invalid(key, path, "a path to a file, e.g. a mounted Secret"));
    }
    Ok(())
}

impl Config {
    /// `zkq check-config` advice: declared queues without `max_items`, with a value that keeps
    /// their child list readable by Curator consumers.
    pub fn max_items_recommendations(&self) -> Vec<String> {
        let mut names: Vec<&String> = self.queues.keys().collect();
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

fn check_zk_path(key: &str, path: &str) -> Result<(), ConfigError> {
    let ok = path.starts_with('/')
        && (path == "/" || !path.ends_with('/'))
        && !path.contains("//")
        && path.split('/').skip(1).all(|seg| path == "/" || (!seg.is_empty() && seg != "." && seg != ".."))
        && !path.chars().any(|c| c.is_control() || c == '\u{0}');
    if let Some(c) = crate::types::refused_char(path) {
        return Err(invalid(
            key,
            path,
            format!(
                "holds {c:?} (U+{:04X}), a character ZooKeeper refuses in paths (control characters, \
                 U+D800-U+F8FF, U+FFF0 and above)",
                u32::from(c)
            ),
        ));
    }
    if ok {
        Ok(())
    } else {
        Err(invalid(
            key,
            path,
            "an absolute ZooKeeper path like /zkq/queues/orders (no trailing /, no . or .. segments)",
        ))
    }
}

fn check_duration(key: &str, value: Duration, min: Duration, max: Duration) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(invalid(
            key,
            humantime::format_duration(value).to_string(),
            format!("between {} and {}", humantime::format_duration(min), humantime::format_duration(max)),
        ));
    }
    Ok(())
}

/// What a key accepts, for error messages about values the types refused.
fn allowed_for(key: &str) -> &'static str {
    let last = key.rsplit('.').next().unwrap_or(key);
    match last {
        "format" => "one of: text, json",
        "kind" => "one of: fifo, priority, delay, id, simple",
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
        _ => "see the configuration table in the README",
    }
}

fn from_config_error(err: config::ConfigError, merged: Option<&config::Config>) -> ConfigError {
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
        E::FileParse { uri, .. } => {
            let file = uri.clone().unwrap_or_default();
            return ConfigError { key: "--config".to_owned(), value: file, allowed: format!("not valid TOML: {text}") };
        },
        _ => {},
    }
    let value =
        merged.and_then(|m| m.get_string(&key).ok()).map_or_else(|| "(unreadable)".to_owned(), |v| format!("{v:?}"));
    if key.is_empty() {
        return ConfigError { key, value, allowed: text };
    }
    ConfigError { allowed: format!("{} ({text})", allowed_for(&key)), key, value }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn write_toml(text: &str) -> tempfile_path::TempToml {
        tempfile_path::TempToml::new(text)
    }

    mod tempfile_path {
        use std::path::PathBuf;

        /// A TOML file in the system temp dir, removed on drop.
        pub struct TempToml(pub PathBuf);

        impl TempToml {
            pub fn new(text: &str) -> Self {
                let path = std::env::temp_dir().join(format!("zkq-config-{}.toml", uuid::Uuid::new_v4()));
                std::fs::write(&path, text).expect("temp dir is writable");
                TempToml(path)
            }
        }

        impl Drop for TempToml {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let config = Config::load_with_env(&Overrides::default(), HashMap::new()).expect("defaults are valid");
        assert_eq!(config.zookeeper.connect, "127.0.0.1:2181");
        assert_eq!(config.zookeeper.session_timeout, Duration::from_secs(30));
        assert_eq!(config.zookeeper.root, "/zkq");
        assert_eq!(config.api.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(config.admin.listen.to_string(), "0.0.0.0:9090");
        assert_eq!(config.log.format, LogFormat::Text);
        assert_eq!(config.take.max_wait, Duration::from_secs(20));
        assert_eq!(config.api.max_delay, Duration::from_secs(30 * 24 * 3600));
    }

    #[test]
    fn layers_apply_in_order_file_env_flags() {
        let file = write_toml(
            "[zookeeper]\nconnect = \"file:1\"\nroot = \"/from-file\"\nsession_timeout = \"12s\"\n[log]\nformat = \"json\"\n",
        );
        let overrides = Overrides {
            config_file: Some(file.0.clone()),
            zk_connect: Some("flag:3".to_owned()),
            ..Overrides::default()
        };
        let config = Config::load_with_env(
            &overrides,
            env(&[("ZKQ__ZOOKEEPER__CONNECT", "env:2"), ("ZKQ__ZOOKEEPER__ROOT", "/from-env")]),
        )
        .expect("valid layers");
        assert_eq!(config.zookeeper.connect, "flag:3", "flags beat env and file");
        assert_eq!(config.zookeeper.root, "/from-env", "env beats file");
        assert_eq!(config.zookeeper.session_timeout, Duration::from_secs(12), "file beats defaults");
        assert_eq!(config.log.format, LogFormat::Json);
    }

    #[test]
    fn unknown_keys_are_errors_in_file_and_env() {
        let file = write_toml("[zookeeper]\nsesion_timeout = \"12s\"\n");
        let overrides = Overrides { config_file: Some(file.0.clone()), ..Overrides::default() };
        let err = Config::load_with_env(&overrides, HashMap::new()).expect_err("typo must fail");
        assert!(err.to_string().contains("sesion_timeout"), "{err}");

        let err = Config::load_with_env(&Overrides::default(), env(&[("ZKQ__ZOOKEPER__CONNECT", "x:1")]))
            .expect_err("unknown section must fail");
        assert!(err.to_string().contains("zookeper"), "{err}");
    }

    #[test]
    fn a_log_filter_that_does_not_parse_is_refused_not_replaced_by_info() {
        for bad in ["zkq=loud", "[[", "info,=warn=x"] {
            let overrides = Overrides { log_level: Some(bad.to_owned()), ..Overrides::default() };
            let err = Config::load_with_env(&overrides, HashMap::new()).expect_err(bad);
            assert_eq!(err.key, "log.level", "{bad}: {err}");
        }
        let overrides = Overrides { log_level: Some("zkq=debug,info".to_owned()), ..Overrides::default() };
        assert!(Config::load_with_env(&overrides, HashMap::new()).is_ok());
    }

    #[test]
    fn a_config_file_that_is_not_toml_names_the_file() {
        let file = write_toml("[zookeeper\nconnect = 1");
        let overrides = Overrides { config_file: Some(file.0.clone()), ..Overrides::default() };
        let err = Config::load_with_env(&overrides, HashMap::new()).expect_err("not TOML");
        assert_eq!(err.key, "--config", "{err}");
        assert!(err.to_string().contains("not valid TOML"), "{err}");
    }

    #[test]
    fn bad_values_name_key_value_and_what_is_allowed() {
        let err = Config::load_with_env(&Overrides::default(), env(&[("ZKQ__ZOOKEEPER__SESSION_TIMEOUT", "1s")]))
            .expect_err("too short");
        let text = err.to_string();
        assert!(
            text.contains("zookeeper.session_timeout") && text.contains("1s") && text.contains("between 2s"),
            "{text}"
        );

        let err = Config::load_with_env(&Overrides::default(), env(&[("ZKQ__ZOOKEEPER__SESSION_TIMEOUT", "soon")]))
            .expect_err("not a duration");
        let text = err.to_string();
        assert!(text.contains("zookeeper.session_timeout") && text.contains("20s"), "{text}");

        let err = Config::load_with_env(&Overrides::default(), env(&[("ZKQ__ZOOKEEPER__ROOT", "zkq/")]))
            .expect_err("relative root");
        assert!(err.to_string().contains("zookeeper.root = \"zkq/\""), "{err}");

        let overrides = Overrides { log_format: Some("xml".to_owned()), ..Overrides::default() };
        let err = Config::load_with_env(&overrides, HashMap::new()).expect_err("bad enum");
        assert!(err.to_string().contains("xml") && err.to_string().contains("json"), "{err}");
    }

    #[test]
    fn queue_declarations_are_checked() {
        let file = write_toml("[queues.\"bad/name\"]\nkind = \"fifo\"\n");
        let overrides = Overrides { config_file: Some(file.0.clone()), ..Overrides::default() };
        let err = Config::load_with_env(&overrides, HashMap::new()).expect_err("bad queue name");
        assert!(err.to_string().contains("queues.bad/name"), "{err}");

        let file = write_toml("[queues.jobs]\nkind = \"simple\"\nlock_path = \"/locks/jobs\"\n");
        let overrides = Overrides { config_file: Some(file.0.clone()), ..Overrides::default() };
        let err = Config::load_with_env(&overrides, HashMap::new()).expect_err("simple with lock path");
        assert!(err.to_string().contains("queues.jobs.lock_path"), "{err}");

        let file = write_toml("[queues.jobs]\nkind = \"priority\"\npath = \"/app/jobs\"\nlock_path = \"/app/locks\"\n");
        let overrides = Overrides { config_file: Some(file.0.clone()), ..Overrides::default() };
        let config = Config::load_with_env(&overrides, HashMap::new()).expect("valid queue");
        assert_eq!(config.queues["jobs"].kind, QueueKind::Priority);
    }

    #[test]
    fn idempotency_windows_default_to_five_minutes_and_are_bounded() {
        let file = write_toml("[queues.orders]\nidempotency_window = \"90s\"\n[queues.plain]\n");
        let overrides = Overrides { config_file: Some(file.0.clone()), ..Overrides::default() };
        let config = Config::load_with_env(&overrides, HashMap::new()).expect("valid window");
        assert_eq!(config.idempotency_window("orders"), Duration::from_secs(90));
        assert_eq!(config.idempotency_window("plain"), DEFAULT_IDEMPOTENCY_WINDOW);
        assert_eq!(config.idempotency_window("dynamic"), Duration::from_secs(300));
        assert!(config.to_redacted_toml().contains("idempotency_window = \"1m 30s\""), "{}", config.to_redacted_toml());
        for bad in ["0s", "500ms", "9s", "2h", "soon"] {
            let file = write_toml(&format!("[queues.orders]\nidempotency_window = \"{bad}\"\n"));
            let overrides = Overrides { config_file: Some(file.0.clone()), ..Overrides::default() };
            let err = Config::load_with_env(&overrides, HashMap::new()).expect_err(bad);
            assert_eq!(err.key, "queues.orders.idempotency_window", "{bad}: {err}");
        }
    }

    #[test]
    fn check_config_output_redacts_secrets_and_round_trips() {
        let config =
            Config::load_with_env(&Overrides::default(), env(&[("ZKQ__ZOOKEEPER__AUTH_DIGEST", "svc:hunter2")]))
                .expect("valid");
        let text = config.to_redacted_toml();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("session_timeout = \"30s\""), "{text}");
    }

    #[test]
    fn secrets_never_appear_in_debug_output_or_check_config() {
        let file = write_toml(
            "[zookeeper]\nauth_digest = \"svc:hunter2\"\n[zookeeper.sasl]\nmechanism = \"DIGEST-MD5\"\n\
             username = \"app\"\npassword = \"sasl-pass-42\"\n",
        );
        let overrides = Overrides { config_file: Some(file.0.clone()), ..Overrides::default() };
        let config = Config::load_with_env(&overrides, HashMap::new()).expect("valid");
        for text in [format!("{config:?}"), format!("{:?}", config.zookeeper), config.to_redacted_toml()] {
            assert!(!text.contains("hunter2") && !text.contains("sasl-pass-42"), "{text}");
            assert!(text.contains("<redacted>"), "{text}");
        }
        assert_eq!(config.zookeeper.sasl.password.as_ref().map(Secret::expose), Some("sasl-pass-42"));
        assert_eq!(config.node_acl(), NodeAcl::CreatorAll, "credentials make nodes creator-only");
    }

    #[test]
    fn acl_entries_parse_as_zookeepers_cli_writes_them() {
        let hash = digest_hash("app:secret");
        let entry = AclEntry::parse(&format!("digest:app:{hash}:cdrwa")).expect("digest");
        assert_eq!((entry.scheme.as_str(), entry.id.as_str(), entry.perms), ("digest", &*format!("app:{hash}"), 31));
        assert_eq!(AclEntry::parse("world:anyone:r").expect("world").perms, acl_perms::READ);
        assert_eq!(AclEntry::parse("auth::cdrwa").expect("auth").id, "");
        assert!(AclEntry::parse("ip:10.0.0.0/8:rw").is_ok());
        assert!(AclEntry::parse("x509:CN=app,O=shop:cdrw").is_ok());
        for bad in [
            "world:anyone",
            "world:someone:r",
            "auth:app:cdrwa",
            "digest:app:short:cdrwa",
            "digest::AAAAAAAAAAAAAAAAAAAAAAAAAAA=:r",
            "ip:10.0.0.0/33:r",
            "ip:not-an-ip:r",
            "world:anyone:rx",
            "world:anyone:rr",
            "world:anyone:",
            "kerberos:app:r",
            "sasl::r",
        ] {
            assert!(AclEntry::parse(bad).is_err(), "{bad:?} must be refused");
        }
        // What ZooKeeper's own DigestAuthenticationProvider prints for app:secret.
        assert_eq!(digest_hash("app:secret"), "F6Y+U5gIoCbNNoLQExmvxRFeatA=");
    }

    #[test]
    fn an_acl_list_that_locks_zkq_out_is_refused() {
        let load = |toml: &str| {
            let file = write_toml(toml);
            let overrides = Overrides { config_file: Some(file.0.clone()), ..Overrides::default() };
            Config::load_with_env(&overrides, HashMap::new())
        };
        let hash = digest_hash("app:secret");
        let ok = load(&format!(
            "[zookeeper]\nauth_digest = \"app:secret\"\nacl = [\"digest:app:{hash}:cdrwa\", \"world:anyone:r\"]\n"
        ))
        .expect("own digest entry");
        assert!(matches!(ok.node_acl(), NodeAcl::List(entries) if entries.len() == 2));
        for (toml, words) in [
            ("[zookeeper]\nacl = [\"auth::cdrwa\"]\n", "none are configured"),
            ("[zookeeper]\nauth_digest = \"app:secret\"\nacl = []\n", "at least one entry"),
            ("[zookeeper]\nauth_digest = \"app:secret\"\nacl = [\"world:anyone:r\"]\n", "crwd"),
            (
                "[zookeeper]\nauth_digest = \"app:other\"\nacl = [\"digest:app:D/InIHSb7yEEbrWz8b9l71RjZJU=:cdrwa\"]\n",
                "does not match zookeeper.auth_digest",
            ),
            ("[zookeeper]\nacl = [\"world:anyone:cdrwa\", \"nonsense\"]\n", "scheme:id:perms"),
        ] {
            let err = load(toml).expect_err(toml);
            assert_eq!(err.key, "zookeeper.acl", "{toml}: {err}");
            assert!(err.to_string().contains(words), "{toml}: {err}");
            assert!(!err.to_string().contains("secret"), "{toml}: the password is printed: {err}");
        }
        // Addresses and certificates cannot be checked here: such a list is trusted.
        assert!(load("[zookeeper]\nacl = [\"ip:10.0.0.0/8:cdrwa\"]\n").is_ok());
        assert_eq!(Config::default().node_acl(), NodeAcl::Open, "no credentials: open, as before");
    }

    #[test]
    fn tls_and_sasl_settings_are_checked_together() {
        let load = |pairs: &[(&str, &str)]| Config::load_with_env(&Overrides::default(), env(pairs));
        let cases: [(&[(&str, &str)], &str); 6] = [
            (&[("ZKQ__ZOOKEEPER__TLS__ENABLED", "true")], "zookeeper.tls.ca_file"),
            (
                &[
                    ("ZKQ__ZOOKEEPER__TLS__ENABLED", "true"),
                    ("ZKQ__ZOOKEEPER__TLS__CA_FILE", "/ca.crt"),
                    ("ZKQ__ZOOKEEPER__TLS__CERT_FILE", "/c.crt"),
                ],
                "zookeeper.tls.key_file",
            ),
            (&[("ZKQ__ZOOKEEPER__TLS__CA_FILE", "/ca.crt")], "zookeeper.tls.ca_file"),
            (&[("ZKQ__ZOOKEEPER__SASL__MECHANISM", "DIGEST-MD5")], "zookeeper.sasl.username"),
            (
                &[("ZKQ__ZOOKEEPER__SASL__MECHANISM", "DIGEST-MD5"), ("ZKQ__ZOOKEEPER__SASL__USERNAME", "app")],
                "zookeeper.sasl.password",
            ),
            (&[("ZKQ__ZOOKEEPER__SASL__USERNAME", "app")], "zookeeper.sasl.username"),
        ];
        for (pairs, key) in cases {
            let err = load(pairs).expect_err(key);
            assert_eq!(err.key, key, "{pairs:?}: {err}");
        }
        let config = load(&[
            ("ZKQ__ZOOKEEPER__TLS__ENABLED", "true"),
            ("ZKQ__ZOOKEEPER__TLS__CA_FILE", "/etc/zkq/tls/ca.crt"),
            ("ZKQ__ZOOKEEPER__SASL__MECHANISM", "digest-md5"),
            ("ZKQ__ZOOKEEPER__SASL__USERNAME", "app"),
            ("ZKQ__ZOOKEEPER__SASL__PASSWORD_FILE", "/etc/zkq/sasl/password"),
        ])
        .expect("TLS with a CA and SASL with a password file");
        assert!(config.zookeeper.tls.verify_hostname, "hostname verification is on by default");
        assert_eq!(config.zookeeper.sasl.mechanism, Some(SaslMechanism::DigestMd5));
        assert!(config.api.refuse_cross_origin, "cross-origin browser requests are refused by default");
    }

    #[test]
    fn paths_with_characters_zookeeper_refuses_are_refused_naming_the_key() {
        for (section, key) in [("queues.q", "path"), ("queues.q", "lock_path"), ("counters.c", "path")] {
            let file = write_toml(&format!("[{section}]\n{key} = \"/app/x\\uE000y\"\n"));
            let overrides = Overrides { config_file: Some(file.0.clone()), ..Overrides::default() };
            let err = Config::load_with_env(&overrides, HashMap::new()).expect_err("refused character");
            assert_eq!(err.key, format!("{section}.{key}"), "{err}");
            assert!(err.to_string().contains("U+E000"), "{err}");
        }
        let err = Config::load_with_env(&Overrides::default(), env(&[("ZKQ__ZOOKEEPER__ROOT", "/zkq\u{fff0}")]))
            .expect_err("refused character");
        assert_eq!(err.key, "zookeeper.root");
    }

    #[test]
    fn queue_paths_among_the_idempotency_records_are_refused() {
        for (key, path) in [
            ("path", "/zkq/idempotency"),
            ("path", "/zkq/idempotency/orders"),
            ("lock_path", "/zkq/idempotency/orders/locks"),
        ] {
            let file = write_toml(&format!("[queues.orders]\n{key} = \"{path}\"\n"));
            let overrides = Overrides { config_file: Some(file.0.clone()), ..Overrides::default() };
            let err = Config::load_with_env(&overrides, HashMap::new()).expect_err(path);
            assert_eq!(err.key, format!("queues.orders.{key}"), "{err}");
            assert!(err.to_string().contains("/zkq/idempotency, where zkq keeps its idempotency records"), "{err}");
        }
        // Another root, or a name that only starts the same, is fine.
        let file =
            write_toml("[queues.a]\npath = \"/zkq/idempotency-queue\"\n[queues.b]\npath = \"/other/idempotency/b\"\n");
        let overrides = Overrides { config_file: Some(file.0.clone()), ..Overrides::default() };
        Config::load_with_env(&overrides, HashMap::new()).expect("not among the records");
        let file = write_toml("[zookeeper]\nroot = \"/app\"\n[queues.a]\npath = \"/zkq/idempotency/a\"\n");
        let overrides = Overrides { config_file: Some(file.0.clone()), ..Overrides::default() };
        Config::load_with_env(&overrides, HashMap::new()).expect("the records are under /app/idempotency");
    }

    #[test]
    fn names_follow_the_url_segment_rule() {
        assert!(check_name("orders.v2_high-prio").is_ok());
        for bad in ["", ".", "..", "a/b", "a b", "ü", &"x".repeat(201)] {
            assert!(check_name(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(check_name(&"x".repeat(200)).is_ok());
    }

    fn load_toml(text: &str) -> Result<Config, ConfigError> {
        let file = write_toml(text);
        let overrides = Overrides { config_file: Some(file.0.clone()), ..Overrides::default() };
        Config::load_with_env(&overrides, HashMap::new())
    }

    #[test]
    fn a_push_subscription_takes_documented_defaults_and_round_trips() {
        let config = load_toml("[queues.orders.push]\nurl = \"http://127.0.0.1:3000/orders\"\n").expect("valid");
        let push = config.queues["orders"].push.clone().expect("push table");
        assert_eq!(push, PushConfig { url: "http://127.0.0.1:3000/orders".to_owned(), ..PushConfig::default() });
        assert_eq!(
            (push.concurrency, push.visibility, push.request_timeout),
            (1, Duration::from_secs(30), Duration::from_secs(30))
        );
        assert_eq!(
            (push.backoff_initial, push.backoff_max, push.backoff_jitter),
            (Duration::from_secs(1), Duration::from_secs(60), 0.2)
        );
        assert_eq!((push.readiness_url, push.readiness_interval), (None, Duration::from_secs(1)));
        assert_eq!((push.content_type.as_str(), push.event_type.as_str()), ("application/octet-stream", "zkq.message"));
        assert!(!push.allow_remote);
        let text = config.to_redacted_toml();
        assert!(text.contains("[queues.orders.push]") && text.contains("backoff_max = \"1m\""), "{text}");
        assert!(!load_toml("[queues.plain]\n").expect("valid").to_redacted_toml().contains("push"));

        let env = env(&[
            ("ZKQ__QUEUES__JOBS__PUSH__URL", "http://localhost:8000/jobs"),
            ("ZKQ__QUEUES__JOBS__PUSH__CONCURRENCY", "4"),
            ("ZKQ__QUEUES__JOBS__PUSH__BACKOFF_JITTER", "0"),
            ("ZKQ__QUEUES__JOBS__PUSH__READINESS_URL", "http://localhost:8000/ready"),
        ]);
        let config = Config::load_with_env(&Overrides::default(), env).expect("push from the environment");
        let push = config.queues["jobs"].push.clone().expect("push table");
        assert_eq!((push.concurrency, push.backoff_jitter), (4, 0.0));
        assert_eq!(push.readiness_url.as_deref(), Some("http://localhost:8000/ready"));
    }

    #[test]
    fn push_subscriptions_are_checked_naming_the_key() {
        let ok = "url = \"http://127.0.0.1:3000/x\"\n";
        for (queue, push, key, needle) in [
            ("", "", "queues.q.push.url", "required"),
            ("", "url = \"https://127.0.0.1/x\"\n", "queues.q.push.url", "only http://"),
            ("", "url = \"http://10.1.2.3/x\"\n", "queues.q.push.url", "loopback"),
            (
                "",
                &format!("{ok}readiness_url = \"http://app.example/ready\"\n"),
                "queues.q.push.readiness_url",
                "loopback",
            ),
            ("kind = \"simple\"\n", ok, "queues.q.push", "simple queues cannot be pushed"),
            ("path = \"/app/q\"\n", ok, "queues.q.push", "lock_path"),
            ("", &format!("{ok}concurrency = 0\n"), "queues.q.push.concurrency", "between 1 and 1000"),
            ("", &format!("{ok}concurrency = 1001\n"), "queues.q.push.concurrency", "between 1 and 1000"),
            ("", &format!("{ok}visibility = \"500ms\"\n"), "queues.q.push.visibility", "between 1s"),
            ("", &format!("{ok}request_timeout = \"2h\"\n"), "queues.q.push.request_timeout", "and 1h"),
            (
                "",
                &format!("{ok}backoff_initial = \"5s\"\nbackoff_max = \"1s\"\n"),
                "queues.q.push.backoff_max",
                "between 5s",
            ),
            ("", &format!("{ok}backoff_jitter = 1.5\n"), "queues.q.push.backoff_jitter", "0.0 and 1.0"),
            ("", &format!("{ok}readiness_interval = \"10ms\"\n"), "queues.q.push.readiness_interval", "between 100ms"),
            ("", &format!("{ok}content_type = \"text/\\nplain\"\n"), "queues.q.push.content_type", "printable ASCII"),
            ("", &format!("{ok}event_type = \"\"\n"), "queues.q.push.event_type", "printable ASCII"),
            ("", &format!("{ok}conncurrency = 2\n"), "queues.q.push.conncurrency", "unknown key"),
        ] {
            let err = load_toml(&format!("[queues.q]\n{queue}[queues.q.push]\n{push}")).expect_err(push);
            assert_eq!(err.key, key, "{push}: {err}");
            assert!(err.to_string().contains(needle), "{push}: {err}");
        }
        let remote = load_toml("[queues.q.push]\nurl = \"http://app.example:80/x\"\nallow_remote = true\n");
        assert!(remote.is_ok(), "allow_remote lets a subscription push off the pod: {remote:?}");
        let capped = load_toml(&format!("[lease]\nmax_per_queue = 4\n[queues.q.push]\n{ok}concurrency = 5\n"))
            .expect_err("concurrency above lease.max_per_queue");
        assert!(capped.to_string().contains("between 1 and 4"), "{capped}");
        let attached =
            load_toml(&format!("[queues.q]\npath = \"/app/q\"\nlock_path = \"/app/locks\"\n[queues.q.push]\n{ok}"));
        assert!(attached.is_ok(), "an attached queue with a lock path can be pushed: {attached:?}");
    }

    #[test]
    fn check_config_recommends_max_items_for_declared_queues_without_one() {
        let mut config = Config::default();
        for (name, kind, max_items) in
            [("f", QueueKind::Fifo, None), ("p", QueueKind::Priority, None), ("capped", QueueKind::Fifo, Some(10))]
        {
            config.queues.insert(
                name.to_owned(),
                QueueConfig {
                    kind,
                    path: None,
                    lock_path: None,
                    max_items,
                    max_deliveries: None,
                    dead_letter: None,
                    push: None,
                    idempotency_window: None,
                },
            );
        }
        let advice = config.max_items_recommendations();
        assert_eq!(advice.len(), 2, "{advice:?}");
        assert!(advice[0].starts_with("queues.f.max_items") && advice[0].ends_with("= 47185"), "{advice:?}");
        assert!(advice[1].starts_with("queues.p.max_items") && advice[1].ends_with("= 32541"), "{advice:?}");
    }
}
