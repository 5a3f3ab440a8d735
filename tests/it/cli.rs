//! The binary: flags, check-config, exit status 64 on a bad configuration.

use std::process::Command;

fn zkq() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_zkq"));
    command.env_remove("ZKQ__ZOOKEEPER__CONNECT");
    command
}

#[test]
fn help_documents_every_flag() {
    let output = zkq().arg("--help").output().expect("runs");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    for flag in
        ["--config", "--zk-connect", "--zk-root", "--api-listen", "--admin-listen", "--log-format", "check-config"]
    {
        assert!(text.contains(flag), "--help lacks {flag}:\n{text}");
    }
}

#[test]
fn check_config_prints_effective_values_with_secrets_redacted() {
    let output = zkq()
        .arg("check-config")
        .env("ZKQ__ZOOKEEPER__AUTH_DIGEST", "svc:s3cret")
        .env("ZKQ__ZOOKEEPER__ROOT", "/from-env")
        .arg("--zk-connect")
        .arg("zk1:2181,zk2:2181")
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}{}", String::from_utf8_lossy(&output.stderr));
    assert!(text.contains("connect = \"zk1:2181,zk2:2181\""), "{text}");
    assert!(text.contains("root = \"/from-env\""), "{text}");
    assert!(!text.contains("s3cret"), "secret printed: {text}");
}

#[test]
fn invalid_configuration_exits_64_naming_key_value_and_allowed() {
    let cases: [(&str, &str, &[&str]); 3] = [
        ("ZKQ__ZOOKEEPER__SESSION_TIMEOUT", "900ms", &["zookeeper.session_timeout", "900ms", "between"]),
        ("ZKQ__API__LISTEN", "not-an-address", &["api.listen", "not-an-address"]),
        ("ZKQ__ZOOKEEPER__TYPO", "1", &["typo", "unknown"]),
    ];
    for (key, value, expected) in cases {
        let output = zkq().arg("check-config").env(key, value).output().expect("runs");
        assert_eq!(output.status.code(), Some(64), "{key}={value}");
        let text = String::from_utf8_lossy(&output.stderr);
        for word in expected {
            assert!(text.contains(word), "{key}={value}: message lacks {word:?}: {text}");
        }
    }
    // The daemon itself refuses to start, before binding anything.
    let output = zkq().args(["run", "--log-format", "yaml"]).output().expect("runs");
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("yaml"));
}

#[test]
fn missing_config_file_is_a_usage_error() {
    let output = zkq().args(["check-config", "--config", "/nonexistent/zkq.toml"]).output().expect("runs");
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent/zkq.toml"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_follows_readiness() {
    let zk = crate::harness::ZkServer::shared();
    let root = crate::harness::unique_root("healthcheck");
    let daemon = crate::harness::TestZkq::start_ready(crate::harness::test_config(zk, &root)).await;
    let admin = daemon.admin.trim_start_matches("http://").to_owned();
    let run = |admin: String| {
        tokio::task::spawn_blocking(move || {
            zkq().args(["healthcheck", "--admin-listen", &admin]).status().expect("runs")
        })
    };
    assert!(run(admin.clone()).await.expect("join").success(), "ready → exit 0");
    daemon.stop().await;
    assert!(!run(admin).await.expect("join").success(), "gone → exit 1");
}

