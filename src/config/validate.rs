//! Every check that involves more than one value's type: ranges, paths, cross-field rules, one
//! function per section.

use std::path::Path;
use std::time::Duration;

use super::error::{ConfigError, invalid};
use super::{
    Config, MAX_IDEMPOTENCY_WINDOW, MAX_PUSH_CONCURRENCY, MAX_RETENTION, MIN_IDEMPOTENCY_WINDOW, MIN_RETENTION,
    PushConfig, QueueConfig, QueueKind, SaslMechanism,
};
use crate::types::acl::{AclEntry, acl_perms, digest_hash};

/// The smallest `zookeeper.jute_maxbuffer`: Java's default, which every server reads.
const MIN_JUTE_MAXBUFFER: usize = 0xf_ffff;
/// The largest `zookeeper.jute_maxbuffer` taken (64 MiB): every server holds its whole tree in
/// memory, and a node that size is sent to every watcher of its queue.
const MAX_JUTE_MAXBUFFER: usize = 64 * 1024 * 1024;
/// What a message leaves of `jute.maxbuffer`: its envelope, its path, the ACL of its create, an
/// idempotency record beside it (1,000,000 bytes of body at Java's default).
const MESSAGE_ROOM: usize = 48_575;

/// The largest `api.max_message_bytes` with servers that read `jute_maxbuffer` bytes.
pub(crate) fn largest_message_bytes(jute_maxbuffer: usize) -> usize {
    jute_maxbuffer.saturating_sub(MESSAGE_ROOM)
}

/// The largest `api.max_batch_bytes` with servers that read `jute_maxbuffer` bytes: three
/// quarters of it, for the creates' paths and ACLs (786,432 at Java's default).
pub(crate) fn largest_batch_bytes(jute_maxbuffer: usize) -> usize {
    jute_maxbuffer.saturating_add(1) / 4 * 3
}

