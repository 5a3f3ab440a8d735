//! Test harness: real ZooKeeper servers on free loopback ports, zkq in-process, Curator as a
//! child process, and helpers to await conditions instead of sleeping.

#![allow(unsafe_code)] // pre_exec(PR_SET_PDEATHSIG): no server outlives the test process.
#![allow(dead_code)] // not every test module uses every helper

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use zkq::config::{Config, QueueConfig, QueueKind};

/// Root of the repository (where Cargo.toml is).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free loopback port")
}

/// Spawns children from one thread that lives as long as the process: PR_SET_PDEATHSIG fires
/// when the *thread* that forked exits, so spawning from short-lived test threads would kill
/// servers early. With it, every server dies with the test process, even on a panic or abort.
pub fn spawn_supervised(mut command: Command) -> std::io::Result<Child> {
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("child-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
                    unsafe {
                        command.pre_exec(|| {
                            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                                return Err(std::io::Error::last_os_error());
                            }
                            Ok(())
                        });
                    }
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawner thread starts");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    command.stdin(Stdio::null());
    sender.lock().expect("spawner lock").send((command, reply_tx)).expect("spawner alive");
    reply_rx.recv().expect("spawner answers")
}

/// The JVM classpath of Debian 12's ZooKeeper 3.8 server (standalone servers).
pub fn zookeeper_classpath() -> String {
    let jars = [
        "zookeeper",
        "zookeeper-jute",
        "slf4j-api",
        "slf4j-simple",
        "netty-handler",
        "netty-common",
        "netty-buffer",
        "netty-transport",
        "netty-codec",
        "netty-resolver",
        "netty-transport-native-epoll",
        "netty-transport-native-unix-common",
    ];
    let mut parts: Vec<String> = jars.iter().map(|j| format!("/usr/share/java/{j}.jar")).collect();
    parts.push("/etc/zookeeper/conf".to_owned());
    parts.join(":")
}

/// The JVM classpath of the three-server ensemble: ZooKeeper 3.9 from Debian 13 (unpacked into
/// `target/zookeeper-3.9/` by `scripts/test.sh`) with Debian 12's other jars. Debian 12's 3.8.0
/// can lose committed transactions when its leader is killed (ZOOKEEPER-4712, fixed in 3.9.3),
/// and no client survives that: the fault tests would test ZooKeeper's bug, not zkq.
pub fn ensemble_classpath() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/zookeeper-3.9");
    assert!(
        dir.join("zookeeper.jar").exists(),
        "{} is missing: run scripts/test.sh once (it fetches ZooKeeper 3.9 for the ensemble tests)",
        dir.display()
    );
    // Jute first: the server jar's manifest names Debian 12's jute jar on its Class-Path, which
    // the JVM would otherwise search right after it.
    let own = ["zookeeper-jute", "zookeeper"].map(|j| dir.join(format!("{j}.jar")).display().to_string());
    let standalone = zookeeper_classpath();
    let shared =
        standalone.split(':').filter(|p| !p.ends_with("/zookeeper.jar") && !p.ends_with("/zookeeper-jute.jar"));
    own.into_iter().chain(shared.map(str::to_owned)).collect::<Vec<_>>().join(":")
}

/// Anything zkq, Curator or a direct client can connect to: a server, an ensemble, a proxy, or a
/// plain connect string.
pub trait ConnectTarget {
    fn connect_string(&self) -> String;

    /// JVM options a Java client (Curator) needs for this target: TLS settings, credentials.
    fn java_options(&self) -> Vec<String> {
        Vec::new()
    }
}

impl ConnectTarget for str {
    fn connect_string(&self) -> String {
        self.to_owned()
    }
}

impl ConnectTarget for String {
    fn connect_string(&self) -> String {
        self.clone()
    }
}

impl<T: ConnectTarget + ?Sized> ConnectTarget for &T {
    fn connect_string(&self) -> String {
        (**self).connect_string()
    }

    fn java_options(&self) -> Vec<String> {
        (**self).java_options()
    }
}

