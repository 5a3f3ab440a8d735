//! The binary: flags, check-config, reference pages, exit status 64 on a bad configuration.

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
    for flag in [
        "--config",
        "--zk-connect",
        "--zk-root",
        "--api-listen",
        "--admin-listen",
        "--log-format",
        "check-config",
        "inspect",
    ] {
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

/// `zkq reference PAGE` prints the committed reference page, and needs no usable configuration.
#[test]
fn reference_prints_the_committed_pages_without_a_configuration() {
    for (page, path) in [
        ("config", "docs/reference/configuration.md"),
        ("metrics", "docs/reference/metrics.md"),
        ("errors", "docs/reference/errors.md"),
    ] {
        let output = zkq().args(["reference", page]).env("ZKQ__ZOOKEEPER__TYPO", "x").output().expect("runs");
        assert!(output.status.success(), "{page}: {}", String::from_utf8_lossy(&output.stderr));
        let committed = std::fs::read_to_string(zkq_testkit::repo_file(path)).expect("committed page");
        assert!(String::from_utf8_lossy(&output.stdout) == committed, "zkq reference {page} differs from {path}");
    }
}

#[test]
fn missing_config_file_is_a_usage_error() {
    let output = zkq().args(["check-config", "--config", "/nonexistent/zkq.toml"]).output().expect("runs");
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent/zkq.toml"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_follows_readiness() {
    let zk = zkq_testkit::ZkServer::shared();
    let root = zkq_testkit::unique_root("healthcheck");
    let daemon = zkq_testkit::TestZkq::start_ready(zkq_testkit::test_config(zk, &root)).await;
    let admin = daemon.admin.trim_start_matches("http://").to_owned();
    // Its output is captured (not inherited), so the expected complaint once zkq is gone stays out
    // of the runner's output.
    let run = |admin: String| {
        tokio::task::spawn_blocking(move || {
            zkq().args(["healthcheck", "--admin-listen", &admin]).output().expect("runs")
        })
    };
    assert!(run(admin.clone()).await.expect("join").status.success(), "ready → exit 0");
    daemon.stop().await;
    let gone = run(admin).await.expect("join");
    assert!(!gone.status.success(), "gone → exit 1");
    assert!(String::from_utf8_lossy(&gone.stderr).contains("cannot reach"), "says why");
}

/// dev.sh's readiness probe (`zk_four_letter` in scripts/lib.sh) always ends, also when it reaches
/// ZooKeeper in the moment between its port opening and its database existing: ZooKeeper 3.8.0
/// then fails to close a four-letter command's socket (a NullPointerException in
/// `ServerCnxn.cleanupWriterSocket`), and a probe that read until the server closed the socket
/// waited forever, so dev.sh never started zkq. The moment is short: 8 probes at a time keep
/// arriving while the server starts (the old probe hung in 3 of 4 runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dev_sh_readiness_probe_ends_while_zookeeper_starts() {
    use std::time::{Duration, Instant};
    let zk = std::sync::Arc::new(zkq_testkit::ZkServer::start());
    zk.stop();
    let port = zk.connect_string().rsplit(':').next().expect("port").to_owned();
    let restarting = {
        let zk = zk.clone();
        tokio::task::spawn_blocking(move || zk.restart())
    };
    let script = format!("source '{}'; zk_four_letter {port} ruok", zkq_testkit::repo_file("scripts/lib.sh").display());
    let probe =
        || Command::new("bash").arg("-c").arg(&script).stdout(std::process::Stdio::piped()).spawn().expect("bash");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut running: Vec<(std::process::Child, Instant)> = Vec::new();
    let (mut probes, mut answered) = (0, false);
    while !answered || !running.is_empty() {
        assert!(Instant::now() < deadline, "ZooKeeper never answered imok to {probes} probes");
        while !answered && running.len() < 8 {
            running.push((probe(), Instant::now()));
            probes += 1;
        }
        let mut still = Vec::new();
        for (mut child, started) in running {
            match child.try_wait().expect("probe status") {
                Some(_) => {
                    let mut answer = String::new();
                    std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut answer)
                        .expect("read");
                    answered |= answer == "imok";
                },
                None if started.elapsed() > Duration::from_secs(30) => {
                    let _ = child.kill();
                    panic!("a probe of ZooKeeper's ruok did not end within 30 s ({probes} probes sent)");
                },
                None => still.push((child, started)),
            }
        }
        running = still;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    restarting.await.expect("restart");
}

