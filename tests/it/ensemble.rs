//! A three-server ZooKeeper ensemble (ZooKeeper 3.9 from Debian 13, see
//! [`crate::harness::ensemble_classpath`]) on free loopback ports, for tests that kill, pause and
//! restart single servers.

#![allow(dead_code)] // not every test uses every control

use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::harness::{ConnectTarget, ensemble_classpath, four_letter, spawn_supervised, stable_port};

struct Server {
    id: usize,
    client_port: u16,
    child: Mutex<Option<Child>>,
}

/// Three `QuorumPeerMain` servers with their own data directories.
pub struct ZkEnsemble {
    dir: tempfile::TempDir,
    servers: Vec<Server>,
}

impl ZkEnsemble {
    pub const SIZE: usize = 3;

    /// Starts three servers and waits until each answers `srvr` with a mode (leader/follower).
    pub fn start() -> ZkEnsemble {
        let dir = tempfile::Builder::new().prefix("zkq-ensemble-").tempdir().expect("temp dir");
        let ports: Vec<(u16, u16, u16)> =
            (0..Self::SIZE).map(|_| (stable_port(), stable_port(), stable_port())).collect();
        let peers: String = ports
            .iter()
            .enumerate()
            .map(|(i, (_, quorum, election))| format!("server.{}=127.0.0.1:{quorum}:{election}\n", i + 1))
            .collect();
        let mut servers = Vec::new();
        for (i, (client, _, _)) in ports.iter().enumerate() {
            let home = dir.path().join(format!("s{}", i + 1));
            let data = home.join("data");
            std::fs::create_dir_all(&data).expect("data dir");
            std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("myid");
            let config = format!(
                "tickTime=1000\ninitLimit=5\nsyncLimit=2\ndataDir={}\nclientPort={client}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n4lw.commands.whitelist=*\nminSessionTimeout=2000\nmaxSessionTimeout=60000\n\
                 maxClientCnxns=0\n{peers}",
                data.display()
            );
            std::fs::write(home.join("zoo.cfg"), config).expect("zoo.cfg");
            servers.push(Server { id: i + 1, client_port: *client, child: Mutex::new(None) });
        }
        let ensemble = ZkEnsemble { dir, servers };
        for i in 0..Self::SIZE {
            ensemble.launch(i);
        }
        ensemble.wait_quorum();
        ensemble
    }

    fn home(&self, i: usize) -> std::path::PathBuf {
        self.dir.path().join(format!("s{}", i + 1))
    }

    fn launch(&self, i: usize) {
        let home = self.home(i);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(home.join("server.log")).expect("log");
        let mut command = Command::new("java");
        command
            .args(["-Xmx192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Dzookeeper.jmx.log4j.disable=true"])
            // Keep retrying the election port's bind instead of exiting after three tries.
            .arg("-Dzookeeper.electionPortBindRetry=0")
            .arg("-cp")
            .arg(ensemble_classpath())
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(home.join("zoo.cfg"))
            .stdout(Stdio::from(log.try_clone().expect("log handle")))
            .stderr(Stdio::from(log));
        let child = spawn_supervised(command).expect("java starts (is Debian's zookeeper package installed?)");
        *self.servers[i].child.lock().expect("child lock") = Some(child);
    }

    /// All three client addresses, `127.0.0.1:A,127.0.0.1:B,127.0.0.1:C`.
    pub fn connect_string(&self) -> String {
        (0..Self::SIZE).map(|i| self.address(i)).collect::<Vec<_>>().join(",")
    }

