//! Reading zkq's Prometheus text, and checking it with `promtool`.

/// The value of one exact series (`name{labels}`) in Prometheus text, if present.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.strip_prefix(series).is_some_and(|rest| rest.starts_with(' ')))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The value of one exact series (`name{labels}`) in Prometheus text; 0 when absent.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The sum of every series of `name` whose labels contain all of `with` (e.g. `operation="multi"`)
/// and none of `without`.
pub fn metric_sum(text: &str, name: &str, with: &[&str], without: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter(|l| with.iter().all(|w| l.contains(w)) && !without.iter().any(|w| l.contains(w)))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
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