/// The fenced blocks of `section` (up to the next `## ` heading) of README.md in `language`.
fn readme_blocks(section: &str, language: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(zkq_testkit::repo_file("README.md")).expect("README");
    let section = readme.split(&format!("## {section}\n")).nth(1).expect("the section");
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .split(&format!("```{language}\n"))
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .map(str::to_owned)
        .collect()
}

/// Runs one shell command as a newcomer's terminal would: `sh -c`, a clean environment (a PATH
/// of the system's directories, an empty HOME, no AWS configuration, no proxy), nothing added.
async fn run_clean(command: String) -> std::process::Output {
    let home = tempfile::tempdir().expect("home");
    let home_path = home.path().to_owned();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("sh")
            .arg("-c")
            .arg(&command)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &home_path)
            .env("LANG", "C.UTF-8")
            .output()
    })
    .await
    .expect("join")
    .expect("sh runs");
    drop(home);
    output
}

/// Every command of the README's "Using it" section (the curl lines, the Python snippet, the AWS
/// CLI line) runs as written, in the order written, in a clean environment, against a live zkq,
/// only its addresses replaced by the test's (8080, 9090 and 9324 are the defaults dev.sh uses);
/// and each shows what its comment says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_commands_run_verbatim_and_show_each_thing_working() {
    let zk = zkq_testkit::ZkServer::shared();
    let mut config = zkq_testkit::test_config(zk, &zkq_testkit::unique_root("readme"));
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    let daemon = zkq_testkit::TestZkq::start_ready(config).await;
    let sqs = daemon.running.as_ref().and_then(|r| r.sqs_addr).expect("the SQS listener").to_string();
    let (api, admin) = (daemon.api.trim_start_matches("http://"), daemon.admin.trim_start_matches("http://"));
    let local = |text: &str| {
        text.replace("localhost:8080", api).replace("localhost:9090", admin).replace("127.0.0.1:9324", &sqs)
    };

    let shell = readme_blocks("Using it", "sh");
    assert_eq!(shell.len(), 3, "the quickstart, the lease and the AWS CLI blocks: {shell:#?}");
    let mut receipt: Option<String> = None;
    let mut outputs = Vec::new();
    // The curl blocks first; the AWS CLI block after the Python snippet, whose message it receives.
    for line in shell[..2].iter().flat_map(|block| block.lines()).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let mut command = local(line);
        if let Some(receipt) = &receipt {
            command = command.replace("RECEIPT", receipt.as_str());
        }
        let output = run_clean(command.clone()).await;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "{command}: {stdout}{}", String::from_utf8_lossy(&output.stderr));
        if command.contains("/leases?") {
            receipt = stdout.lines().find_map(|l| l.strip_prefix("zkq-lease: ")).map(|r| r.trim().to_owned());
        }
        outputs.push((line.to_owned(), stdout));
    }
    let expect = |index: usize, what: &str, ok: &dyn Fn(&str) -> bool| {
        let (line, out) = &outputs[index];
        assert!(ok(out), "{what}: `{line}` printed {out:?}");
    };
    expect(0, "readiness", &|o| o.contains("\"status\":\"ready\""));
    expect(1, "put", &|o| o.contains("\"message_id\":\"queue-"));
    expect(2, "describe after the put", &|o| o.contains("\"depth\":1"));
    expect(3, "peek shows the message", &|o| o.contains("\"aGVsbG8=\""));
    expect(4, "take returns it", &|o| o == "hello");
    expect(5, "metrics", &|o| o.starts_with("zkq_messages_put_total") && o.trim_end().ends_with(" 1"));
    expect(6, "second put", &|o| o.contains("\"message_id\":\"queue-"));
    expect(7, "lease", &|o| o.starts_with("HTTP/1.1 200") && o.ends_with("world"));
    assert!(receipt.is_some(), "the lease printed a zkq-lease header");
    expect(8, "ack", &|o| o.is_empty());
    let depth = daemon.http.get(daemon.url("/v1/queues/orders")).send().await.expect("describe");
    let depth: serde_json::Value = depth.json().await.expect("JSON");
    assert_eq!(depth["depth"], 0, "the ack removed the leased message: {depth}");

    // The Python snippet (Debian's boto3, as scripts/test.sh installs it), then the AWS CLI line.
    let python = readme_blocks("Using it", "python");
    assert_eq!(python.len(), 1, "{python:#?}");
    let script = local(&python[0]);
    let output = run_clean(format!("/usr/bin/python3 -c '{}'", script.replace('\'', "'\\''"))).await;
    assert!(output.status.success(), "the Python snippet: {}", String::from_utf8_lossy(&output.stderr));
    let lines: Vec<&str> = shell[2].lines().filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 1, "one AWS CLI line: {lines:?}");
    let output = run_clean(local(lines[0])).await;
    let cli = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "`{}`: {cli}{}", lines[0], String::from_utf8_lossy(&output.stderr));
    assert!(cli.contains("\"Body\": \"hello\""), "`{}` received the snippet's message: {cli}", lines[0]);
    assert_eq!(outputs.len(), 9, "{outputs:#?}");
}