    /// `127.0.0.1:PORT` of server `i` (0-based).
    pub fn address(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.servers[i].client_port)
    }

    pub fn client_port(&self, i: usize) -> u16 {
        self.servers[i].client_port
    }

    /// Whether server `i`'s process runs (it may still be electing).
    pub fn is_running(&self, i: usize) -> bool {
        self.servers[i].child.lock().expect("child lock").is_some()
    }

    /// SIGKILL server `i` (its data stays for `restart`).
    pub fn kill(&self, i: usize) {
        if let Some(mut child) = self.servers[i].child.lock().expect("child lock").take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts server `i` again (killing it first if it runs); does not wait for it to serve.
    pub fn restart(&self, i: usize) {
        self.kill(i);
        self.launch(i);
    }

    fn signal(&self, i: usize, signal: &str) {
        let pid = self.servers[i].child.lock().expect("child lock").as_ref().map(Child::id);
        if let Some(pid) = pid {
            let status = Command::new("kill").args([signal, &pid.to_string()]).status().expect("kill runs");
            assert!(status.success(), "kill {signal} {pid} failed");
        }
    }

    /// SIGSTOP server `i`.
    pub fn pause(&self, i: usize) {
        self.signal(i, "-STOP");
    }

    /// SIGCONT server `i`.
    pub fn resume(&self, i: usize) {
        self.signal(i, "-CONT");
    }

    /// The mode server `i` reports (`leader`, `follower`, `standalone`), if it serves.
    pub fn mode(&self, i: usize) -> Option<String> {
        let answer = four_letter(self.client_port(i), "srvr")?;
        answer.lines().find_map(|l| l.strip_prefix("Mode: ").map(|m| m.trim().to_owned()))
    }

    /// The last transaction id server `i` has applied (`Zxid` of `srvr`).
    pub fn zxid(&self, i: usize) -> Option<i64> {
        let answer = four_letter(self.client_port(i), "srvr")?;
        let hex = answer.lines().find_map(|l| l.strip_prefix("Zxid: "))?.trim().trim_start_matches("0x");
        i64::from_str_radix(hex, 16).ok()
    }

    /// Waits (up to 60 s) until server `i` serves and has applied every transaction the leader had
    /// applied when this was called: a restarted server has then finished syncing with the leader.
    /// Fault schedules wait for this before the next kill: a kill of a server still syncing is a
    /// double fault (and ZooKeeper before 3.8.4 could lose committed transactions to it:
    /// ZOOKEEPER-4646, ZOOKEEPER-4785).
    pub fn wait_caught_up(&self, i: usize) {
        self.wait_quorum();
        let deadline = Instant::now() + Duration::from_secs(60);
        let target = self.leader().and_then(|l| self.zxid(l)).unwrap_or(0);
        while Instant::now() < deadline {
            if self.mode(i).is_some() && self.zxid(i).is_some_and(|z| z >= target) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("server {} did not catch up with the leader within 60 s", i + 1);
    }

    /// Every logged transaction that mentions one of `needles` (node names or paths), from the
    /// transaction logs of all three servers (each once, in zxid order), as ZooKeeper's
    /// `TxnLogToolkit` prints them: who created, locked and deleted a node, in which session.
    /// For a failing test's message, so it tells a zkq defect from a transaction ZooKeeper lost.
    pub fn history(&self, needles: &[String]) -> Vec<String> {
        let mut found: std::collections::BTreeMap<i64, String> = std::collections::BTreeMap::new();
        for i in 0..Self::SIZE {
            let Ok(entries) = std::fs::read_dir(self.home(i).join("data/version-2")) else { continue };
            for log in entries.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("log.")) {
                let output = Command::new("java")
                    .args(["-cp", &ensemble_classpath(), "org.apache.zookeeper.server.persistence.TxnLogToolkit", "-d"])
                    .arg(log.path())
                    .stderr(Stdio::null())
                    .output();
                let Ok(output) = output else { continue };
                // A record can span lines (an ACL list prints a newline): records start with a date.
                let text = String::from_utf8_lossy(&output.stdout);
                let mut records: Vec<String> = Vec::new();
                for line in text.lines() {
                    match records.last_mut() {
                        Some(last) if !line.contains(" zxid 0x") => last.push_str(line),
                        _ => records.push(line.to_owned()),
                    }
                }
                for record in records {
                    if !needles.iter().any(|n| record.contains(n.as_str())) {
                        continue;
                    }
                    let zxid = record
                        .split(" zxid 0x")
                        .nth(1)
                        .and_then(|rest| rest.split_whitespace().next())
                        .and_then(|hex| i64::from_str_radix(hex, 16).ok());
                    if let Some(zxid) = zxid {
                        found.entry(zxid).or_insert(record);
                    }
                }
            }
        }
        found.into_values().collect()
    }

    /// The server that leads now.
    pub fn leader(&self) -> Option<usize> {
        (0..Self::SIZE).find(|i| self.is_running(*i) && self.mode(*i).as_deref() == Some("leader"))
    }

    /// Waits (up to 60 s) until every running server serves with a mode and one of them leads.
    pub fn wait_quorum(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let running: Vec<usize> = (0..Self::SIZE).filter(|i| self.is_running(*i)).collect();
            let modes: Vec<Option<String>> = running.iter().map(|i| self.mode(*i)).collect();
            if modes.iter().all(Option::is_some) && modes.iter().any(|m| m.as_deref() == Some("leader")) {
                return;
            }
            if Instant::now() > deadline {
                let logs: String = (0..Self::SIZE)
                    .map(|i| {
                        let log = std::fs::read_to_string(self.home(i).join("server.log")).unwrap_or_default();
                        let tail: Vec<&str> = log.lines().rev().take(15).collect();
                        format!("--- server {} ---\n{}\n", i + 1, tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
                    })
                    .collect();
                panic!("ensemble has no quorum after 60s (modes {modes:?} of {running:?})\n{logs}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Session ids of the clients connected to server `i` now (from the `cons` four-letter word).
    pub fn sessions_on(&self, i: usize) -> Vec<i64> {
        let Some(answer) = four_letter(self.client_port(i), "cons") else { return Vec::new() };
        answer
            .split("sid=0x")
            .skip(1)
            .filter_map(|rest| {
                let hex: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
                u64::from_str_radix(&hex, 16).ok().map(|v| i64::from_ne_bytes(v.to_ne_bytes()))
            })
            .collect()
    }

    /// The server a session is connected to now.
    pub fn server_of_session(&self, session_id: i64) -> Option<usize> {
        (0..Self::SIZE).find(|i| self.is_running(*i) && self.sessions_on(*i).contains(&session_id))
    }

    /// The server a local process (a child zkq, by pid) has a connection to, from `ss -tnp`.
    pub fn server_of_pid(&self, pid: u32) -> Option<usize> {
        let output = Command::new("ss").args(["-tnpH", "state", "established"]).output().ok()?;
        let text = String::from_utf8_lossy(&output.stdout);
        let marker = format!("pid={pid},");
        text.lines().filter(|l| l.contains(&marker)).find_map(|line| {
            let peer = line.split_whitespace().nth(3)?;
            (0..Self::SIZE).find(|i| peer == self.address(*i))
        })
    }
}

impl ConnectTarget for ZkEnsemble {
    fn connect_string(&self) -> String {
        ZkEnsemble::connect_string(self)
    }
}

impl Drop for ZkEnsemble {
    fn drop(&mut self) {
        for i in 0..Self::SIZE {
            self.resume(i);
            self.kill(i);
        }
    }
}
