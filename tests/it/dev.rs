//! The README's first command, `./scripts/dev.sh`: a private ZooKeeper and zkq; one Ctrl-C is one
//! graceful stop (a waiting long-poll answers 503, exit 0); a restart keeps the queues; a clean
//! start logs no warning.
//!
//! Every run gets its own preferred port (`ZKQ_DEV_ZK_PORT`, in place of 2181) and data directory
//! (`ZKQ_DEV_DIR`, in place of `target`), so these tests never meet a developer's own dev.sh.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One run of dev.sh in a process group of its own, as a terminal runs it.
struct Dev {
    child: Child,
    group: u32,
    api: String,
    admin: String,
    /// Every line dev.sh and zkq wrote to standard error so far.
    lines: Arc<Mutex<Vec<String>>>,
    http: reqwest::Client,
}

impl Dev {
    /// Starts `scripts/dev.sh` (zkq on ports the kernel picks) and waits until zkq is ready.
    async fn start(zk_port: u16, dir: &Path) -> Dev {
        let mut dev = Command::new(zkq_testkit::repo_file("scripts/dev.sh"));
        dev.args(["--api-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .env_remove("ZKQ__ZOOKEEPER__CONNECT")
            .env("ZKQ__LOG__FORMAT", "json")
            .env("ZKQ_DEV_ZK_PORT", zk_port.to_string())
            .env("ZKQ_DEV_DIR", dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .process_group(0);
        let mut child = dev.spawn().expect("dev.sh starts");
        let group = child.id();
        let stderr = child.stderr.take().expect("stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                use std::io::BufRead;
                let mut tx = Some(tx);
                for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Ok(event) = serde_json::from_str::<serde_json::Value>(&line)
                        && event["message"] == "zkq started"
                        && let (Some(api), Some(admin)) = (event["api"].as_str(), event["admin"].as_str())
                        && let Some(tx) = tx.take()
                    {
                        let _ = tx.send((api.to_owned(), admin.to_owned()));
                    }
                    lines.lock().expect("lines").push(line);
                }
            });
        }
        // dev.sh builds the release binary first: allow for that.
        let (api, admin) = tokio::time::timeout(Duration::from_secs(900), rx)
            .await
            .unwrap_or_else(|_| panic!("dev.sh's zkq did not start within 900 s: {:#?}", lines.lock().expect("lines")))
            .unwrap_or_else(|_| panic!("dev.sh ended before zkq started: {:#?}", lines.lock().expect("lines")));
        let http = reqwest::Client::new();
        zkq_testkit::eventually(Duration::from_secs(120), "dev.sh's zkq ready", || {
            let (http, url) = (http.clone(), format!("http://{admin}/readyz"));
            async move { http.get(url).send().await.is_ok_and(|r| r.status() == 200) }
        })
        .await;
        Dev { child, group, api: format!("http://{api}"), admin: format!("http://{admin}"), lines, http }
    }

    fn log(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    /// dev.sh's line that says where its ZooKeeper listens and keeps its data.
    fn zookeeper_line(&self) -> String {
        self.log()
            .into_iter()
            .find(|l| l.starts_with("==> ") && l.contains("ZooKeeper on 127.0.0.1:"))
            .unwrap_or_else(|| panic!("dev.sh never said where ZooKeeper is: {:#?}", self.log()))
    }

    /// Ctrl-C: SIGINT to the whole foreground process group, as a terminal sends it. Returns dev.sh's
    /// exit status once it and everything it started have ended.
    async fn ctrl_c(mut self) -> (ExitStatus, Vec<String>) {
        let pids: Vec<PathBuf> =
            ["zookeeper.pid", "zkq.pid"].iter().filter_map(|f| self.data_dir().map(|d| d.join(f))).collect();
        let pids: Vec<String> = pids.iter().filter_map(|p| std::fs::read_to_string(p).ok()).collect();
        let signalled = Command::new("kill").args(["-s", "INT", "--", &format!("-{}", self.group)]).status();
        assert!(signalled.expect("kill").success());
        let mut child = std::mem::replace(&mut self.child, Command::new("true").spawn().expect("true"));
        let status = tokio::task::spawn_blocking(move || child.wait().expect("wait")).await.expect("join");
        for pid in pids {
            let alive = Path::new(&format!("/proc/{}", pid.trim())).exists();
            assert!(!alive, "dev.sh exited and left process {} running: {:#?}", pid.trim(), self.log());
        }
        assert!(self.http.get(format!("{}/livez", self.admin)).send().await.is_err(), "zkq left running");
        (status, self.log())
    }

    /// The data directory named by the ZooKeeper line.
    fn data_dir(&self) -> Option<PathBuf> {
        let line = self.zookeeper_line();
        let dir = line.split("data in ").nth(1)?.split(' ').next()?;
        Some(PathBuf::from(dir.trim_end_matches(',')))
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        // A failing test leaves nothing running: the group, and the sessions dev.sh started.
        if let Some(dir) = self.data_dir() {
            for file in ["zkq.pid", "zookeeper.pid"] {
                if let Ok(pid) = std::fs::read_to_string(dir.join(file)) {
                    let _ = Command::new("kill")
                        .args(["-s", "KILL", pid.trim()])
                        .stderr(std::process::Stdio::null())
                        .status();
                }
            }
        }
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", self.group)])
            .stderr(std::process::Stdio::null())
            .status();
        let _ = self.child.wait();
    }
}

/// zkq's own log lines at WARN or above.
fn warnings(log: &[String]) -> Vec<&String> {
    log.iter()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .is_ok_and(|e| matches!(e["level"].as_str(), Some("WARN" | "ERROR")))
        })
        .collect()
}