/// On the API listener, the admin listener's paths answer 404 with the admin listener's address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_404_for_admin_paths_names_the_admin_listener() {
    let zk = zkq_testkit::ZkServer::shared();
    let daemon =
        zkq_testkit::TestZkq::start_ready(zkq_testkit::test_config(zk, &zkq_testkit::unique_root("admin404"))).await;
    for path in ["/readyz", "/livez", "/metrics"] {
        let answer = daemon.http.get(daemon.url(path)).send().await.expect("request");
        assert_eq!(answer.status(), 404, "{path}");
        let body: serde_json::Value = answer.json().await.expect("a JSON error");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains(&format!("{}{path}", daemon.admin)), "{path}: {body}");
        let right = daemon.http.get(format!("{}{path}", daemon.admin)).send().await.expect("admin");
        assert_eq!(right.status(), 200, "{path} on the address the 404 names");
    }
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

/// Runs `zkq inspect` with `args` (off the async runtime); returns the exit code, stdout and stderr.
async fn inspect(args: Vec<String>) -> (Option<i32>, String, String) {
    let output = tokio::task::spawn_blocking(move || zkq().arg("inspect").args(&args).output().expect("runs"))
        .await
        .expect("join");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Every node under `root` with its data and child change markers (mzxid, pzxid), to show a
/// command changed nothing.
/// Every node under `root` with its stat's mzxid and pzxid, but the fleet's members: the daemon's
/// own membership comes and goes on its timer (it leaves 10 s after its last lease), whatever
/// `zkq inspect` does.
async fn tree(client: &zookeeper_client::Client, root: &str) -> Vec<(String, i64, i64)> {
    let mut out = Vec::new();
    let members = format!("{root}/members");
    let mut pending = vec![root.to_owned()];
    while let Some(path) = pending.pop() {
        if path == members {
            continue;
        }
        let Ok((children, stat)) = client.get_children(&path).await else { continue };
        out.push((path.clone(), stat.mzxid, stat.pzxid));
        pending.extend(children.into_iter().map(|c| format!("{path}/{c}")));
    }
    out.sort();
    out
}

fn queue<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["queues"]
        .as_array()
        .and_then(|queues| queues.iter().find(|q| q["name"] == name))
        .unwrap_or_else(|| panic!("no queue {name} in {report:#}"))
}