/// A connect string plus what a Java client needs to use it (a secured port, credentials).
#[derive(Debug, Clone)]
pub struct JavaTarget {
    pub connect: String,
    pub java_options: Vec<String>,
}

impl ConnectTarget for JavaTarget {
    fn connect_string(&self) -> String {
        self.connect.clone()
    }

    fn java_options(&self) -> Vec<String> {
        self.java_options.clone()
    }
}

impl ConnectTarget for ZkServer {
    fn connect_string(&self) -> String {
        ZkServer::connect_string(self)
    }
}

/// A private standalone ZooKeeper server (Debian's package) in a temporary directory.
pub struct ZkServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Mutex<Option<Child>>,
    jvm_args: Vec<String>,
}

/// What a server gets beyond the plain standalone configuration.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// Extra `zoo.cfg` lines (e.g. `secureClientPort=…`, `ssl.clientAuth=need`).
    pub config: Vec<String>,
    /// Extra JVM arguments (e.g. `-Djava.security.auth.login.config=…`).
    pub jvm_args: Vec<String>,
}

impl ZkServer {
    /// Starts a new server on a free loopback port and waits until it answers `ruok`.
    pub fn start() -> ZkServer {
        ZkServer::start_with(ServerOptions::default())
    }

    /// Starts a server with extra configuration; its plain client port still answers `ruok`.
    pub fn start_with(options: ServerOptions) -> ZkServer {
        let dir = tempfile::Builder::new().prefix("zkq-zk-").tempdir().expect("temp dir");
        let port = stable_port(); // restart() binds it again
        let mut config = format!(
            "tickTime=1000\ninitLimit=5\nsyncLimit=2\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
             admin.enableServer=false\n4lw.commands.whitelist=*\nminSessionTimeout=2000\nmaxSessionTimeout=60000\n\
             maxClientCnxns=0\n",
            dir.path().join("data").display()
        );
        for line in &options.config {
            config.push_str(line);
            config.push('\n');
        }
        std::fs::create_dir_all(dir.path().join("data")).expect("data dir");
        std::fs::write(dir.path().join("zoo.cfg"), config).expect("zoo.cfg");
        let server = ZkServer { port, dir, child: Mutex::new(None), jvm_args: options.jvm_args };
        server.launch();
        server
    }

    /// One server shared by every test of this process that needs no fault injection.
    /// Tests keep apart by using their own `zookeeper.root`.
    pub fn shared() -> &'static ZkServer {
        static SHARED: OnceLock<ZkServer> = OnceLock::new();
        SHARED.get_or_init(ZkServer::start)
    }

    fn launch(&self) {
        let log = std::fs::File::create(self.dir.path().join("server.log")).expect("log file");
        let mut command = Command::new("java");
        command
            .args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Dzookeeper.jmx.log4j.disable=true"])
            .args(&self.jvm_args)
            .arg("-cp")
            .arg(zookeeper_classpath())
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(self.dir.path().join("zoo.cfg"))
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log);
        let child = spawn_supervised(command).expect("java starts (is Debian's zookeeper package installed?)");
        *self.child.lock().expect("child lock") = Some(child);
        self.wait_until_serving();
    }

    fn wait_until_serving(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if four_letter(self.port, "ruok").as_deref() == Some("imok") {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        panic!("ZooKeeper on port {} did not start within 60s; log:\n{log}", self.port);
    }

    /// `127.0.0.1:PORT`.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A counter from the server's `mntr` answer (e.g. `zk_packets_received`); 0 if absent.
    pub fn mntr(&self, key: &str) -> f64 {
        four_letter(self.port, "mntr")
            .unwrap_or_default()
            .lines()
            .find_map(|line| line.strip_prefix(key).and_then(|rest| rest.trim().parse().ok()))
            .unwrap_or(0.0)
    }

    fn pid(&self) -> Option<u32> {
        self.child.lock().expect("child lock").as_ref().map(Child::id)
    }

    /// CPU time (user + system) the server's JVM has used so far.
    pub fn cpu_time(&self) -> Duration {
        self.pid().map_or(Duration::ZERO, process_cpu_time)
    }

    fn signal(&self, signal: &str) {
        if let Some(pid) = self.pid() {
            let status = Command::new("kill").args([signal, &pid.to_string()]).status().expect("kill runs");
            assert!(status.success(), "kill {signal} {pid} failed");
        }
    }

    /// Kills the server (its data stays, so `restart` brings the same tree back).
    pub fn stop(&self) {
        if let Some(mut child) = self.child.lock().expect("child lock").take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a stopped server again on the same port with the same data.
    pub fn restart(&self) {
        self.stop();
        self.launch();
    }

    /// Freezes the server (SIGSTOP): clients see silence, sessions time out server-side later.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        self.resume();
        self.stop();
    }
}