/// The README's first command: `./scripts/dev.sh` starts a private ZooKeeper and zkq; Ctrl-C
/// (SIGINT to the foreground process group) stops both and leaves no process behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_sh_runs_zkq_with_a_private_zookeeper_and_ctrl_c_stops_both() {
    use std::os::unix::process::CommandExt;
    use std::time::Duration;

    let port = || std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let (api, admin) = (format!("127.0.0.1:{}", port()), format!("127.0.0.1:{}", port()));
    let mut dev = Command::new(crate::harness::repo_file("scripts/dev.sh"));
    dev.args(["--api-listen", &api, "--admin-listen", &admin])
        .env_remove("ZKQ__ZOOKEEPER__CONNECT")
        .stdout(std::process::Stdio::null())
        .process_group(0);
    let mut child = dev.spawn().expect("dev.sh starts");
    let group = child.id();
    let _cleanup = GroupGuard(group);
    let http = reqwest::Client::new();
    // dev.sh builds the release binary first: allow for that.
    crate::harness::eventually(Duration::from_secs(600), "dev.sh's zkq ready", || {
        let (http, url) = (http.clone(), format!("http://{admin}/readyz"));
        async move { http.get(url).send().await.is_ok_and(|r| r.status() == 200) }
    })
    .await;
    let put = http.post(format!("http://{api}/v1/queues/dev/messages")).body("hi").send().await.expect("put");
    assert_eq!(put.status(), 201, "the dev setup serves the API");

    let signalled = Command::new("kill").args(["-s", "INT", "--", &format!("-{group}")]).status().expect("kill");
    assert!(signalled.success());
    let status = tokio::task::spawn_blocking(move || child.wait().expect("wait")).await.expect("join");
    assert!(matches!(status.code(), Some(0 | 130)), "dev.sh exited with {status:?}");
    let leftovers = Command::new("pgrep").args(["-g", &group.to_string()]).output().expect("pgrep");
    assert!(leftovers.stdout.is_empty(), "ZooKeeper left running: {}", String::from_utf8_lossy(&leftovers.stdout));
    assert!(http.get(format!("http://{admin}/livez")).send().await.is_err(), "zkq left running");
}

/// Kills a process group when dropped, so a failing test leaves nothing running.
struct GroupGuard(u32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-s", "KILL", "--", &format!("-{}", self.0)]).status();
    }
}

/// Every command of the README's "Using it" block runs against a live zkq, so the README cannot rot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_quickstart_commands_work() {
    let readme = std::fs::read_to_string(crate::harness::repo_file("README.md")).expect("README");
    let section = readme.split("## Using it").nth(1).expect("a Using it section");
    let block = section.split("```sh").nth(1).and_then(|b| b.split("```").next()).expect("a sh block");
    let commands: Vec<&str> = block.lines().filter(|l| l.starts_with("curl ")).collect();
    assert!(commands.len() >= 4, "{commands:?}");

    let zk = crate::harness::ZkServer::shared();
    let daemon =
        crate::harness::TestZkq::start_ready(crate::harness::test_config(zk, &crate::harness::unique_root("readme")))
            .await;
    let host = daemon.api.trim_start_matches("http://").to_owned();
    let mut outputs = Vec::new();
    for command in commands {
        let command = command.split(" # ").next().unwrap_or(command).replace("localhost:8080", &host);
        let command = command.replacen("curl ", "curl -sS --fail-with-body --max-time 30 ", 1);
        let output = tokio::task::spawn_blocking(move || Command::new("sh").arg("-c").arg(&command).output())
            .await
            .expect("join")
            .expect("sh runs");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        outputs.push(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    assert!(outputs[0].contains("\"message_id\":\"queue-"), "put: {}", outputs[0]);
    assert_eq!(outputs[1], "hello", "take returns the put body");
    assert!(outputs[2].contains("\"kind\":\"fifo\""), "describe: {}", outputs[2]);
    assert!(outputs[3].contains("\"messages\":[]"), "peek after the take: {}", outputs[3]);
}

/// Declared queues without `max_items` get a recommendation that keeps their child list readable
/// by Curator consumers (within Java's default `jute.maxbuffer`); a queue with one gets none.
#[test]
fn check_config_recommends_max_items_for_declared_queues_without_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("zkq.toml");
    std::fs::write(
        &file,
        "[queues.orders]\nkind = \"priority\"\n\n[queues.bounded]\nkind = \"fifo\"\nmax_items = 1000\n",
    )
    .expect("write config");
    let output = zkq().arg("--config").arg(&file).arg("check-config").output().expect("runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}{}", String::from_utf8_lossy(&output.stderr));
    let advice: Vec<&str> = text.lines().filter(|l| l.contains("recommended max_items")).collect();
    assert_eq!(advice.len(), 1, "{text}");
    assert!(advice[0].contains("queues.orders.max_items"), "{text}");
    // 90% of Java's default jute.maxbuffer (0xfffff) over 4 + 25 bytes per priority item name.
    assert!(advice[0].ends_with(&format!("recommended max_items = {}", 0xfffff * 9 / 10 / 29)), "{text}");
}