/// `zkq inspect` sees queues written by Curator (every recipe, found under the root) and by zkq
/// (declared): kinds, depths, locks with the sessions that hold them (zkq's and a Curator
/// consumer's), a redelivered message, an undecodable node, a delay item not yet due; and it
/// changes nothing in ZooKeeper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reports_queues_written_by_curator_and_by_zkq_and_changes_nothing() {
    use std::time::Duration;
    use zkq_testkit::*;

    let zk = ZkServer::shared();
    let root = unique_root("inspect");
    let dir = tempfile::tempdir().expect("temp dir");
    let config_file = dir.path().join("zkq.toml");
    std::fs::write(&config_file, "[queues.orders]\nkind = \"priority\"\n").expect("config");
    let mut config = test_config(zk, &root);
    declare(&mut config, "orders", zkq::config::QueueKind::Priority, None, None);
    let daemon = TestZkq::start_ready(config).await;
    let zkq_session = daemon.readyz().await.1["session"].as_str().expect("session").to_owned();

    // zkq: three orders; the first is leased, nacked back and leased again (2 deliveries, held).
    for (priority, body) in [(1, "first"), (2, "second"), (3, "third")] {
        let url = daemon.url(&format!("/v1/queues/orders/messages?priority={priority}"));
        assert_eq!(daemon.http.post(url).body(body).send().await.expect("put").status(), 201);
    }
    let lease = || async {
        let response = daemon.http.post(daemon.url("/v1/queues/orders/leases?wait=1s&visibility=60s")).send();
        let response = response.await.expect("lease");
        assert_eq!(response.status(), 200);
        response.headers()["zkq-lease"].to_str().expect("receipt").to_owned()
    };
    let receipt = lease().await;
    let nack = daemon.http.post(daemon.url(&format!("/v1/queues/orders/leases/{receipt}/nack?mode=requeue")));
    assert_eq!(nack.send().await.expect("nack").status(), 204);
    let _held = lease().await;

    // Curator: one queue of every recipe under {root}/queues, a consumer holding a lock.
    let path = |name: &str| format!("{root}/queues/{name}");
    Curator::run(zk, &["put", "fifo", &path("curfifo"), "6869", "7468657265"]).await;
    Curator::run(zk, &["put", "priority", &path("curprio"), "5", "05"]).await;
    Curator::run(zk, &["put", "delay", &path("curdelay"), "4102444800000", "f0"]).await; // year 2100
    Curator::run(zk, &["put", "id", &path("curid"), "a/b", "01"]).await;
    Curator::run(zk, &["offer", "simple", &path("cursimple"), "73"]).await;
    let direct = zk_client(zk).await;
    let options = zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all());
    let garbage = direct.create(&format!("{}/queue-", path("curfifo")), b"not an envelope", &options).await;
    let garbage = format!("queue-{:010}", garbage.expect("raw node").1.into_i64());
    let locks = format!("{root}/locks/curfifo");
    let consumer = Curator::spawn(
        zk,
        &["consume", "fifo", &path("curfifo"), "1", "60000", "--lock", &locks, "--hold-ms", "60000"],
    );
    let (line, _consumer) =
        tokio::task::spawn_blocking(move || (consumer.next_line(Duration::from_secs(30)), consumer))
            .await
            .expect("join");
    assert_eq!(line.as_deref(), Some("6869"), "Curator holds the head of curfifo");

    let before = tree(&direct, &root).await;
    let base = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> =
            ["--config", config_file.to_str().expect("path"), "--zk-connect"].iter().map(|s| (*s).to_owned()).collect();
        args.extend([zk.connect_string(), "--zk-root".to_owned(), root.clone()]);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    };
    let (code, stdout, stderr) = inspect(base(&["--json"])).await;
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("--json prints JSON");
    assert_eq!(report["complete"], true, "{report:#}");
    let names: Vec<&str> =
        report["queues"].as_array().expect("queues").iter().filter_map(|q| q["name"].as_str()).collect();
    assert_eq!(names, ["curdelay", "curfifo", "curid", "curprio", "cursimple", "orders"]);

    let orders = queue(&report, "orders");
    assert_eq!((orders["kind"].as_str(), orders["kind_inferred"].as_bool()), (Some("priority"), Some(false)));
    assert_eq!(orders["depth"], 3);
    assert_eq!(orders["locks"]["held"], 1);
    assert_eq!(orders["locks"]["owners"][0]["session"], zkq_session.as_str(), "zkq's session holds the lease");
    assert_eq!(orders["deliveries"]["most"][0]["deliveries"], 2, "{orders:#}");
    assert!(orders["oldest_message"].as_str().is_some_and(|m| m.starts_with("queue-100000002")), "{orders:#}");

    for (name, kind, depth) in [
        ("curfifo", "fifo", 3),
        ("curprio", "priority", 1),
        ("curdelay", "delay", 1),
        ("curid", "id", 1),
        ("cursimple", "simple", 1),
    ] {
        let q = queue(&report, name);
        assert_eq!((q["kind"].as_str(), q["kind_inferred"].as_bool()), (Some(kind), Some(true)), "{q:#}");
        assert_eq!(q["depth"], depth, "{q:#}");
        assert_eq!(q["declared"], false);
    }
    let curfifo = queue(&report, "curfifo");
    let curator_session = curfifo["locks"]["owners"][0]["session"].as_str().expect("an owner");
    assert_ne!(curator_session, zkq_session, "Curator's consumer has a session of its own");
    assert_eq!(curfifo["envelopes"]["undecodable"][0]["message_id"], garbage.as_str(), "{curfifo:#}");
    assert_eq!(curfifo["envelopes"]["undecodable_count"], 1);
    assert!(curfifo["child_list_bytes"].as_i64().is_some_and(|b| b == 3 * (4 + 16)), "{curfifo:#}");
    let curdelay = queue(&report, "curdelay");
    assert_eq!(curdelay["not_yet_due"], 1);
    assert_eq!(curdelay["oldest_message"], serde_json::Value::Null, "a message due in 2100 is not waiting");

    // The table says the same for people.
    let (code, text, stderr) = inspect(base(&[])).await;
    assert_eq!(code, Some(0), "{stderr}");
    for expected in [
        "QUEUE",
        "CHILD LIST",
        "fifo (names)",
        "simple (names)",
        &format!("orders: locks held by session {zkq_session} (1)"),
        &format!("curfifo: locks held by session {curator_session} (1)"),
        "orders: delivered more than once: queue-100000001",
        &format!("curfifo: not Curator envelopes (of the first 3 read): {garbage}"),
    ] {
        assert!(text.contains(expected), "no {expected:?} in\n{text}");
    }

    // One queue with its first messages.
    let (code, stdout, stderr) = inspect(base(&["--queue", "orders", "--messages", "2", "--json"])).await;
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let messages = report["queues"][0]["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["priority"], 1);
    assert_eq!(messages[0]["body_preview"], "first");
    assert_eq!(messages[0]["deliveries"], 2);
    assert_eq!(messages[0]["locked_by"], zkq_session.as_str());
    assert_eq!(messages[1]["body_preview"], "second");
    assert_eq!(messages[1]["locked_by"], serde_json::Value::Null);

    assert_eq!(tree(&direct, &root).await, before, "zkq inspect wrote to ZooKeeper");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_exits_1_with_a_clear_error_when_zookeeper_is_unreachable() {
    let port = zkq_testkit::free_port();
    let started = std::time::Instant::now();
    let (code, stdout, stderr) =
        inspect(vec!["--zk-connect".into(), format!("127.0.0.1:{port}"), "--timeout".into(), "2s".into()]).await;
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(stderr.contains(&format!("cannot reach ZooKeeper at 127.0.0.1:{port} within 2s")), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "bounded by --timeout: {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_keeps_to_its_bounds_and_refuses_what_it_cannot_find() {
    use zkq_testkit::*;

    let zk = ZkServer::shared();
    let root = unique_root("inspect-bounds");
    let daemon = TestZkq::start_ready(test_config(zk, &root)).await;
    for queue in ["a", "b", "c", "d"] {
        daemon.put_ok(queue, b"x").await;
    }
    let args = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["--zk-connect".to_owned(), zk.connect_string(), "--zk-root".to_owned(), root.clone()];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    };
    let (code, stdout, stderr) = inspect(args(&["--json", "--max-queues", "2", "--max-reads", "0"])).await;
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(report["queues"].as_array().map(Vec::len), Some(2));
    assert_eq!(report["omitted_queues"], 2);
    assert_eq!(report["queues"][0]["envelopes"]["checked"], 0, "--max-reads 0 reads no node");
    assert_eq!(report["limits"]["max_queues"], 2);

    let (code, _, stderr) = inspect(args(&["--queue", "nosuch"])).await;
    assert_eq!(code, Some(1));
    assert!(stderr.contains("no queue \"nosuch\""), "{stderr}");
    let (code, _, stderr) = inspect(args(&["--queue", "bad/name"])).await;
    assert_eq!(code, Some(2), "a usage error: {stderr}");
    let (code, _, stderr) = inspect(args(&["--timeout", "5"])).await;
    assert_eq!(code, Some(2), "a duration needs a unit: {stderr}");
    daemon.stop().await;
}

/// `zkq inspect` says which queues are grouped and how many groups they hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_a_grouped_queue_and_its_groups() {
    use zkq_testkit::*;

    let zk = ZkServer::shared();
    let root = unique_root("inspect-groups");
    let dir = tempfile::tempdir().expect("temp dir");
    let config_file = dir.path().join("zkq.toml");
    std::fs::write(&config_file, "[queues.orders]\ngrouped = true\n").expect("config");
    let mut config = test_config(zk, &root);
    declare(&mut config, "orders", zkq::config::QueueKind::Fifo, None, None);
    if let Some(orders) = config.queues.get_mut("orders") {
        orders.grouped = true;
    }
    let daemon = TestZkq::start_ready(config).await;
    for group in ["a", "a", "b"] {
        assert_eq!(daemon.client().put("orders", &format!("group={group}"), b"x").await.status, 201);
    }
    let args = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = vec!["--config".into(), config_file.to_str().expect("path").into()];
        args.extend(["--zk-connect".to_owned(), zk.connect_string(), "--zk-root".to_owned(), root.clone()]);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    };
    let (code, stdout, stderr) = inspect(args(&["--json"])).await;
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("--json prints JSON");
    let orders = queue(&report, "orders");
    assert_eq!((orders["grouped"].as_bool(), orders["groups"].as_u64()), (Some(true), Some(2)), "{orders:#}");
    let (code, text, stderr) = inspect(args(&[])).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(text.contains("fifo (grouped)") && text.contains("2 groups"), "{text}");
}

/// The listen addresses the test kit gives a child zkq are all different, however many are asked
/// for at once: two free ports taken one after the other can be the same one (a child zkq was
/// once given one port for both listeners under load, and refused its configuration).
#[test]
fn free_addresses_asked_together_are_all_different() {
    for _ in 0..200 {
        let addrs: [String; 8] = zkq_testkit::free_addrs();
        let distinct: std::collections::HashSet<&String> = addrs.iter().collect();
        assert_eq!(distinct.len(), addrs.len(), "{addrs:?}");
    }
}