impl Config {
    /// Every check that involves more than one value's type: ranges, paths, cross-field rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_sqs()?;
        self.validate_zookeeper()?;
        self.validate_security()?;
        self.validate_limits()?;
        self.validate_queues()?;
        for (name, counter) in &self.counters {
            let key = format!("counters.{name}");
            if let Some(path) = &counter.path {
                check_zk_path(&format!("{key}.path"), path)?;
            }
        }
        Ok(())
    }

    /// Checks `[zookeeper]`: the connect string, the timeouts, the root.
    fn validate_zookeeper(&self) -> Result<(), ConfigError> {
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
        if !(MIN_JUTE_MAXBUFFER..=MAX_JUTE_MAXBUFFER).contains(&zk.jute_maxbuffer) {
            return Err(invalid(
                "zookeeper.jute_maxbuffer",
                zk.jute_maxbuffer,
                format!(
                    "between {MIN_JUTE_MAXBUFFER} (Java's default) and {MAX_JUTE_MAXBUFFER} bytes, and never more than \
                     every server's -Djute.maxbuffer"
                ),
            ));
        }
        check_zk_path("zookeeper.root", &zk.root)?;
        if zk.root == "/" {
            return Err(invalid("zookeeper.root", &zk.root, "must be a node below /, such as /zkq"));
        }
        Ok(())
    }

    /// Checks the listeners' and the requests' bounds: `[api]`, `[admin]`, `[take]`, `[lease]`, `[log]`,
    /// `[shutdown]` and the fleet's.
    fn validate_limits(&self) -> Result<(), ConfigError> {
        if self.api.listen == self.admin.listen && self.api.listen.port() != 0 {
            return Err(invalid("admin.listen", self.admin.listen, "must differ from api.listen"));
        }
        let largest_message = largest_message_bytes(self.zookeeper.jute_maxbuffer);
        if !(1..=largest_message).contains(&self.api.max_message_bytes) {
            return Err(invalid(
                "api.max_message_bytes",
                self.api.max_message_bytes,
                format!(
                    "between 1 and {largest_message} bytes (a message is one znode, written in one request: \
                     zookeeper.jute_maxbuffer less {MESSAGE_ROOM})"
                ),
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
            ("api.body_read_timeout", self.api.body_read_timeout),
            ("admin.idle_timeout", self.admin.idle_timeout),
        ] {
            check_duration(key, value, Duration::from_millis(100), Duration::from_secs(600))?;
        }
        if self.log.level.trim().is_empty() || tracing_subscriber::EnvFilter::builder().parse(&self.log.level).is_err()
        {
            return Err(invalid("log.level", &self.log.level, "a filter like info, debug or zkq=debug,info"));
        }
        check_duration("take.max_wait", self.take.max_wait, Duration::ZERO, Duration::from_secs(3600))?;
        // A settlement must have time for a request before it stops trusting a missing marker.
        check_duration(
            "take.claim_marker_age",
            self.take.claim_marker_age,
            (self.zookeeper.request_timeout * 2).max(Duration::from_secs(1)),
            Duration::from_secs(7 * 24 * 3600),
        )?;
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
        let largest_batch = largest_batch_bytes(self.zookeeper.jute_maxbuffer);
        if !(1024..=largest_batch).contains(&self.api.max_batch_bytes) {
            return Err(invalid(
                "api.max_batch_bytes",
                self.api.max_batch_bytes,
                format!(
                    "between 1024 and {largest_batch} (a batch put is one transaction: three quarters of \
                     zookeeper.jute_maxbuffer)"
                ),
            ));
        }
        check_duration("shutdown.grace", self.shutdown.grace, Duration::ZERO, Duration::from_secs(3600))?;
        check_duration(
            "queue_idle_close",
            self.queue_idle_close,
            Duration::from_secs(1),
            Duration::from_secs(7 * 24 * 3600),
        )?;
        if self.queues_fleet_watchers > 1000 {
            return Err(invalid(
                "queues_fleet_watchers",
                self.queues_fleet_watchers,
                "at most 1000 (0: every sidecar)",
            ));
        }
        if self.max_dynamic_queues > 100_000 {
            return Err(invalid("max_dynamic_queues", self.max_dynamic_queues, "at most 100000"));
        }
        Ok(())
    }

    /// Checks each of `[queues]`.
    fn validate_queues(&self) -> Result<(), ConfigError> {
        for (name, queue) in &self.queues {
            let key = format!("queues.{name}");
            // zkq keeps idempotency records there and its sweepers delete what they find.
            let records = crate::types::Layout::new(&self.zookeeper.root).idempotency();
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
            if let Some(retention) = queue.retention {
                check_duration(&format!("{key}.retention"), retention, MIN_RETENTION, MAX_RETENTION)?;
            }
            if queue.max_deliveries.is_some() && queue.dead_letter.is_none() {
                return Err(invalid(
                    format!("{key}.max_deliveries"),
                    queue.max_deliveries,
                    "needs a dead_letter queue to move messages to",
                ));
            }
            if queue.grouped {
                // A group is held by its head's lock: every consumption of a grouped queue is a lease.
                let why = match queue.kind {
                    QueueKind::Fifo | QueueKind::Id if queue.lock_path.is_some() || queue.path.is_none() => None,
                    QueueKind::Fifo | QueueKind::Id => {
                        Some("a queue attached by path needs its lock_path to be grouped (a group is held by a lock)")
                    },
                    _ => Some(
                        "only fifo and id queues can be grouped (priority and delay queues order by their own keys)",
                    ),
                };
                if let Some(why) = why {
                    return Err(invalid(format!("{key}.grouped"), queue.kind.as_str(), why));
                }
            }
            if let Some(push) = &queue.push {
                self.validate_push(&key, queue, push)?;
            }
        }
        Ok(())
    }

    /// Checks `[sqs]`.
    fn validate_sqs(&self) -> Result<(), ConfigError> {
        let sqs = &self.sqs;
        if sqs.account_id.len() != 12 || !sqs.account_id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid("sqs.account_id", &sqs.account_id, "12 digits, as an AWS account id"));
        }
        if sqs.region.is_empty()
            || sqs.region.len() > 64
            || !sqs.region.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(invalid("sqs.region", &sqs.region, "a region name such as us-east-1 (a-z, 0-9 and -)"));
        }
        if let Some(listen) = sqs.listen {
            if listen.port() != 0 && (listen == self.api.listen || listen == self.admin.listen) {
                return Err(invalid("sqs.listen", listen, "must differ from api.listen and admin.listen"));
            }
            if self.api.token_file.is_some() && sqs.access_key_id.is_none() {
                return Err(invalid(
                    "sqs.listen",
                    listen,
                    "with api.token_file guarding the API, the SQS listener needs sqs.access_key_id and \
                     sqs.secret_access_key_file: it verifies every request's AWS signature with them",
                ));
            }
        }
        match (&sqs.access_key_id, &sqs.secret_access_key_file) {
            (Some(id), Some(_)) => {
                if id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
                    return Err(invalid(
                        "sqs.access_key_id",
                        id,
                        "1 to 128 letters and digits, as an AWS access key id",
                    ));
                }
            },
            (Some(id), None) => {
                return Err(invalid(
                    "sqs.access_key_id",
                    id,
                    "needs sqs.secret_access_key_file, the file of its secret",
                ));
            },
            (None, Some(path)) => {
                return Err(invalid(
                    "sqs.secret_access_key_file",
                    path.display(),
                    "needs sqs.access_key_id, the key id its secret belongs to",
                ));
            },
            (None, None) => {},
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
            if !push.allow_remote && !url.is_loopback() {
                return Err(invalid(
                    format!("{key}.{name}"),
                    url.to_string(),
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

    /// TLS, SASL, credentials, the ACL list and the API token: what can be checked without
    /// reading a file (files are read at start, see `secrets.rs` and `zk::load_secrets`).
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
            ("sqs.secret_access_key_file", &self.sqs.secret_access_key_file),
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

    /// `auth` has credentials to refer to, and some entry lets zkq's own session read, write,
    /// create and delete (else zkq would lock itself out of its nodes). Each entry parsed when
    /// the configuration was read.
    fn validate_acl(&self, entries: &[AclEntry]) -> Result<(), ConfigError> {
        if entries.is_empty() {
            return Err(invalid(
                "zookeeper.acl",
                entries.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "at least one entry, like \"auth::cdrwa\"; leave the key out for the default",
            ));
        }
        let mut granted = 0u8;
        let mut unverifiable = false;
        for entry in entries {
            let text = entry.to_string();
            let ours = match entry.scheme.as_str() {
                "world" => true,
                "auth" => {
                    if !self.has_credentials() {
                        return Err(invalid(
                            "zookeeper.acl",
                            &text,
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
                                &text,
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
                entries.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "no entry lets zkq's own session read, write, create and delete (crwd) the nodes it \
                 creates: add \"auth::cdrwa\" (with credentials) or an entry for zkq's own user",
            ));
        }
        Ok(())
    }
}

/// A file key names an absolute path (the file itself is read at start).
fn check_file_path(key: &str, path: &Path) -> Result<(), ConfigError> {
    if path.as_os_str().is_empty() {
        return Err(invalid(key, path, "a path to a file, e.g. a mounted Secret"));
    }
    Ok(())
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