/// Sends a four-letter command and returns the answer.
pub fn four_letter(port: u16, command: &str) -> Option<String> {
    use std::io::{Read, Write};
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(command.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

/// A unique ZooKeeper root for one test.
pub fn unique_root(test: &str) -> String {
    format!("/it-{test}-{}", uuid::Uuid::new_v4().simple())
}

/// A configuration for a test zkq: ports 0, short timeouts, its own root.
pub fn test_config(zk: &(impl ConnectTarget + ?Sized), root: &str) -> Config {
    let mut config = Config::default();
    config.zookeeper.connect = zk.connect_string();
    config.zookeeper.root = root.to_owned();
    config.zookeeper.session_timeout = Duration::from_secs(4);
    config.zookeeper.request_timeout = Duration::from_secs(3);
    config.zookeeper.reconnect_backoff_max = Duration::from_millis(500);
    config.api.listen = "127.0.0.1:0".parse().expect("addr");
    config.admin.listen = "127.0.0.1:0".parse().expect("addr");
    config.shutdown.grace = Duration::from_secs(5);
    config
}

/// Declares a queue in a test configuration.
pub fn declare(config: &mut Config, name: &str, kind: QueueKind, path: Option<&str>, lock_path: Option<&str>) {
    config.queues.insert(
        name.to_owned(),
        QueueConfig {
            kind,
            path: path.map(str::to_owned),
            lock_path: lock_path.map(str::to_owned),
            max_items: None,
            max_deliveries: None,
            dead_letter: None,
            push: None,
            idempotency_window: None,
        },
    );
}

/// zkq running inside the test process.
pub struct TestZkq {
    pub api: String,
    pub admin: String,
    pub http: reqwest::Client,
    pub running: Option<zkq::app::Running>,
}

impl TestZkq {
    pub async fn start(config: Config) -> TestZkq {
        config.validate().expect("test config is valid");
        let running = zkq::app::start(config).await.expect("zkq starts");
        let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("http client");
        TestZkq {
            api: format!("http://{}", running.api_addr),
            admin: format!("http://{}", running.admin_addr),
            http,
            running: Some(running),
        }
    }

    /// Starts zkq and waits until `/readyz` answers 200.
    pub async fn start_ready(config: Config) -> TestZkq {
        let zkq = TestZkq::start(config).await;
        zkq.wait_ready().await;
        zkq
    }

    pub async fn readyz(&self) -> (u16, serde_json::Value) {
        match self.http.get(format!("{}/readyz", self.admin)).send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                (status, response.json().await.unwrap_or(serde_json::Value::Null))
            },
            Err(_) => (0, serde_json::Value::Null),
        }
    }

    pub async fn wait_ready(&self) {
        eventually(Duration::from_secs(30), "zkq ready", || async { self.readyz().await.0 == 200 }).await;
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.api)
    }

    pub async fn put(&self, queue: &str, body: &[u8]) -> reqwest::Response {
        self.http.post(self.url(&format!("/v1/queues/{queue}/messages"))).body(body.to_vec()).send().await.expect("put")
    }

    pub async fn put_ok(&self, queue: &str, body: &[u8]) -> String {
        let response = self.put(queue, body).await;
        assert_eq!(response.status(), 201, "put to {queue}");
        let json: serde_json::Value = response.json().await.expect("json");
        json["message_id"].as_str().expect("message_id").to_owned()
    }

    pub async fn take(&self, queue: &str, wait: &str) -> reqwest::Response {
        self.http.post(self.url(&format!("/v1/queues/{queue}/take?wait={wait}"))).send().await.expect("take")
    }

    /// Takes one message; `None` on 204.
    pub async fn take_body(&self, queue: &str, wait: &str) -> Option<Vec<u8>> {
        let response = self.take(queue, wait).await;
        match response.status().as_u16() {
            200 => Some(response.bytes().await.expect("body").to_vec()),
            204 => None,
            other => panic!("take from {queue}: {other} {}", response.text().await.unwrap_or_default()),
        }
    }

    pub async fn metrics(&self) -> String {
        self.http.get(format!("{}/metrics", self.admin)).send().await.expect("metrics").text().await.expect("text")
    }

    pub async fn stop(mut self) -> bool {
        match self.running.take() {
            Some(running) => running.stop().await,
            None => true,
        }
    }
}

