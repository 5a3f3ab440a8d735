//! The configuration's tests: defaults, layering, and each error naming its key.

use std::collections::HashMap;
use std::time::Duration;

use super::*;
use crate::types::acl::digest_hash;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// A TOML file in the system temp dir, removed on drop.
fn write_toml(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().expect("temp dir is writable");
    std::io::Write::write_all(&mut file, text.as_bytes()).expect("temp file is writable");
    file
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
        config_file: Some(file.path().to_path_buf()),
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
    let overrides = Overrides { config_file: Some(file.path().to_path_buf()), ..Overrides::default() };
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
    let overrides = Overrides { config_file: Some(file.path().to_path_buf()), ..Overrides::default() };
    let err = Config::load_with_env(&overrides, HashMap::new()).expect_err("not TOML");
    assert_eq!(err.key, "--config", "{err}");
    assert!(err.to_string().contains("not valid TOML"), "{err}");
}

#[test]
fn bad_values_name_key_value_and_what_is_allowed() {
    let err = Config::load_with_env(&Overrides::default(), env(&[("ZKQ__ZOOKEEPER__SESSION_TIMEOUT", "1s")]))
        .expect_err("too short");
    let text = err.to_string();
    assert!(text.contains("zookeeper.session_timeout") && text.contains("1s") && text.contains("between 2s"), "{text}");

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
    let overrides = Overrides { config_file: Some(file.path().to_path_buf()), ..Overrides::default() };
    let err = Config::load_with_env(&overrides, HashMap::new()).expect_err("bad queue name");
    assert!(err.to_string().contains("queues.bad/name"), "{err}");

    let file = write_toml("[queues.jobs]\nkind = \"simple\"\nlock_path = \"/locks/jobs\"\n");
    let overrides = Overrides { config_file: Some(file.path().to_path_buf()), ..Overrides::default() };
    let err = Config::load_with_env(&overrides, HashMap::new()).expect_err("simple with lock path");
    assert!(err.to_string().contains("queues.jobs.lock_path"), "{err}");

    let file = write_toml("[queues.jobs]\nkind = \"priority\"\npath = \"/app/jobs\"\nlock_path = \"/app/locks\"\n");
    let overrides = Overrides { config_file: Some(file.path().to_path_buf()), ..Overrides::default() };
    let config = Config::load_with_env(&overrides, HashMap::new()).expect("valid queue");
    assert_eq!(config.queues["jobs"].kind, QueueKind::Priority);
}

#[test]
fn idempotency_windows_default_to_five_minutes_and_are_bounded() {
    let file = write_toml("[queues.orders]\nidempotency_window = \"90s\"\n[queues.plain]\n");
    let overrides = Overrides { config_file: Some(file.path().to_path_buf()), ..Overrides::default() };
    let config = Config::load_with_env(&overrides, HashMap::new()).expect("valid window");
    assert_eq!(config.idempotency_window("orders"), Duration::from_secs(90));
    assert_eq!(config.idempotency_window("plain"), DEFAULT_IDEMPOTENCY_WINDOW);
    assert_eq!(config.idempotency_window("dynamic"), Duration::from_secs(300));
    assert!(config.to_redacted_toml().contains("idempotency_window = \"1m 30s\""), "{}", config.to_redacted_toml());
    for bad in ["0s", "500ms", "9s", "2h", "soon"] {
        let file = write_toml(&format!("[queues.orders]\nidempotency_window = \"{bad}\"\n"));
        let overrides = Overrides { config_file: Some(file.path().to_path_buf()), ..Overrides::default() };
        let err = Config::load_with_env(&overrides, HashMap::new()).expect_err(bad);
        assert_eq!(err.key, "queues.orders.idempotency_window", "{bad}: {err}");
    }
}

