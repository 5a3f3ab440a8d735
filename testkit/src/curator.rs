//! The real Curator 5.4.0 recipes, driven through `tests/java/CuratorTool.java` as a child
//! process, and the hex form its tool prints bodies in.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

use crate::process::{repo_root, spawn_supervised};
use crate::server::ConnectTarget;

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
