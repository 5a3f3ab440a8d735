//! A three-server ZooKeeper ensemble (ZooKeeper 3.9 from Debian 13, see
//! [`zkq_testkit::ensemble_classpath`]) on free loopback ports, for tests that kill, pause and
//! restart single servers.

#![allow(dead_code)] // not every test uses every control

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use zkq_testkit::{ConnectTarget, ensemble_classpath, four_letter, spawn_supervised, stable_port};

struct Server {
    id: usize,
    client_port: u16,
    child: Mutex<Option<Child>>,
}

/// Three `QuorumPeerMain` servers with their own data directories.
pub(crate) struct ZkEnsemble {
    dir: tempfile::TempDir,
    servers: Vec<Server>,
    /// With [`ZkEnsemble::start_with_quorum_links`]: `links[i][j]` carries server `i`'s quorum
    /// connection to server `j` (none for `i == j`).
    links: Vec<Vec<Option<QuorumLink>>>,
}

impl ZkEnsemble {
    pub(crate) const SIZE: usize = 3;

    /// Starts three servers and waits until each answers `srvr` with a mode (leader/follower).
    pub(crate) fn start() -> ZkEnsemble {
        ZkEnsemble::start_inner(false, 0)
    }

    /// Three voting servers and one observer (`peerType=observer`, server 4): it votes in
    /// nothing, serves its clients' reads and watches, and forwards their writes to the leader.
    pub(crate) fn start_with_observer() -> ZkEnsemble {
        ZkEnsemble::start_inner(false, 1)
    }

    /// Like [`ZkEnsemble::start`], but every server reaches the others' quorum ports through a
    /// relay in this process, so [`ZkEnsemble::hold_commits_to`] can make a follower lag behind
    /// the leader while it still serves its clients. `syncLimit` is 10 ticks (10 s): a link may be
    /// held for a few seconds before the leader drops that follower.
    pub(crate) fn start_with_quorum_links() -> ZkEnsemble {
        ZkEnsemble::start_inner(true, 0)
    }