#[test]
fn check_config_output_redacts_secrets_and_round_trips() {
    let config = Config::load_with_env(&Overrides::default(), env(&[("ZKQ__ZOOKEEPER__AUTH_DIGEST", "svc:hunter2")]))
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
    let overrides = Overrides { config_file: Some(file.path().to_path_buf()), ..Overrides::default() };
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
        let overrides = Overrides { config_file: Some(file.path().to_path_buf()), ..Overrides::default() };
        Config::load_with_env(&overrides, HashMap::new())
    };
    let hash = digest_hash("app:secret");
    let ok = load(&format!(
        "[zookeeper]\nauth_digest = \"app:secret\"\nacl = [\"digest:app:{hash}:cdrwa\", \"world:anyone:r\"]\n"
    ))
    .expect("own digest entry");
    assert!(matches!(ok.node_acl(), NodeAcl::List(entries) if entries.len() == 2));
    // Parsed once, written back as written (`zkq check-config` prints it).
    let printed: Vec<String> = ok.zookeeper.acl.iter().flatten().map(ToString::to_string).collect();
    assert_eq!(printed, [format!("digest:app:{hash}:cdrwa"), "world:anyone:r".to_owned()]);
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
        // An entry that does not parse is named by its place in the list.
        let key = if words == "scheme:id:perms" { "zookeeper.acl[1]" } else { "zookeeper.acl" };
        assert_eq!(err.key, key, "{toml}: {err}");
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
        let overrides = Overrides { config_file: Some(file.path().to_path_buf()), ..Overrides::default() };
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
        let overrides = Overrides { config_file: Some(file.path().to_path_buf()), ..Overrides::default() };
        let err = Config::load_with_env(&overrides, HashMap::new()).expect_err(path);
        assert_eq!(err.key, format!("queues.orders.{key}"), "{err}");
        assert!(err.to_string().contains("/zkq/idempotency, where zkq keeps its idempotency records"), "{err}");
    }
    // Another root, or a name that only starts the same, is fine.
    let file =
        write_toml("[queues.a]\npath = \"/zkq/idempotency-queue\"\n[queues.b]\npath = \"/other/idempotency/b\"\n");
    let overrides = Overrides { config_file: Some(file.path().to_path_buf()), ..Overrides::default() };
    Config::load_with_env(&overrides, HashMap::new()).expect("not among the records");
    let file = write_toml("[zookeeper]\nroot = \"/app\"\n[queues.a]\npath = \"/zkq/idempotency/a\"\n");
    let overrides = Overrides { config_file: Some(file.path().to_path_buf()), ..Overrides::default() };
    Config::load_with_env(&overrides, HashMap::new()).expect("the records are under /app/idempotency");
}

