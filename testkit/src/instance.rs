//! zkq under test: in-process ([`TestZkq`]) or as the real binary ([`ChildZkq`]), and the
//! configuration a test gives it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use zkq::config::{Config, QueueConfig, QueueKind};

use crate::api::Api;
use crate::process::{free_addrs, process_cpu_time, spawn_supervised, zkq_binary};
use crate::server::ConnectTarget;
use crate::wait::eventually;

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
        name.parse().expect("a test declares a valid queue name"),
        QueueConfig {
            kind,
            path: path.map(str::to_owned),
            lock_path: lock_path.map(str::to_owned),
            max_items: None,
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

    /// `N` sidecars of one configuration (one fleet: the same ZooKeeper and root), each started
    /// and ready, in order: `let [a, b] = TestZkq::fleet(test_config(zk, &root)).await;`.
    pub async fn fleet<const N: usize>(config: Config) -> [TestZkq; N] {
        let mut sidecars = Vec::with_capacity(N);
        for _ in 0..N {
            sidecars.push(TestZkq::start_ready(config.clone()).await);
        }
        match sidecars.try_into() {
            Ok(fleet) => fleet,
            Err(_) => unreachable!("{N} sidecars were started"),
        }
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

    /// The typed client of this zkq's queue API.
    pub fn client(&self) -> Api {
        Api::new(self.http.clone(), &self.api)
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

    /// The metrics as registered, rendered in process. Unlike a scrape of `/metrics` it reads
    /// nothing from ZooKeeper, so it answers at once while a test holds zkq's requests at a
    /// proxy: a scrape's reads would queue behind the held request for up to a second each, and
    /// a hold that lasts too long costs zkq its connection (no answer for 5 s).
    pub fn registered_metrics(&self) -> String {
        self.running.as_ref().expect("zkq is running").metrics.render().expect("metrics render")
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

/// The real `zkq` binary as a child process, for signal and crash tests.
pub struct ChildZkq {
    pub api: String,
    pub admin: String,
    child: Option<Child>,
}

impl ChildZkq {
    /// Starts `zkq` against `zk` with its own root and `env` (ZKQ__ variables), and waits until ready.
    pub async fn start(zk: &(impl ConnectTarget + ?Sized), root: &str, env: &[(&str, &str)]) -> ChildZkq {
        ChildZkq::start_binary(&zkq_binary(), zk, root, env).await
    }

    /// Starts `zkq` without waiting for it to be ready.
    pub fn spawn(zk: &(impl ConnectTarget + ?Sized), root: &str, env: &[(&str, &str)]) -> ChildZkq {
        ChildZkq::spawn_binary(&zkq_binary(), zk, root, env)
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
        let [api, admin] = free_addrs();
        let mut command = Command::new(binary);
        command
            .args(["--zk-connect", &zk.connect_string(), "--zk-root", root])
            .args(["--api-listen", &api, "--admin-listen", &admin])
            .env("ZKQ__LOG__LEVEL", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null());
        // Its log (warnings only, many of them expected where a test injects faults) goes to a file,
        // not into the runner's output; the path is printed, which the runner shows when the test fails.
        let log = crate::repo_file(&format!("target/test-logs/zkq-{}.log", api.replace([':', '.'], "-")));
        let file = log
            .parent()
            .and_then(|dir| std::fs::create_dir_all(dir).ok())
            .and_then(|()| std::fs::File::create(&log).ok());
        if let Some(file) = file {
            eprintln!("zkq on {api}: its log is {}", log.display());
            command.stderr(file);
        }
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