    fn start_inner(relayed: bool, observers: usize) -> ZkEnsemble {
        let dir = tempfile::Builder::new().prefix("zkq-ensemble-").tempdir().expect("temp dir");
        let all = Self::SIZE + observers;
        let ports: Vec<(u16, u16, u16)> = (0..all).map(|_| (stable_port(), stable_port(), stable_port())).collect();
        let links: Vec<Vec<Option<QuorumLink>>> = (0..all)
            .map(|i| (0..all).map(|j| (relayed && i != j).then(|| QuorumLink::start(ports[j].1))).collect())
            .collect();
        let sync_limit = if relayed { 10 } else { 2 };
        let mut servers = Vec::new();
        for (i, (client, _, _)) in ports.iter().enumerate() {
            // Server `i` sees the others' quorum ports through its own links (when relayed).
            let peers: String = ports
                .iter()
                .enumerate()
                .map(|(j, (_, quorum, election))| {
                    let quorum = links[i][j].as_ref().map_or(*quorum, |link| link.port);
                    let role = if j >= Self::SIZE { ":observer" } else { "" };
                    format!("server.{}=127.0.0.1:{quorum}:{election}{role}\n", j + 1)
                })
                .collect();
            let peer_type = if i >= Self::SIZE { "peerType=observer\n" } else { "" };
            let home = dir.path().join(format!("s{}", i + 1));
            let data = home.join("data");
            std::fs::create_dir_all(&data).expect("data dir");
            std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("myid");
            let config = format!(
                "tickTime=1000\ninitLimit=5\nsyncLimit={sync_limit}\ndataDir={}\nclientPort={client}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n4lw.commands.whitelist=*\nminSessionTimeout=2000\nmaxSessionTimeout=60000\n\
                 maxClientCnxns=0\n{peer_type}{peers}",
                data.display()
            );
            std::fs::write(home.join("zoo.cfg"), config).expect("zoo.cfg");
            servers.push(Server { id: i + 1, client_port: *client, child: Mutex::new(None) });
        }
        let ensemble = ZkEnsemble { dir, servers, links };
        for i in 0..all {
            ensemble.launch(i);
        }
        ensemble.wait_quorum();
        for i in Self::SIZE..all {
            let deadline = Instant::now() + Duration::from_secs(60);
            while ensemble.mode(i).as_deref() != Some("observer") {
                assert!(Instant::now() < deadline, "the observer (server {}) did not join within 60 s", i + 1);
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        ensemble
    }

    /// `127.0.0.1:PORT` of the observer (with [`ZkEnsemble::start_with_observer`]).
    pub(crate) fn observer_address(&self) -> String {
        self.address(Self::SIZE)
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
    pub(crate) fn connect_string(&self) -> String {
        (0..Self::SIZE).map(|i| self.address(i)).collect::<Vec<_>>().join(",")
    }

    /// `127.0.0.1:PORT` of server `i` (0-based).
    pub(crate) fn address(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.servers[i].client_port)
    }

    pub(crate) fn client_port(&self, i: usize) -> u16 {
        self.servers[i].client_port
    }

    /// Whether server `i`'s process runs (it may still be electing).
    pub(crate) fn is_running(&self, i: usize) -> bool {
        self.servers[i].child.lock().expect("child lock").is_some()
    }

    /// SIGKILL server `i` (its data stays for `restart`).
    pub(crate) fn kill(&self, i: usize) {
        if let Some(mut child) = self.servers[i].child.lock().expect("child lock").take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts server `i` again (killing it first if it runs); does not wait for it to serve.
    pub(crate) fn restart(&self, i: usize) {
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
    pub(crate) fn pause(&self, i: usize) {
        self.signal(i, "-STOP");
    }

    /// SIGCONT server `i`.
    pub(crate) fn resume(&self, i: usize) {
        self.signal(i, "-CONT");
    }

    /// Holds every byte the other servers send server `i` on its quorum connections (proposals,
    /// commits, pings) until [`ZkEnsemble::release_commits_to`]: a follower `i` keeps serving
    /// reads, from a tree that no longer changes. Only with [`ZkEnsemble::start_with_quorum_links`].
    pub(crate) fn hold_commits_to(&self, i: usize) {
        self.links[i].iter().flatten().for_each(|link| link.hold(true));
    }

    /// Lets server `i` receive from the others again: it applies what it missed, in order.
    pub(crate) fn release_commits_to(&self, i: usize) {
        self.links[i].iter().flatten().for_each(|link| link.hold(false));
    }

    /// The mode server `i` reports (`leader`, `follower`, `standalone`), if it serves.
    pub(crate) fn mode(&self, i: usize) -> Option<String> {
        let answer = four_letter(self.client_port(i), "srvr")?;
        answer.lines().find_map(|l| l.strip_prefix("Mode: ").map(|m| m.trim().to_owned()))
    }

    /// The last transaction id server `i` has applied (`Zxid` of `srvr`).
    pub(crate) fn zxid(&self, i: usize) -> Option<i64> {
        let answer = four_letter(self.client_port(i), "srvr")?;
        let hex = answer.lines().find_map(|l| l.strip_prefix("Zxid: "))?.trim().trim_start_matches("0x");
        i64::from_str_radix(hex, 16).ok()
    }

    /// Waits (up to 60 s) until server `i` serves and has applied every transaction the leader had
    /// applied when this was called: a restarted server has then finished syncing with the leader.
    /// Fault schedules wait for this before the next kill: a kill of a server still syncing is a
    /// double fault (and ZooKeeper before 3.8.4 could lose committed transactions to it:
    /// ZOOKEEPER-4646, ZOOKEEPER-4785).
    pub(crate) fn wait_caught_up(&self, i: usize) {
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
    pub(crate) fn history(&self, needles: &[String]) -> Vec<String> {
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
    pub(crate) fn leader(&self) -> Option<usize> {
        (0..Self::SIZE).find(|i| self.is_running(*i) && self.mode(*i).as_deref() == Some("leader"))
    }

    /// Waits (up to 60 s) until every running server serves with a mode and one of them leads.
    pub(crate) fn wait_quorum(&self) {
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
    pub(crate) fn sessions_on(&self, i: usize) -> Vec<i64> {
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
    pub(crate) fn server_of_session(&self, session_id: i64) -> Option<usize> {
        (0..Self::SIZE).find(|i| self.is_running(*i) && self.sessions_on(*i).contains(&session_id))
    }

    /// The server a local process (a child zkq, by pid) has a connection to, from `ss -tnp`.
    pub(crate) fn server_of_pid(&self, pid: u32) -> Option<usize> {
        let output = Command::new("ss").args(["-tnpH", "state", "established"]).output().ok()?;
        let text = String::from_utf8_lossy(&output.stdout);
        let marker = format!("pid={pid},");
        text.lines().filter(|l| l.contains(&marker)).find_map(|line| {
            let peer = line.split_whitespace().nth(3)?;
            (0..Self::SIZE).find(|i| peer == self.address(*i))
        })
    }
}

/// A TCP relay on a loopback port in front of one server's quorum port. Bytes towards the
/// connecting server can be held: read from the upstream socket, then kept until released.
struct QuorumLink {
    port: u16,
    held: Arc<(Mutex<bool>, Condvar)>,
}

impl QuorumLink {
    fn start(upstream_port: u16) -> QuorumLink {
        let listener = TcpListener::bind("127.0.0.1:0").expect("relay binds");
        let port = listener.local_addr().expect("relay address").port();
        let held = Arc::new((Mutex::new(false), Condvar::new()));
        let relay_held = held.clone();
        std::thread::spawn(move || {
            for accepted in listener.incoming() {
                let Ok(downstream) = accepted else { continue };
                let Ok(upstream) = TcpStream::connect(("127.0.0.1", upstream_port)) else { continue };
                let _ = (downstream.set_nodelay(true), upstream.set_nodelay(true));
                let (Ok(down_reader), Ok(up_reader)) = (downstream.try_clone(), upstream.try_clone()) else { continue };
                std::thread::spawn(move || copy(down_reader, upstream, None));
                let held = relay_held.clone();
                std::thread::spawn(move || copy(up_reader, downstream, Some(held)));
            }
        });
        QuorumLink { port, held }
    }

    fn hold(&self, on: bool) {
        let (held, changed) = &*self.held;
        *held.lock().expect("link lock") = on;
        changed.notify_all();
    }
}

/// Copies `from` to `to` until either side closes; while `held` is set, what was read waits.
fn copy(mut from: TcpStream, mut to: TcpStream, held: Option<Arc<(Mutex<bool>, Condvar)>>) {
    use std::io::{Read, Write};
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(held) = &held {
            let (flag, changed) = &**held;
            let mut guard = flag.lock().expect("link lock");
            while *guard {
                guard = changed.wait(guard).expect("link lock");
            }
        }
        if to.write_all(&buffer[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

impl ConnectTarget for ZkEnsemble {
    fn connect_string(&self) -> String {
        ZkEnsemble::connect_string(self)
    }
}

impl Drop for ZkEnsemble {
    fn drop(&mut self) {
        for i in 0..self.servers.len() {
            self.resume(i);
            self.kill(i);
        }
    }
}