#[test]
fn a_bad_name_is_refused_at_load_naming_its_key() {
    let cases = [
        ("[queues.\"a b\"]\n", r#"queues.a b = "a b": may contain only A-Z a-z 0-9 . _ -"#),
        ("[queues.ok]\n[queues.\"..\"]\n", r#"queues... = "..": must not be . or .."#),
        (&format!("[queues.{}]\n", "x".repeat(201)), "must be 1 to 200 characters"),
        ("[counters.\"ü\"]\n", "counters.ü = \"ü\": may contain only A-Z a-z 0-9 . _ -"),
        (
            "[queues.orders]\nmax_deliveries = 3\ndead_letter = \"bad/dlq\"\n",
            r#"queues.orders.dead_letter = "bad/dlq": the name of another queue (queue name "bad/dlq" may contain only"#,
        ),
    ];
    for (text, expected) in cases {
        let err = load_toml(text).expect_err(text);
        assert!(err.to_string().contains(expected), "{text:?}: {err}");
    }
    let config = load_toml("[queues.\"orders.v2_high-prio\"]\n[counters.hits]\n").expect("valid names");
    assert!(config.queues.contains_key("orders.v2_high-prio") && config.counters.contains_key("hits"));
}

fn load_toml(text: &str) -> Result<Config, ConfigError> {
    let file = write_toml(text);
    let overrides = Overrides { config_file: Some(file.path().to_path_buf()), ..Overrides::default() };
    Config::load_with_env(&overrides, HashMap::new())
}

#[test]
fn a_push_subscription_takes_documented_defaults_and_round_trips() {
    let config = load_toml("[queues.orders.push]\nurl = \"http://127.0.0.1:3000/orders\"\n").expect("valid");
    let push = config.queues["orders"].push.clone().expect("push table");
    let url = AppUrl::parse("http://127.0.0.1:3000/orders").expect("a URL");
    assert_eq!(push, PushConfig::to(url));
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
    assert_eq!(push.readiness_url.map(|url| url.to_string()).as_deref(), Some("http://localhost:8000/ready"));
}

#[test]
fn push_subscriptions_are_checked_naming_the_key() {
    let ok = "url = \"http://127.0.0.1:3000/x\"\n";
    for (queue, push, key, needle) in [
        ("", "", "queues.q.push.url", "required"),
        ("", "url = \"https://127.0.0.1/x\"\n", "queues.q.push.url", "only http://"),
        ("", "url = \"http://10.1.2.3/x\"\n", "queues.q.push.url", "loopback"),
        ("", &format!("{ok}readiness_url = \"http://app.example/ready\"\n"), "queues.q.push.readiness_url", "loopback"),
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
            name.parse().expect("a valid name"),
            QueueConfig {
                kind,
                path: None,
                lock_path: None,
                max_items,
                max_deliveries: None,
                dead_letter: None,
                push: None,
                idempotency_window: None,
                grouped: false,
                sqs_binary_bodies: None,
                retention: None,
            },
        );
    }
    let advice = config.max_items_recommendations();
    assert_eq!(advice.len(), 2, "{advice:?}");
    assert!(advice[0].starts_with("queues.f.max_items") && advice[0].ends_with("= 47185"), "{advice:?}");
    assert!(advice[1].starts_with("queues.p.max_items") && advice[1].ends_with("= 32541"), "{advice:?}");
}

#[test]
fn only_fifo_and_id_queues_with_a_lock_path_can_be_grouped() {
    for kind in ["fifo", "id"] {
        let config = load_toml(&format!("[queues.orders]\nkind = \"{kind}\"\ngrouped = true\n")).expect(kind);
        assert!(config.queues.values().all(|q| q.grouped), "{kind} is grouped");
    }
    for (toml, why) in [
        ("[queues.orders]\nkind = \"priority\"\ngrouped = true\n", "only fifo and id"),
        ("[queues.orders]\nkind = \"delay\"\ngrouped = true\n", "only fifo and id"),
        ("[queues.orders]\nkind = \"simple\"\ngrouped = true\n", "only fifo and id"),
        ("[queues.orders]\npath = \"/app/orders\"\ngrouped = true\n", "needs its lock_path"),
    ] {
        let err = load_toml(toml).expect_err(toml).to_string();
        assert!(err.contains("queues.orders.grouped") && err.contains(why), "{toml}: {err}");
    }
}

#[test]
fn the_sqs_listener_is_off_by_default_and_its_keys_are_checked() {
    let config = load_toml("").expect("defaults");
    assert_eq!((config.sqs.listen, config.sqs.account_id.as_str()), (None, "000000000000"));
    let config = load_toml("[sqs]\nlisten = \"127.0.0.1:9324\"\n").expect("valid");
    assert_eq!(config.sqs.listen, Some("127.0.0.1:9324".parse().expect("addr")));
    for (toml, key) in [
        ("[sqs]\naccount_id = \"12\"\n", "sqs.account_id"),
        ("[sqs]\nregion = \"Us East\"\n", "sqs.region"),
        ("[sqs]\nlisten = \"127.0.0.1:8080\"\n", "sqs.listen"),
        ("[sqs]\nlisten = \"127.0.0.1:9324\"\n[api]\ntoken_file = \"/run/token\"\n", "sqs.listen"),
        ("[sqs]\naccess_key_id = \"AKID\"\n", "sqs.access_key_id"),
        ("[sqs]\nsecret_access_key_file = \"/run/secret\"\n", "sqs.secret_access_key_file"),
        ("[sqs]\naccess_key_id = \"AK ID\"\nsecret_access_key_file = \"/run/secret\"\n", "sqs.access_key_id"),
    ] {
        let err = load_toml(toml).expect_err(toml);
        assert_eq!(err.key, key, "{toml}: {err}");
    }
    // With an API token, the SQS listener verifies signatures with a key pair.
    let signed = "[sqs]\nlisten = \"127.0.0.1:9324\"\naccess_key_id = \"AKID\"\nsecret_access_key_file = \"/run/secret\"\n\
                  [api]\ntoken_file = \"/run/token\"\n";
    let config = load_toml(signed).expect("a signed SQS listener beside a token-guarded API");
    assert_eq!(config.sqs.access_key_id.as_deref(), Some("AKID"));
}

#[test]
fn the_servers_jute_maxbuffer_bounds_the_message_and_batch_sizes() {
    // Java's default: a message of up to 1,000,000 bytes, a batch of up to 786,432.
    for (toml, key, needle) in [
        ("[api]\nmax_message_bytes = 1000001\n", "api.max_message_bytes", "between 1 and 1000000 bytes"),
        ("[api]\nmax_batch_bytes = 786433\n", "api.max_batch_bytes", "between 1024 and 786432"),
        ("[zookeeper]\njute_maxbuffer = 1048574\n", "zookeeper.jute_maxbuffer", "between 1048575"),
        ("[zookeeper]\njute_maxbuffer = 67108865\n", "zookeeper.jute_maxbuffer", "and 67108864 bytes"),
        (
            "[zookeeper]\njute_maxbuffer = 4194304\n[api]\nmax_message_bytes = 4145730\n",
            "api.max_message_bytes",
            "between 1 and 4145729 bytes",
        ),
    ] {
        let err = load_toml(toml).expect_err(toml);
        assert_eq!(err.key, key, "{toml}: {err}");
        assert!(err.to_string().contains(needle), "{toml}: {err}");
    }
    assert!(load_toml("[api]\nmax_message_bytes = 1000000\nmax_batch_bytes = 786432\n").is_ok());
    // Servers that read 4 MiB: SQS's 1 MiB for a message and a batch.
    let larger =
        "[zookeeper]\njute_maxbuffer = 4194304\n[api]\nmax_message_bytes = 1048576\nmax_batch_bytes = 1048576\n";
    let config = load_toml(larger).expect("larger messages with larger requests");
    assert_eq!(config.zookeeper.jute_maxbuffer, 4 * 1024 * 1024);
}
