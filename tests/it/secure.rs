//! Secured ZooKeeper: TLS on the secure client port (Netty), mutual TLS, SASL DIGEST-MD5 with a
//! server that requires it, node ACLs, and the files zkq refuses at start. Certificates are made
//! at test time with openssl; the servers are real ZooKeeper 3.8.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use zkq::config::{AclEntry, Config, QueueKind, SaslMechanism, Secret};

use zkq_testkit::*;

/// A private PKI in a temporary directory: a CA, a server certificate for 127.0.0.1 and
/// localhost, a client certificate, and a second CA that signed none of them.
pub(crate) struct Pki {
    dir: tempfile::TempDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    let output =
        Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs (apt-get install openssl)");
    assert!(output.status.success(), "openssl {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
}

impl Pki {
    /// One PKI for the whole test process.
    pub(crate) fn shared() -> &'static Pki {
        static PKI: OnceLock<Pki> = OnceLock::new();
        PKI.get_or_init(Pki::generate)
    }

    fn generate() -> Pki {
        let dir = tempfile::Builder::new().prefix("zkq-pki-").tempdir().expect("temp dir");
        let d = dir.path();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
        for ca in ["ca", "other-ca"] {
            let (key, crt, subject) = (format!("{ca}.key"), format!("{ca}.crt"), format!("/CN=zkq test {ca}"));
            let mut args = vec!["req", "-x509"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &crt, "-days", "2", "-subj", &subject]);
            args.extend([
                "-addext",
                "basicConstraints=critical,CA:true",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]);
            openssl(d, &args);
        }
        let leaves = [
            ("server", "ca", "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"),
            ("misnamed", "ca", "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:zookeeper.example\n"),
            ("client", "ca", "extendedKeyUsage=clientAuth\n"),
            ("stranger", "other-ca", "extendedKeyUsage=clientAuth\n"),
        ];
        for (name, ca, extensions) in leaves {
            let (key, csr, crt, ext) =
                (format!("{name}.key"), format!("{name}.csr"), format!("{name}.crt"), format!("{name}.ext"));
            let subject = format!("/CN={name}");
            let mut args = vec!["req"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &csr, "-subj", &subject]);
            openssl(d, &args);
            std::fs::write(
                d.join(&ext),
                format!("basicConstraints=CA:false\nkeyUsage=critical,digitalSignature\n{extensions}"),
            )
            .expect("ext file");
            let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
            openssl(
                d,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    &ca_crt,
                    "-CAkey",
                    &ca_key,
                    "-CAcreateserial",
                    "-out",
                    &crt,
                    "-days",
                    "2",
                    "-extfile",
                    &ext,
                ],
            );
            // Java's PEM key store: the PKCS#8 key and the certificate in one file.
            let pem = [
                std::fs::read_to_string(d.join(&key)).expect("key"),
                std::fs::read_to_string(d.join(&crt)).expect("crt"),
            ];
            std::fs::write(d.join(format!("{name}.pem")), pem.concat()).expect("pem");
        }
        Pki { dir }
    }

    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// A server with TLS on a secure client port (Netty) besides its plain port, presenting
/// `server.pem`; returns the server and the secure connect string.
fn tls_server(pki: &Pki, client_auth: &str, extra: ServerOptions) -> (ZkServer, String) {
    tls_server_with_cert(pki, "server.pem", client_auth, extra)
}

fn tls_server_with_cert(pki: &Pki, cert: &str, client_auth: &str, extra: ServerOptions) -> (ZkServer, String) {
    let secure = stable_port();
    let mut options = extra;
    options.config.extend([
        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory".to_owned(),
        format!("secureClientPort={secure}"),
        "secureClientPortAddress=127.0.0.1".to_owned(),
        format!("ssl.keyStore.location={}", pki.file(cert).display()),
        "ssl.keyStore.type=PEM".to_owned(),
        format!("ssl.trustStore.location={}", pki.file("ca.crt").display()),
        "ssl.trustStore.type=PEM".to_owned(),
        format!("ssl.clientAuth={client_auth}"),
    ]);
    let server = ZkServer::start_with(options);
    (server, format!("127.0.0.1:{secure}"))
}

/// zkq over TLS trusting `ca`, with the client certificate when `mutual`.
fn tls_config(connect: &str, root: &str, pki: &Pki, ca: &str, mutual: bool) -> Config {
    let mut config = test_config(connect, root);
    config.zookeeper.tls.enabled = true;
    config.zookeeper.tls.ca_file = Some(pki.file(ca));
    if mutual {
        config.zookeeper.tls.cert_file = Some(pki.file("client.crt"));
        config.zookeeper.tls.key_file = Some(pki.file("client.key"));
    }
    config
}

