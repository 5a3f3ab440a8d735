//! ZooKeeper servers for tests: Debian's 3.8 standalone (private or shared), the classpaths, what
//! a client can connect to, and a direct client to check what zkq wrote.

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::process::{process_cpu_time, repo_root, spawn_supervised, stable_port};

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
    let dir = repo_root().join("target/zookeeper-3.9");
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

    /// The server's last zxid (`srvr`'s `Zxid:`): its advance counts the transactions it logged,
    /// refused multis included.
    pub fn zxid(&self) -> u64 {
        four_letter(self.port, "srvr")
            .unwrap_or_default()
            .lines()
            .find_map(|line| line.strip_prefix("Zxid: 0x").and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok()))
            .unwrap_or(0)
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

/// A direct ZooKeeper client for checking what zkq wrote.
pub async fn zk_client(zk: &(impl ConnectTarget + ?Sized)) -> zookeeper_client::Client {
    zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&zk.connect_string())
        .await
        .expect("direct ZooKeeper client connects")
}

/// Creates the expiry buckets the next ~20 s of keyed puts to `queue` (5-minute window) write
/// into, so that a fault armed for the next transaction hits the put's own transaction and not a
/// first try that finds its bucket missing.
pub async fn prepare_idempotency_buckets(direct: &zookeeper_client::Client, root: &str, queue: &str) {
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let now = zkq::now_epoch_ms();
    for second in 0..20 {
        let end = ((now + 300_000) / 1000 + 1 + second) * 1000;
        let bucket = format!("{root}/idempotency/{queue}/expiry/{end:015}");
        direct.mkdir(&bucket, &options).await.expect("bucket");
    }
}

/// Children of `path`, sorted; empty if it does not exist.
pub async fn children(client: &zookeeper_client::Client, path: &str) -> Vec<String> {
    let mut names = client.list_children(path).await.unwrap_or_default();
    names.sort();
    names
}