impl Drop for TestZkq {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown.cancel();
        }
    }
}

/// Awaits `condition` until it holds, polling every 50 ms; panics with `what` after `timeout`.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A direct ZooKeeper client for checking what zkq wrote.
pub async fn zk_client(zk: &(impl ConnectTarget + ?Sized)) -> zookeeper_client::Client {
    zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&zk.connect_string())
        .await
        .expect("direct ZooKeeper client connects")
}

/// Children of `path`, sorted; empty if it does not exist.
pub async fn children(client: &zookeeper_client::Client, path: &str) -> Vec<String> {
    let mut names = client.list_children(path).await.unwrap_or_default();
    names.sort();
    names
}

/// The value of one exact series (`name{labels}`) in Prometheus text, if present.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.strip_prefix(series).is_some_and(|rest| rest.starts_with(' ')))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

pub fn hex(bytes: &[u8]) -> String {
    if bytes.is_empty() { "-".to_owned() } else { bytes.iter().map(|b| format!("{b:02x}")).collect() }
}

pub fn unhex(text: &str) -> Vec<u8> {
    if text == "-" {
        return Vec::new();
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex")).collect()
}

/// The real Curator 5.4.0, driven through `tests/java/CuratorTool.java`.
pub struct Curator;

impl Curator {
    fn classpath() -> &'static str {
        static CLASSPATH: OnceLock<String> = OnceLock::new();
        CLASSPATH.get_or_init(|| {
            let script = repo_root().join("tests/java/build.sh");
            let status = Command::new("bash").arg(&script).status().expect("build.sh runs");
            assert!(status.success(), "tests/java/build.sh failed (are the Curator jars installed?)");
            let path = repo_root().join("target/java-classes/classpath.txt");
            std::fs::read_to_string(&path).expect("classpath.txt").trim().to_owned()
        })
    }

    fn command(zk: &(impl ConnectTarget + ?Sized), args: &[&str]) -> Command {
        let mut command = Command::new("java");
        command
            .args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
            .args(zk.java_options())
            .args(["-cp", Self::classpath(), "CuratorTool"])
            .arg(zk.connect_string())
            .args(args);
        command
    }

    /// Runs a command to completion and returns its stdout lines (panics on failure).
    pub async fn run(zk: &(impl ConnectTarget + ?Sized), args: &[&str]) -> Vec<String> {
        let mut command = Self::command(zk, args);
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let what = args.join(" ");
        let output = tokio::task::spawn_blocking(move || {
            let child = spawn_supervised(command).expect("java starts");
            child.wait_with_output().expect("CuratorTool finishes")
        })
        .await
        .expect("join");
        assert!(
            output.status.success(),
            "CuratorTool {what} failed: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).lines().map(str::to_owned).collect()
    }

    /// Starts a long-running command (a consumer); read its lines with [`CuratorChild::lines`].
    pub fn spawn(zk: &(impl ConnectTarget + ?Sized), args: &[&str]) -> CuratorChild {
        let mut command = Self::command(zk, args);
        command.stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = spawn_supervised(command).expect("java starts");
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        CuratorChild { child, lines: rx }
    }
}

/// A running CuratorTool process.
pub struct CuratorChild {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl CuratorChild {
    /// Waits for the next stdout line.
    pub fn next_line(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// Waits for the process to end and returns the remaining lines.
    pub async fn finish(mut self) -> Vec<String> {
        tokio::task::spawn_blocking(move || {
            let _ = self.child.wait();
            self.lines.iter().collect::<Vec<_>>()
        })
        .await
        .expect("join")
    }
}

impl Drop for CuratorChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// Path of a file in the repository.
pub fn repo_file(relative: &str) -> PathBuf {
    repo_root().join(relative)
}

/// True if `path` exists.
pub fn exists(path: &Path) -> bool {
    path.exists()
}

/// Sends a request with a path exactly as written (no client-side `..`/`%2E` normalisation);
/// returns the status and the JSON body.
pub async fn raw_request(base: &str, method: &str, path: &str) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("read");
    let text = String::from_utf8_lossy(&response);
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(serde_json::Value::Null))
}

/// A free `127.0.0.1:PORT` (bound and released: fine for tests on loopback).
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// The real `zkq` binary as a child process, for signal and crash tests.
pub struct ChildZkq {
    pub api: String,
    pub admin: String,
    child: Option<Child>,
}

impl ChildZkq {
    /// Starts `zkq` against `zk` with its own root and `env` (ZKQ__ variables), and waits until ready.
    pub async fn start(zk: &(impl ConnectTarget + ?Sized), root: &str, env: &[(&str, &str)]) -> ChildZkq {
        let started = ChildZkq::spawn(zk, root, env);
        let http = reqwest::Client::new();
        eventually(Duration::from_secs(30), "child zkq ready", || {
            let (http, url) = (http.clone(), format!("{}/readyz", started.admin));
            async move { http.get(url).send().await.is_ok_and(|r| r.status() == 200) }
        })
        .await;
        started
    }

    /// Starts `zkq` without waiting for it to be ready.
    pub fn spawn(zk: &(impl ConnectTarget + ?Sized), root: &str, env: &[(&str, &str)]) -> ChildZkq {
        ChildZkq::spawn_binary(Path::new(env!("CARGO_BIN_EXE_zkq")), zk, root, env)
    }

    /// Starts the zkq binary at `binary` (another build, for comparisons) and waits until ready.
    pub async fn start_binary(
        binary: &Path,
        zk: &(impl ConnectTarget + ?Sized),
        root: &str,
        env: &[(&str, &str)],
    ) -> ChildZkq {
        let started = ChildZkq::spawn_binary(binary, zk, root, env);
        let http = reqwest::Client::new();
        eventually(Duration::from_secs(30), "child zkq ready", || {
            let (http, url) = (http.clone(), format!("{}/readyz", started.admin));
            async move { http.get(url).send().await.is_ok_and(|r| r.status() == 200) }
        })
        .await;
        started
    }

    /// Starts the zkq binary at `binary` without waiting for it to be ready.
    pub fn spawn_binary(
        binary: &Path,
        zk: &(impl ConnectTarget + ?Sized),
        root: &str,
        env: &[(&str, &str)],
    ) -> ChildZkq {
        let (api, admin) = (free_addr(), free_addr());
        let mut command = Command::new(binary);
        command
            .args(["--zk-connect", &zk.connect_string(), "--zk-root", root])
            .args(["--api-listen", &api, "--admin-listen", &admin])
            .env("ZKQ__LOG__LEVEL", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null());
        let child = spawn_supervised(command).expect("zkq starts");
        ChildZkq { api: format!("http://{api}"), admin: format!("http://{admin}"), child: Some(child) }
    }

    /// CPU time (user + system) the process has used so far.
    pub fn cpu_time(&self) -> Duration {
        process_cpu_time(self.pid())
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Sends a signal (`TERM`, `KILL`, ...).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill").args(["-s", signal, &self.pid().to_string()]).status().expect("kill");
        assert!(status.success(), "kill -s {signal}");
    }

    /// Waits for the process to exit.
    pub async fn wait(mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("not waited for yet");
        tokio::task::spawn_blocking(move || child.wait().expect("wait")).await.expect("join")
    }
}

impl Drop for ChildZkq {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Bodies confirmed with 201 by [`confirming_putters`].
pub type Confirmed = std::sync::Arc<Mutex<std::collections::HashSet<String>>>;

/// `putters` tasks each putting `per_putter` distinct bodies to `queue`, through outages: a 503
/// or a refused connection is retried, a 504 (outcome unknown) is neither counted nor resent.
pub fn confirming_putters(
    zkq: &TestZkq,
    queue: &str,
    putters: usize,
    per_putter: usize,
) -> (Confirmed, tokio::task::JoinSet<()>) {
    let confirmed: Confirmed = Default::default();
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..putters {
        let (http, url, confirmed) =
            (zkq.http.clone(), zkq.url(&format!("/v1/queues/{queue}/messages")), confirmed.clone());
        tasks.spawn(async move {
            for i in 0..per_putter {
                let body = format!("p{p}-{i}");
                loop {
                    match http.post(&url).body(body.clone()).send().await.map(|r| r.status().as_u16()) {
                        Ok(201) => {
                            confirmed.lock().expect("lock").insert(body);
                            break;
                        },
                        Ok(504) => break,
                        Ok(503) | Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                        Ok(other) => panic!("put answered {other}"),
                    }
                }
            }
        });
    }
    (confirmed, tasks)
}

/// Waits until every confirmed body is in `processed`; on timeout, panics with what is missing
/// and what ZooKeeper holds for the queue (its children and lock nodes).
pub async fn await_all_processed(
    zk: &ZkServer,
    root: &str,
    queue: &str,
    confirmed: &Confirmed,
    processed: &Mutex<Vec<String>>,
) {
    let expected = confirmed.lock().expect("lock").clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done: std::collections::HashSet<String> = processed.lock().expect("lock").iter().cloned().collect();
        if expected.is_subset(&done) {
            return;
        }
        if Instant::now() > deadline {
            let missing: Vec<&String> = expected.difference(&done).collect();
            let direct = zk_client(zk).await;
            panic!(
                "not processed: {missing:?}; queue: {:?}; locks: {:?}",
                children(&direct, &format!("{root}/queues/{queue}")).await,
                children(&direct, &format!("{root}/locks/{queue}")).await,
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Stops ZooKeeper for half a second and starts it again, `times` times, each after `progress`
/// holds; waits for zkq to be ready again each time.
pub async fn restart_zookeeper_during<F>(zk: &ZkServer, zkq: &TestZkq, times: usize, progress: F)
where
    F: Fn() -> bool,
{
    for _ in 0..times {
        eventually(Duration::from_secs(30), "progress", || std::future::ready(progress())).await;
        zk.stop();
        tokio::time::sleep(Duration::from_millis(500)).await;
        zk.restart();
        zkq.wait_ready().await;
    }
}

/// A free loopback port below the kernel's ephemeral range, so that no outgoing connection can
/// take it while its server is down (a restarted server must bind the same ports again).
pub fn stable_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next().and_then(|l| l.parse::<u16>().ok()))
        .unwrap_or(32768);
    let span = low.saturating_sub(10_000).max(1);
    // Start somewhere different in each test process; then walk the range.
    let start = u16::try_from(std::process::id() % u32::from(span)).unwrap_or(0);
    let _ = NEXT.compare_exchange(0, start, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..span {
        let port = 10_000 + NEXT.fetch_add(1, Ordering::SeqCst) % span;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port between 10000 and {low}");
}

/// CPU time (user + system) a process has used so far, from `/proc/PID/stat`.
pub fn process_cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc stat");
    // Fields after the command name, which is in parentheses: utime and stime are 14 and 15.
    let after = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<u64> = after.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

/// Asserts that `promtool check metrics` (Debian's prometheus package) accepts `text`.
pub fn promtool_accepts(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package) is installed");
    promtool.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write");
    let output = promtool.wait_with_output().expect("promtool runs");
    assert!(
        output.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