/// What Curator (ZooKeeper's Java client) needs for the secure port, with the client certificate.
fn curator_over_tls(connect: &str, pki: &Pki) -> JavaTarget {
    JavaTarget {
        connect: connect.to_owned(),
        java_options: vec![
            "-Dzookeeper.client.secure=true".to_owned(),
            "-Dzookeeper.clientCnxnSocket=org.apache.zookeeper.ClientCnxnSocketNetty".to_owned(),
            format!("-Dzookeeper.ssl.trustStore.location={}", pki.file("ca.crt").display()),
            "-Dzookeeper.ssl.trustStore.type=PEM".to_owned(),
            format!("-Dzookeeper.ssl.keyStore.location={}", pki.file("client.pem").display()),
            "-Dzookeeper.ssl.keyStore.type=PEM".to_owned(),
        ],
    }
}

/// Waits until `/readyz` says why zkq has no session, and returns that message.
async fn not_ready_reason(zkq: &TestZkq, containing: &str) -> String {
    let mut last = String::new();
    let found = tokio::time::timeout(Duration::from_secs(40), async {
        loop {
            let (status, body) = zkq.readyz().await;
            assert_ne!(status, 200, "zkq must not become ready: {body}");
            last = body["message"].as_str().unwrap_or("").to_owned();
            if last.contains(containing) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(found.is_ok(), "readyz never said {containing:?}; last message: {last}");
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zkq_serves_queues_over_tls_to_the_secure_port() {
    let pki = Pki::shared();
    let (_zk, secure) = tls_server(pki, "none", ServerOptions::default());
    // The secure port speaks nothing but TLS: a session there is a TLS session.
    let zkq = TestZkq::start_ready(tls_config(&secure, &unique_root("tls"), pki, "ca.crt", false)).await;
    zkq.put_ok("q", b"over tls").await;
    assert_eq!(zkq.take_body("q", "2s").await.as_deref(), Some(b"over tls".as_slice()));

    // Without TLS the same port gives no session.
    let plain = TestZkq::start(test_config(&secure, &unique_root("tls-plain"))).await;
    not_ready_reason(&plain, "no session").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_another_ca_is_refused_with_a_clear_reason() {
    let pki = Pki::shared();
    let (_zk, secure) = tls_server(pki, "none", ServerOptions::default());
    let zkq = TestZkq::start(tls_config(&secure, &unique_root("tls-wrong-ca"), pki, "other-ca.crt", false)).await;
    let reason = not_ready_reason(&zkq, "TLS handshake").await;
    assert!(reason.contains(&secure), "{reason}");
    assert!(reason.contains("UnknownIssuer") && reason.contains("zookeeper.tls.ca_file"), "{reason}");
    let response = zkq.put("q", b"x").await;
    assert_eq!(response.status(), 503, "no session, no put");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    let pki = Pki::shared();
    let (_zk, secure) = tls_server(pki, "need", ServerOptions::default());

    let without = TestZkq::start(tls_config(&secure, &unique_root("mtls-none"), pki, "ca.crt", false)).await;
    let reason = not_ready_reason(&without, "TLS handshake").await;
    assert!(reason.contains("cert_file"), "the reason names the client certificate settings: {reason}");
    without.stop().await;

    let mut stranger = tls_config(&secure, &unique_root("mtls-stranger"), pki, "ca.crt", false);
    stranger.zookeeper.tls.cert_file = Some(pki.file("stranger.crt"));
    stranger.zookeeper.tls.key_file = Some(pki.file("stranger.key"));
    let stranger = TestZkq::start(stranger).await;
    not_ready_reason(&stranger, "TLS handshake").await;
    stranger.stop().await;

    let zkq = TestZkq::start_ready(tls_config(&secure, &unique_root("mtls"), pki, "ca.crt", true)).await;
    zkq.put_ok("q", b"mutual").await;
    assert_eq!(zkq.take_body("q", "2s").await.as_deref(), Some(b"mutual".as_slice()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostname_verification_is_on_by_default_and_can_be_turned_off() {
    let pki = Pki::shared();
    // A certificate from the trusted CA, but for zookeeper.example, not 127.0.0.1.
    let (_zk, secure) = tls_server_with_cert(pki, "misnamed.pem", "none", ServerOptions::default());
    let zkq = TestZkq::start(tls_config(&secure, &unique_root("tls-name"), pki, "ca.crt", false)).await;
    let reason = not_ready_reason(&zkq, "TLS handshake").await;
    assert!(reason.contains("verify_hostname"), "{reason}");
    zkq.stop().await;

    let mut config = tls_config(&secure, &unique_root("tls-no-name"), pki, "ca.crt", false);
    config.zookeeper.tls.verify_hostname = false;
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("q", b"x").await;
    // A certificate from another CA is still refused without the name check.
    let mut config = tls_config(&secure, &unique_root("tls-no-name-other"), pki, "other-ca.crt", false);
    config.zookeeper.tls.verify_hostname = false;
    let zkq = TestZkq::start(config).await;
    not_ready_reason(&zkq, "UnknownIssuer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_over_tls_shares_a_queue_with_zkq() {
    let pki = Pki::shared();
    let (_zk, secure) = tls_server(pki, "need", ServerOptions::default());
    let root = unique_root("tls-curator");
    let (path, lock) = (format!("{root}/jobs"), format!("{root}/locks"));
    let mut config = tls_config(&secure, &root, pki, "ca.crt", true);
    declare(&mut config, "jobs", QueueKind::Fifo, Some(&path), Some(&lock));
    let zkq = TestZkq::start_ready(config).await;
    let curator = curator_over_tls(&secure, pki);

    Curator::run(&curator, &["put", "fifo", &path, "66726f6d2d63757261746f72"]).await;
    assert_eq!(zkq.take_body("jobs", "5s").await.as_deref(), Some(b"from-curator".as_slice()));
    zkq.put_ok("jobs", b"from-zkq").await;
    let consumed = Curator::run(&curator, &["consume", "fifo", &path, "1", "15000", "--lock", &lock]).await;
    assert_eq!(consumed, [hex(b"from-zkq"), "DONE 1".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_are_read_again_when_the_files_change() {
    let pki = Pki::shared();
    let (_zk, secure) = tls_server(pki, "none", ServerOptions::default());
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = dir.path().join("ca.crt");
    std::fs::copy(pki.file("other-ca.crt"), &ca).expect("copy");
    let mut config = tls_config(&secure, &unique_root("tls-reload"), pki, "ca.crt", false);
    config.zookeeper.tls.ca_file = Some(ca.clone());
    config.zookeeper.tls.reload_interval = Duration::from_secs(1);
    let zkq = TestZkq::start(config).await;
    not_ready_reason(&zkq, "UnknownIssuer").await;
    // As a Kubernetes Secret update does: the file is replaced by one with the right CA.
    std::fs::write(dir.path().join("ca.crt.new"), std::fs::read(pki.file("ca.crt")).expect("ca")).expect("write");
    std::fs::rename(dir.path().join("ca.crt.new"), &ca).expect("rename");
    zkq.wait_ready().await;
    zkq.put_ok("q", b"after reload").await;
}

/// Runs the zkq binary with `env` until it exits; returns its status code and stderr.
async fn run_binary(args: &[&str], env: &[(&str, String)]) -> (Option<i32>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_zkq"));
    command.args(args).env_remove("ZKQ__ZOOKEEPER__CONNECT");
    let [api, admin] = free_addrs();
    command.args(["--api-listen", &api, "--admin-listen", &admin]);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || command.output().expect("zkq runs")),
    )
    .await
    .expect("zkq exits by itself")
    .expect("join");
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_tls_files_stop_zkq_at_start_with_status_64() {
    let pki = Pki::shared();
    let dir = tempfile::tempdir().expect("temp dir");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "this is not a certificate\n").expect("write");
    let path = |p: &Path| p.display().to_string();
    let tls = |ca: String, cert: Option<String>, key: Option<String>| {
        let mut env = vec![("ZKQ__ZOOKEEPER__TLS__ENABLED", "true".to_owned()), ("ZKQ__ZOOKEEPER__TLS__CA_FILE", ca)];
        env.extend(cert.map(|c| ("ZKQ__ZOOKEEPER__TLS__CERT_FILE", c)));
        env.extend(key.map(|k| ("ZKQ__ZOOKEEPER__TLS__KEY_FILE", k)));
        env
    };
    let cases = [
        (
            "a CA file that does not exist",
            tls("/nonexistent/ca.crt".to_owned(), None, None),
            "zookeeper.tls.ca_file",
            "cannot read",
        ),
        (
            "a CA file that holds no certificate",
            tls(path(&garbage), None, None),
            "zookeeper.tls.ca_file",
            "no certificate",
        ),
        (
            "a key file that holds no key",
            tls(path(&pki.file("ca.crt")), Some(path(&pki.file("client.crt"))), Some(path(&pki.file("client.crt")))),
            "zookeeper.tls.key_file",
            "no private key",
        ),
        (
            "a key that belongs to another certificate",
            tls(path(&pki.file("ca.crt")), Some(path(&pki.file("client.crt"))), Some(path(&pki.file("stranger.key")))),
            "zookeeper.tls.key_file",
            "cert_file",
        ),
        (
            "a certificate without its key",
            tls(path(&pki.file("ca.crt")), Some(path(&pki.file("client.crt"))), None),
            "zookeeper.tls.key_file",
            "both",
        ),
    ];
    for (what, env, key, words) in cases {
        for args in [&["run", "--zk-connect", "127.0.0.1:1"][..], &["check-config"][..]] {
            let (code, stderr) = run_binary(args, &env).await;
            assert_eq!(code, Some(64), "{what} ({}): {stderr}", args[0]);
            assert!(stderr.contains(key) && stderr.contains(words), "{what} ({}): {stderr}", args[0]);
            assert!(!stderr.contains("PRIVATE KEY-----\n"), "key material printed: {stderr}");
        }
    }
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").expect("write");
    let spaced = dir.path().join("spaced");
    std::fs::write(&spaced, "two words\n").expect("write");
    let sasl = |file: String| {
        vec![
            ("ZKQ__ZOOKEEPER__SASL__MECHANISM", "DIGEST-MD5".to_owned()),
            ("ZKQ__ZOOKEEPER__SASL__USERNAME", "app".to_owned()),
            ("ZKQ__ZOOKEEPER__SASL__PASSWORD_FILE", file),
        ]
    };
    let others = [
        (
            "a missing password file",
            sasl("/nonexistent/password".to_owned()),
            "zookeeper.sasl.password_file",
            "cannot read",
        ),
        ("an empty password file", sasl(path(&empty)), "zookeeper.sasl.password_file", "empty"),
        ("an empty token file", vec![("ZKQ__API__TOKEN_FILE", path(&empty))], "api.token_file", "empty"),
        ("a token with a space", vec![("ZKQ__API__TOKEN_FILE", path(&spaced))], "api.token_file", "printable"),
    ];
    for (what, env, key, words) in others {
        let (code, stderr) = run_binary(&["run", "--zk-connect", "127.0.0.1:1"], &env).await;
        assert_eq!(code, Some(64), "{what}: {stderr}");
        assert!(stderr.contains(key) && stderr.contains(words), "{what}: {stderr}");
    }
    // check-config --no-files checks the configuration alone.
    let (code, stderr) =
        run_binary(&["check-config", "--no-files"], &tls("/nonexistent/ca.crt".to_owned(), None, None)).await;
    assert_eq!(code, Some(0), "{stderr}");
}

/// A JAAS file with a `Server` section (users and passwords) and a `Client` section for Java clients.
fn jaas(dir: &Path, client: Option<(&str, &str)>) -> PathBuf {
    let mut text = "Server {\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n  user_app=\"app-secret\"\n  user_other=\"other-secret\";\n};\n".to_owned();
    if let Some((user, password)) = client {
        text.push_str(&format!(
            "Client {{\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n  username=\"{user}\"\n  password=\"{password}\";\n}};\n"
        ));
    }
    let path = dir.join(if client.is_some() { "client-jaas.conf" } else { "server-jaas.conf" });
    std::fs::write(&path, text).expect("jaas");
    path
}

/// A server that refuses every session without SASL authentication.
fn sasl_server(dir: &Path) -> ZkServer {
    ZkServer::start_with(ServerOptions {
        config: vec!["authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider".to_owned()],
        jvm_args: vec![
            format!("-Djava.security.auth.login.config={}", jaas(dir, None).display()),
            "-Dzookeeper.sessionRequireClientSASLAuth=true".to_owned(),
        ],
    })
}

fn sasl_config(zk: &ZkServer, root: &str, user: &str, password: &str) -> Config {
    let mut config = test_config(zk, root);
    config.zookeeper.sasl.mechanism = Some(SaslMechanism::DigestMd5);
    config.zookeeper.sasl.username = Some(user.to_owned());
    config.zookeeper.sasl.password = Some(Secret::new(password));
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_digest_md5_against_a_server_that_requires_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let zk = sasl_server(dir.path());
    let root = unique_root("sasl");

    let anonymous = TestZkq::start(test_config(&zk, &unique_root("sasl-none"))).await;
    let reason = not_ready_reason(&anonymous, "authentication").await;
    assert!(reason.contains("sessionRequireClientSASLAuth"), "{reason}");
    anonymous.stop().await;

    let wrong = TestZkq::start(sasl_config(&zk, &unique_root("sasl-wrong"), "app", "not-the-password")).await;
    let reason = not_ready_reason(&wrong, "authentication").await;
    assert!(reason.contains("`app`") && !reason.contains("not-the-password"), "{reason}");
    wrong.stop().await;

    // The password from a file, as a mounted Secret gives it (with its trailing newline).
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, "app-secret\n").expect("write");
    let mut config = sasl_config(&zk, &root, "app", "unused");
    config.zookeeper.sasl.password = None;
    config.zookeeper.sasl.password_file = Some(password_file);
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("q", b"authenticated").await;
    assert_eq!(zkq.take_body("q", "2s").await.as_deref(), Some(b"authenticated".as_slice()));

    // With SASL credentials, what zkq creates belongs to sasl:app alone.
    let message = zkq.put_ok("q", b"mine").await;
    let direct = sasl_client(&zk, "app", "app-secret").await;
    let (acl, _) = direct.get_acl(&format!("{root}/queues/q/{message}")).await.expect("acl");
    assert_eq!(format!("{acl:?}").matches("sasl").count(), 1, "{acl:?}");
    assert!(format!("{acl:?}").contains("\"app\""), "{acl:?}");
    let other = sasl_client(&zk, "other", "other-secret").await;
    let err = other.get_data(&format!("{root}/queues/q/{message}")).await.expect_err("another SASL user");
    assert_eq!(err, zookeeper_client::Error::NoAuth);
}

async fn sasl_client(zk: &ZkServer, user: &'static str, password: &'static str) -> zookeeper_client::Client {
    zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .with_sasl(zookeeper_client::SaslOptions::digest_md5(user, password))
        .connect(&zk.connect_string())
        .await
        .expect("SASL client connects")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_sasl_and_acl_together_and_curator_with_the_same_credentials() {
    let pki = Pki::shared();
    let dir = tempfile::tempdir().expect("temp dir");
    let options = ServerOptions {
        config: vec!["authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider".to_owned()],
        jvm_args: vec![
            format!("-Djava.security.auth.login.config={}", jaas(dir.path(), None).display()),
            "-Dzookeeper.sessionRequireClientSASLAuth=true".to_owned(),
        ],
    };
    let (_zk, secure) = tls_server(pki, "need", options);
    let root = unique_root("secure-all");
    let (path, lock) = (format!("{root}/jobs"), format!("{root}/locks"));
    let mut config = tls_config(&secure, &root, pki, "ca.crt", true);
    config.zookeeper.sasl.mechanism = Some(SaslMechanism::DigestMd5);
    config.zookeeper.sasl.username = Some("app".to_owned());
    config.zookeeper.sasl.password = Some(Secret::new("app-secret"));
    config.zookeeper.acl = Some(vec![AclEntry::parse("sasl:app:cdrwa").expect("an ACL entry")]);
    declare(&mut config, "jobs", QueueKind::Fifo, Some(&path), Some(&lock));
    let zkq = TestZkq::start_ready(config).await;

    let mut curator = curator_over_tls(&secure, pki);
    let client_jaas = jaas(dir.path(), Some(("app", "app-secret")));
    curator.java_options.push(format!("-Djava.security.auth.login.config={}", client_jaas.display()));
    curator.java_options.push("-Dzkq.test.acl=creator".to_owned());
    zkq.put_ok("jobs", b"for curator").await;
    let consumed = Curator::run(&curator, &["consume", "fifo", &path, "1", "15000", "--lock", &lock]).await;
    assert_eq!(consumed, [hex(b"for curator"), "DONE 1".to_owned()]);
    Curator::run(&curator, &["put", "fifo", &path, &hex(b"for zkq")]).await;
    assert_eq!(zkq.take_body("jobs", "5s").await.as_deref(), Some(b"for zkq".as_slice()));
}

/// `user:base64(sha1("user:password"))`, the id of ZooKeeper's digest scheme.
fn digest_id(user: &str, password: &str) -> String {
    let output = Command::new("sh")
        .args(["-c", "printf '%s' \"$1\" | openssl dgst -binary -sha1 | base64", "sh", &format!("{user}:{password}")])
        .output()
        .expect("openssl runs");
    format!("{user}:{}", String::from_utf8_lossy(&output.stdout).trim())
}

async fn digest_client(zk: &ZkServer, credentials: Option<&str>) -> zookeeper_client::Client {
    let mut connector = zookeeper_client::Client::connector().with_session_timeout(Duration::from_secs(10));
    if let Some(credentials) = credentials {
        connector = connector.with_auth("digest", credentials.as_bytes());
    }
    connector.connect(&zk.connect_string()).await.expect("direct client connects")
}

/// zkq with digest credentials `app:app-secret`: a message put, one leased (its lock and delivery
/// count exist), a counter set. Returns zkq and the paths of those nodes.
async fn zkq_with_nodes(zk: &ZkServer, root: &str, acl: Option<Vec<String>>) -> (TestZkq, Vec<String>) {
    let mut config = test_config(zk, root);
    config.zookeeper.auth_digest = Some(Secret::new("app:app-secret"));
    config.zookeeper.acl =
        acl.map(|entries| entries.iter().map(|e| AclEntry::parse(e).expect("an ACL entry")).collect());
    let zkq = TestZkq::start_ready(config).await;
    let kept = zkq.put_ok("q", b"kept").await;
    let leased = zkq.put_ok("q", b"leased").await;
    let response = zkq.http.post(zkq.url("/v1/queues/q/leases?wait=2s")).send().await.expect("lease");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["zkq-message-id"], kept.as_str());
    let response = zkq.http.put(zkq.url("/v1/counters/hits")).json(&serde_json::json!({"value": 7})).send().await;
    assert_eq!(response.expect("set").status(), 200);
    let paths = vec![
        format!("{root}/queues/q"),
        format!("{root}/queues/q/{kept}"),
        format!("{root}/queues/q/{leased}"),
        format!("{root}/locks/q/{kept}"),
        format!("{root}/deliveries/q/{kept}"),
        format!("{root}/counters/hits"),
    ];
    (zkq, paths)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_credentials_zkq_nodes_are_closed_to_sessions_without_them() {
    let zk = ZkServer::shared();
    let root = unique_root("acl-creator");
    let (_zkq, paths) = zkq_with_nodes(zk, &root, None).await;
    let owner = digest_client(zk, Some("app:app-secret")).await;
    let anonymous = digest_client(zk, None).await;
    let stranger = digest_client(zk, Some("other:other-secret")).await;
    use zookeeper_client::Error::NoAuth;
    for path in &paths {
        // The owner reads everything; the ACL is the owner's digest id with every permission.
        owner.get_data(path).await.unwrap_or_else(|e| panic!("owner reads {path}: {e}"));
        let (acl, _) = owner.get_acl(path).await.expect("acl");
        let expected = digest_id("app", "app-secret");
        assert!(acl.len() == 1 && acl[0].scheme() == "digest" && acl[0].id() == expected, "{path}: {acl:?}");
        for client in [&anonymous, &stranger] {
            assert_eq!(client.get_data(path).await.map(|_| ()), Err(NoAuth), "read {path}");
            assert_eq!(client.set_data(path, b"forged", None).await.map(|_| ()), Err(NoAuth), "write {path}");
        }
    }
    let queue = &paths[0];
    for client in [&anonymous, &stranger] {
        assert_eq!(client.list_children(queue).await.map(|_| ()), Err(NoAuth), "list the queue");
        for message in &paths[1..3] {
            assert_eq!(client.delete(message, None).await, Err(NoAuth), "delete {message}");
        }
        let forged = client
            .create(
                &format!("{queue}/queue-"),
                b"forged",
                &zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all()),
            )
            .await;
        assert_eq!(forged.map(|_| ()), Err(NoAuth), "forge a message");
        assert_eq!(client.delete(&paths[3], None).await, Err(NoAuth), "delete the lock");
        assert_eq!(client.delete(&paths[5], None).await, Err(NoAuth), "delete the counter");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_acl_list_is_given_to_every_node() {
    let zk = ZkServer::shared();
    let root = unique_root("acl-list");
    let acl = vec![format!("digest:{}:cdrwa", digest_id("app", "app-secret")), "world:anyone:r".to_owned()];
    let (_zkq, paths) = zkq_with_nodes(zk, &root, Some(acl)).await;
    let anonymous = digest_client(zk, None).await;
    for path in &paths {
        let (acl, _) = anonymous.get_acl(path).await.expect("acl");
        let schemes: Vec<&str> = acl.iter().map(|a| a.scheme()).collect();
        assert_eq!(schemes, ["digest", "world"], "{path}: {acl:?}");
        anonymous.get_data(path).await.unwrap_or_else(|e| panic!("world may read {path}: {e}"));
        let written = anonymous.set_data(path, b"forged", None).await.map(|_| ());
        assert_eq!(written, Err(zookeeper_client::Error::NoAuth), "write {path}");
    }
    assert_eq!(anonymous.delete(&paths[2], None).await, Err(zookeeper_client::Error::NoAuth));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_with_the_same_digest_credentials_shares_the_queue() {
    let zk = ZkServer::shared();
    let root = unique_root("acl-curator");
    let (path, lock) = (format!("{root}/jobs"), format!("{root}/locks"));
    let mut config = test_config(zk, &root);
    config.zookeeper.auth_digest = Some(Secret::new("app:app-secret"));
    declare(&mut config, "jobs", QueueKind::Fifo, Some(&path), Some(&lock));
    let zkq = TestZkq::start_ready(config).await;
    let curator = JavaTarget {
        connect: zk.connect_string(),
        java_options: vec!["-Dzkq.test.auth=digest:app:app-secret".to_owned(), "-Dzkq.test.acl=creator".to_owned()],
    };
    zkq.put_ok("jobs", b"for curator").await;
    let consumed = Curator::run(&curator, &["consume", "fifo", &path, "1", "15000", "--lock", &lock]).await;
    assert_eq!(consumed, [hex(b"for curator"), "DONE 1".to_owned()]);
    Curator::run(&curator, &["put", "fifo", &path, &hex(b"for zkq")]).await;
    assert_eq!(zkq.take_body("jobs", "5s").await.as_deref(), Some(b"for zkq".as_slice()));
    // What Curator created is closed to others too.
    zkq.put_ok("jobs", b"again").await;
    let anonymous = digest_client(zk, None).await;
    assert_eq!(anonymous.list_children(&path).await.map(|_| ()), Err(zookeeper_client::Error::NoAuth));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_of_another_identity_answer_zookeeper_refused() {
    let zk = ZkServer::shared();
    let root = unique_root("acl-foreign");
    let (path, lock, counter) =
        (format!("{root}/theirs"), format!("{root}/their-locks"), format!("{root}/their-count"));
    // Another application (digest other:other-secret) owns a queue with a message, and a counter.
    let other = JavaTarget {
        connect: zk.connect_string(),
        java_options: vec!["-Dzkq.test.auth=digest:other:other-secret".to_owned(), "-Dzkq.test.acl=creator".to_owned()],
    };
    Curator::run(&other, &["put", "fifo", &path, &hex(b"not yours")]).await;
    Curator::run(&other, &["count", "set", &counter, "5"]).await;

    let mut config = test_config(zk, &root);
    config.zookeeper.auth_digest = Some(Secret::new("app:app-secret"));
    declare(&mut config, "theirs", QueueKind::Fifo, Some(&path), Some(&lock));
    config.counters.insert(
        "theirs".parse().expect("a valid name"),
        zkq::config::CounterConfig { path: Some(counter.clone()), seed: 0 },
    );
    let zkq = TestZkq::start_ready(config).await;
    let refused = |what: &'static str| {
        move |response: reqwest::Response| async move {
            let status = response.status();
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            assert_eq!((status.as_u16(), body["code"].as_str()), (502, Some("zookeeper_refused")), "{what}: {body}");
        }
    };
    refused("put")(zkq.put("theirs", b"x").await).await;
    refused("take")(zkq.take("theirs", "1s").await).await;
    let lease = zkq.http.post(zkq.url("/v1/queues/theirs/leases?wait=1s")).send().await.expect("lease");
    refused("lease")(lease).await;
    let peek = zkq.http.get(zkq.url("/v1/queues/theirs/messages?limit=5")).send().await.expect("peek");
    refused("peek")(peek).await;
    // Depth needs no permission in ZooKeeper (exists): info answers, without the head's age.
    let info = zkq.http.get(zkq.url("/v1/queues/theirs")).send().await.expect("info");
    assert_eq!(info.status(), 200);
    let info: serde_json::Value = info.json().await.expect("json");
    assert_eq!(info["depth"].as_i64(), Some(1), "{info}");
    assert!(info["oldest_message_age_ms"].is_null(), "{info}");
    assert_eq!(info["oldest_message_age_known"], false, "a null age here is not \"no message waiting\": {info}");
    let get = zkq.http.get(zkq.url("/v1/counters/theirs")).send().await.expect("counter");
    refused("counter read")(get).await;
    let set = zkq.http.put(zkq.url("/v1/counters/theirs")).json(&serde_json::json!({"value": 1})).send().await;
    refused("counter write")(set.expect("set")).await;
    // Nothing changed: the other application still has its message and its value.
    let theirs = digest_client(zk, Some("other:other-secret")).await;
    assert_eq!(theirs.list_children(&path).await.expect("their queue").len(), 1);
    assert_eq!(theirs.get_data(&counter).await.expect("their counter").0, 5i32.to_be_bytes());
}

/// Sends `method path` to `base` with exactly these headers (`Host` included); returns the status
/// and the JSON body.
async fn request_with_headers(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut request = format!("{method} {path} HTTP/1.1\r\nContent-Length: 1\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\nx");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("read");
    let text = String::from_utf8_lossy(&response);
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(serde_json::Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_api_token_every_api_request_needs_it_and_health_stays_open() {
    let dir = tempfile::tempdir().expect("temp dir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cr3t-t0ken-0123456789\n").expect("write");
    let mut config = test_config(ZkServer::shared(), &unique_root("token"));
    config.api.token_file = Some(token_file);
    let zkq = TestZkq::start_ready(config).await;
    let url = zkq.url("/v1/queues/q/messages");

    for (what, token) in
        [("no token", None), ("a wrong token", Some("s3cr3t-t0ken-0123456788")), ("a prefix", Some("s3cr3t"))]
    {
        let mut request = zkq.http.post(&url).body("x");
        if let Some(token) = token {
            request = request.header("zkq-api-token", token);
        }
        let response = request.send().await.expect("put");
        assert_eq!(response.status(), 401, "{what}");
        let body: serde_json::Value = response.json().await.expect("json");
        assert_eq!(body["code"], "unauthorized", "{what}: {body}");
    }
    // Unknown paths too: without the token nothing is disclosed, not even which routes exist.
    let response = zkq.http.get(zkq.url("/v1/nothing-here")).send().await.expect("get");
    assert_eq!(response.status(), 401);
    let response = zkq.http.post(&url).header("zkq-api-token", "s3cr3t-t0ken-0123456789").body("x").send().await;
    assert_eq!(response.expect("put").status(), 201, "the token from the file, without its newline");
    let taken = zkq.http.post(zkq.url("/v1/queues/q/take?wait=1s")).header("zkq-api-token", "s3cr3t-t0ken-0123456789");
    assert_eq!(taken.send().await.expect("take").status(), 200);

    // The document and the probes need no token.
    assert_eq!(zkq.http.get(zkq.url("/openapi.json")).send().await.expect("spec").status(), 200);
    for path in ["/livez", "/readyz", "/metrics"] {
        let response = zkq.http.get(format!("{}{path}", zkq.admin)).send().await.expect("admin");
        assert_eq!(response.status(), 200, "{path}");
    }
    let metrics = zkq.metrics().await;
    assert!(metrics.contains("status=\"401\""), "refused requests are counted: {metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_requests_for_other_origins_are_refused() {
    let zk = ZkServer::shared();
    let zkq = TestZkq::start_ready(test_config(zk, &unique_root("origin"))).await;
    let host = zkq.api.trim_start_matches("http://").to_owned();
    let port = host.rsplit_once(':').map(|(_, p)| p.to_owned()).expect("port");
    let put = "/v1/queues/q/messages";
    let refused: [(&str, Vec<(&str, String)>); 5] = [
        ("a page of another site", vec![("Host", host.clone()), ("Origin", "https://evil.example".to_owned())]),
        ("another port of loopback", vec![("Host", host.clone()), ("Origin", "http://127.0.0.1:3000".to_owned())]),
        ("an opaque origin", vec![("Host", host.clone()), ("Origin", "null".to_owned())]),
        (
            "a cross-site request without Origin",
            vec![("Host", host.clone()), ("Sec-Fetch-Site", "cross-site".to_owned())],
        ),
        (
            "DNS rebinding: a page whose name resolves to 127.0.0.1",
            vec![
                ("Host", format!("rebind.example:{port}")),
                ("Origin", format!("http://rebind.example:{port}")),
                ("Sec-Fetch-Site", "same-origin".to_owned()),
            ],
        ),
    ];
    for (what, headers) in &refused {
        let (status, body) = request_with_headers(&zkq.api, "POST", put, headers).await;
        assert_eq!((status, body["code"].as_str()), (403, Some("cross_origin_refused")), "{what}: {body}");
    }
    let info: serde_json::Value =
        zkq.http.get(zkq.url("/v1/queues/q")).send().await.expect("info").json().await.expect("json");
    assert_ne!(info["depth"], 1, "no refused put was stored: {info}");

    let allowed: [(&str, Vec<(&str, String)>); 3] = [
        ("an HTTP client (no browser headers)", vec![("Host", host.clone())]),
        (
            "zkq's own /docs page",
            vec![
                ("Host", host.clone()),
                ("Origin", format!("http://{host}")),
                ("Sec-Fetch-Site", "same-origin".to_owned()),
            ],
        ),
        (
            "a URL typed into the browser",
            vec![("Host", format!("localhost:{port}")), ("Sec-Fetch-Site", "none".to_owned())],
        ),
    ];
    for (what, headers) in &allowed {
        let (status, body) = request_with_headers(&zkq.api, "POST", put, headers).await;
        assert_eq!(status, 201, "{what}: {body}");
    }

    // The switch: with api.refuse_cross_origin = false, browsers are served like any client.
    let mut config = test_config(zk, &unique_root("origin-allowed"));
    config.api.refuse_cross_origin = false;
    let open = TestZkq::start_ready(config).await;
    let host = open.api.trim_start_matches("http://").to_owned();
    let (status, _) = request_with_headers(
        &open.api,
        "POST",
        put,
        &refused[0]
            .1
            .iter()
            .map(|(n, v)| (*n, if *n == "Host" { host.clone() } else { v.clone() }))
            .collect::<Vec<_>>(),
    )
    .await;
    assert_eq!(status, 201);
}