/// One Ctrl-C: a long-poll waiting on a queue whose one message is leased answers `503 shutting_down`, zkq
/// drains and exits 0, dev.sh exits 0, and zkq never saw a second signal (the terminal's SIGINT
/// reached dev.sh alone, which sent zkq one SIGTERM). A clean start logs no warning either.
/// `ZKQ_DEV_STOPS` (default 2) says how many start/stop rounds to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_sh_one_ctrl_c_is_one_graceful_stop() {
    let rounds: usize = std::env::var("ZKQ_DEV_STOPS").ok().and_then(|n| n.parse().ok()).unwrap_or(2);
    let dir = tempfile::tempdir().expect("temp dir");
    let port = zkq_testkit::free_port();
    for round in 0..rounds {
        let dev = Dev::start(port, dir.path()).await;
        assert!(warnings(&dev.log()).is_empty(), "round {round}: a clean start logged a warning: {:#?}", dev.log());
        let put =
            dev.http.post(format!("{}/v1/queues/dev{round}/messages", dev.api)).body("hi").send().await.expect("put");
        assert_eq!(put.status(), 201, "the dev setup serves the API");
        let lease = dev.http.post(format!("{}/v1/queues/dev{round}/leases?visibility=10m", dev.api)).send().await;
        assert_eq!(lease.expect("lease").status(), 200);
        let waiting = {
            let url = format!("{}/v1/queues/dev{round}/take?wait=60s", dev.api);
            let http = dev.http.clone();
            tokio::spawn(async move { http.post(url).send().await })
        };
        zkq_testkit::eventually(Duration::from_secs(30), "the long-poll waiting", || {
            let (http, url) = (dev.http.clone(), format!("{}/v1/queues/dev{round}", dev.api));
            async move {
                let Ok(answer) = http.get(url).send().await else { return false };
                answer.json::<serde_json::Value>().await.is_ok_and(|info| info["waiting_takers"] == 1)
            }
        })
        .await;

        let (status, log) = dev.ctrl_c().await;
        let answer = waiting.await.expect("join").expect("the waiting long-poll got an answer");
        assert_eq!(answer.status(), 503, "round {round}: the waiting long-poll");
        let body: serde_json::Value = answer.json().await.expect("JSON error");
        assert_eq!(body["code"], "shutting_down", "round {round}: {body}");
        assert_eq!(status.code(), Some(0), "round {round}: dev.sh exited with {status:?}: {log:#?}");
        assert!(
            !log.iter().any(|l| l.contains("second signal: exiting now")),
            "round {round}: one Ctrl-C reached zkq as two signals: {log:#?}"
        );
    }
}

/// dev.sh started again at once (the previous run's connections to its server still in
/// TIME_WAIT) reuses its server's port and data: a queue put to before is still there, and the
/// message the first run had leased was released by its drain, so it is takeable at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_sh_restarted_at_once_keeps_its_queues() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = zkq_testkit::free_port();
    let first = Dev::start(port, dir.path()).await;
    let line = first.zookeeper_line();
    assert!(line.contains(&format!("127.0.0.1:{port},")), "{line}");
    let put = first.http.post(format!("{}/v1/queues/kept/messages", first.api)).body("before").send().await;
    assert_eq!(put.expect("put").status(), 201);
    let lease = first.http.post(format!("{}/v1/queues/kept/leases?visibility=10m", first.api)).send().await;
    assert_eq!(lease.expect("lease").status(), 200);
    let (status, log) = first.ctrl_c().await;
    assert_eq!(status.code(), Some(0), "{log:#?}");

    let second = Dev::start(port, dir.path()).await;
    assert_eq!(second.zookeeper_line(), line, "the restart uses the same server port and data");
    let take = second.http.post(format!("{}/v1/queues/kept/take", second.api)).send().await.expect("take");
    assert_eq!(take.status(), 200, "the queue and its message outlived the restart");
    assert_eq!(take.text().await.expect("body"), "before");
    let (status, log) = second.ctrl_c().await;
    assert_eq!(status.code(), Some(0), "{log:#?}");
}

/// When the preferred port belongs to another process, dev.sh says so and runs a private server
/// whose data (and port) outlive a restart too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_sh_private_server_keeps_its_data_across_restarts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let first = Dev::start(port, dir.path()).await;
    let line = first.zookeeper_line();
    assert!(line.contains(&format!("127.0.0.1:{port} is in use by another process")), "{line}");
    let private = dir.path().join("dev-zookeeper-private");
    assert!(line.contains(&format!("data in {} (kept across restarts)", private.display())), "{line}");
    let put = first.http.post(format!("{}/v1/queues/kept/messages", first.api)).body("private").send().await;
    assert_eq!(put.expect("put").status(), 201);
    let (status, log) = first.ctrl_c().await;
    assert_eq!(status.code(), Some(0), "{log:#?}");

    let second = Dev::start(port, dir.path()).await;
    assert_eq!(second.zookeeper_line(), line, "the same private port and data");
    let take = second.http.post(format!("{}/v1/queues/kept/take", second.api)).send().await.expect("take");
    assert_eq!(take.status(), 200, "the private server's queue outlived the restart");
    let (status, log) = second.ctrl_c().await;
    assert_eq!(status.code(), Some(0), "{log:#?}");
    drop(taken);
}
