//! `zkq inspect`: what is in ZooKeeper right now, read with zkq's own configuration.
//!
//! Connects one session (the configured ensemble, chroot, root and credentials), surveys every
//! declared queue and every child of `{root}/queues` with [`survey`], prints a table
//! (or JSON with `--json`) and closes the session. It only reads. Time is bounded by `--timeout`
//! (connecting included, at most [`CONNECT_TIMEOUT`] of it), memory by the survey's limits.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, JUTE_MAXBUFFER_BYTES};
use crate::metrics::Metrics;
use crate::types::QueueName;

use crate::queue::survey::{self, Detail, QueueReport, SurveyLimits};
use crate::zk::ZkSession;

/// Longest wait for a first session; an unreachable ensemble is reported after this.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Exit status when ZooKeeper cannot be reached or the report is incomplete.
pub(crate) const EXIT_INCOMPLETE: u8 = 1;

/// The flags of `zkq inspect`.
#[derive(Debug, Clone, clap::Args)]
pub struct InspectArgs {
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Look at this queue only, with its first messages.
    #[arg(long, value_name = "NAME", value_parser = queue_name)]
    pub queue: Option<QueueName>,
    /// With --queue: how many of its first messages to show.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u16).range(0..=1000))]
    pub messages: u16,
    /// Give up after this long, connecting included (e.g. 30s, 2m).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = timeout)]
    pub timeout: Duration,
    /// Queues examined at most (declared queues always are).
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_queues: u32,
    /// Nodes read per queue at most: messages checked for Curator's envelope, delivery counts.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub max_reads: u32,
}

fn queue_name(name: &str) -> Result<QueueName, String> {
    QueueName::parse(name).map_err(|err| format!("a queue name {}", err.why()))
}

fn timeout(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|e| format!("{e}; write it like 30s or 2m"))?;
    if duration < Duration::from_millis(100) || duration > Duration::from_secs(3600) {
        return Err("between 100ms and 1h".to_owned());
    }
    Ok(duration)
}

impl InspectArgs {
    fn limits(&self) -> SurveyLimits {
        SurveyLimits {
            max_queues: usize::try_from(self.max_queues).unwrap_or(usize::MAX),
            max_reads: usize::try_from(self.max_reads).unwrap_or(usize::MAX),
            ..SurveyLimits::default()
        }
    }
}

/// The whole report, as `--json` prints it.
#[derive(Debug, Serialize)]
struct Report {
    zookeeper: ZookeeperSide,
    limits: ReportLimits,
    /// Java clients refuse a child list larger than this (`jute.maxbuffer`'s default).
    java_child_list_limit_bytes: u64,
    queues: Vec<QueueReport>,
    /// Queues not examined (beyond `max_queues`, or in a `{root}/queues` list too long to read).
    omitted_queues: usize,
    note: Option<String>,
    /// Every read was made and answered: no error, no deadline passed.
    complete: bool,
    took_ms: u128,
}

#[derive(Debug, Serialize)]
struct ZookeeperSide {
    connect: String,
    root: String,
    session: String,
}

#[derive(Debug, Serialize)]
struct ReportLimits {
    #[serde(flatten)]
    survey: SurveyLimits,
    timeout_ms: u128,
}

/// Runs `zkq inspect` and returns the exit status.
pub fn run(config: &Config, args: &InspectArgs) -> u8 {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("zkq inspect: cannot start the async runtime: {err}");
            return EXIT_INCOMPLETE;
        },
    };
    runtime.block_on(inspect(config, args))
}

async fn inspect(config: &Config, args: &InspectArgs) -> u8 {
    let started = Instant::now();
    let deadline = started + args.timeout;
    let metrics = match Metrics::new() {
        Ok(metrics) => Arc::new(metrics),
        Err(err) => {
            eprintln!("zkq inspect: {err}");
            return EXIT_INCOMPLETE;
        },
    };
    let settings = match crate::zk::load_secrets(config) {
        Ok(secrets) => crate::zk::session_settings(config, secrets),
        Err(err) => {
            eprintln!("zkq inspect: {err}");
            return EXIT_INCOMPLETE;
        },
    };
    let stop = CancellationToken::new();
    let (session, session_task) = match ZkSession::start(settings, metrics, stop.clone()) {
        Ok(started) => started,
        Err(err) => {
            eprintln!("zkq inspect: {err}");
            return EXIT_INCOMPLETE;
        },
    };
    let connect_by = (started + CONNECT_TIMEOUT).min(deadline);
    let code = match session.connected(connect_by).await {
        Ok(zk) => survey_and_print(config, args, &zk.with_deadline(deadline), started, deadline).await,
        Err(_) => {
            eprintln!(
                "zkq inspect: cannot reach ZooKeeper at {} within {} (zookeeper.connect; check the address, the \
                 network, and zookeeper.auth_digest if the ensemble requires credentials)",
                config.zookeeper.connect,
                humantime::format_duration(connect_by.saturating_duration_since(started)),
            );
            EXIT_INCOMPLETE
        },
    };
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(3), session_task).await;
    code
}

async fn survey_and_print(
    config: &Config,
    args: &InspectArgs,
    zk: &crate::zk::Zk,
    started: Instant,
    deadline: Instant,
) -> u8 {
    let limits = args.limits();
    let (locations, omitted, note) = match &args.queue {
        Some(name) => (vec![survey::location(config, name)], 0, None),
        None => match survey::locate(zk, config, &limits).await {
            Ok(located) => (located.queues, located.omitted, located.note),
            Err(err) => {
                eprintln!("zkq inspect: cannot list {}/queues: {err}", printable(&config.zookeeper.root));
                return EXIT_INCOMPLETE;
            },
        },
    };
    let detail = Detail::Full { messages: if args.queue.is_some() { usize::from(args.messages) } else { 0 } };
    let mut queues = Vec::with_capacity(locations.len());
    for location in &locations {
        queues.push(survey::examine(zk, location, &limits, detail, deadline).await);
    }
    if let (Some(name), Some(queue)) = (&args.queue, queues.first())
        && !queue.declared
        && !queue.exists
        && queue.errors.is_empty()
    {
        eprintln!("zkq inspect: no queue {name:?}: it is not declared and {} does not exist", printable(&queue.path));
        return EXIT_INCOMPLETE;
    }
    let complete = queues.iter().all(|q| q.errors.is_empty());
    let report = Report {
        zookeeper: ZookeeperSide {
            connect: config.zookeeper.connect.clone(),
            root: config.zookeeper.root.clone(),
            session: survey::session_hex(zk.session_id()),
        },
        limits: ReportLimits { survey: limits, timeout_ms: args.timeout.as_millis() },
        java_child_list_limit_bytes: JUTE_MAXBUFFER_BYTES,
        queues,
        omitted_queues: omitted,
        note,
        complete,
        took_ms: started.elapsed().as_millis(),
    };
    let text = if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => text + "\n",
            Err(err) => {
                eprintln!("zkq inspect: cannot render JSON: {err}");
                return EXIT_INCOMPLETE;
            },
        }
    } else {
        render_text(&report, args.queue.is_some())
    };
    // A reader that went away (`| head`) is not an error worth a panic.
    let mut stdout = std::io::stdout().lock();
    let _ = std::io::Write::write_all(&mut stdout, text.as_bytes()).and_then(|()| std::io::Write::flush(&mut stdout));
    if complete {
        0
    } else {
        eprintln!("zkq inspect: the report is incomplete; see the errors above");
        EXIT_INCOMPLETE
    }
}

/// Text from ZooKeeper with control characters escaped, so a node name cannot drive the terminal.
fn printable(text: &str) -> String {
    text.chars().fold(String::with_capacity(text.len()), |mut out, c| {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        out
    })
}

/// `850ms`, `42s`, `4m12s`, `3h5m2s`.
fn age(ms: i64) -> String {
    if ms < 1000 {
        return format!("{}ms", ms.max(0));
    }
    let seconds = u64::try_from(ms / 1000).unwrap_or(0);
    humantime::format_duration(Duration::from_secs(seconds)).to_string().replace(' ', "")
}

fn bytes(n: i64) -> String {
    if n < 1024 { format!("{n} B") } else { format!("{:.1} KiB", n as f64 / 1024.0) }
}

fn render_text(report: &Report, one_queue: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "ZooKeeper {} (session {}), root {}: {} queue{}{}",
        printable(&report.zookeeper.connect),
        report.zookeeper.session,
        printable(&report.zookeeper.root),
        report.queues.len(),
        if report.queues.len() == 1 { "" } else { "s" },
        if report.omitted_queues > 0 { format!(", {} more not shown", report.omitted_queues) } else { String::new() },
    );
    let header = ["QUEUE", "KIND", "DEPTH", "OLDEST", "LOCKS", "REDELIVERED", "CHILD LIST", "NOTES"];
    let rows: Vec<[String; 8]> = report.queues.iter().map(row).collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ");
            }
        }
        text.trim_end().to_owned()
    };
    out.push('\n');
    let _ = writeln!(out, "{}", line(&header.map(str::to_owned)));
    for row in &rows {
        let _ = writeln!(out, "{}", line(row));
    }
    for queue in &report.queues {
        details(&mut out, queue);
    }
    if one_queue && let Some(queue) = report.queues.first() {
        messages(&mut out, queue);
    }
    if let Some(note) = &report.note {
        let _ = writeln!(out, "\nnote: {}", printable(note));
    }
    let limits = &report.limits.survey;
    let _ = writeln!(
        out,
        "\nbounds: at most {} queues, child lists of up to {} names, {} node reads and {} lock owners per queue, \
         {} in all; took {}",
        limits.max_queues,
        limits.max_list,
        limits.max_reads,
        limits.max_lock_owners,
        humantime::format_duration(Duration::from_millis(u64::try_from(report.limits.timeout_ms).unwrap_or(0))),
        age(i64::try_from(report.took_ms).unwrap_or(i64::MAX)),
    );
    out
}

fn row(queue: &QueueReport) -> [String; 8] {
    let kind = match (queue.kind, queue.kind_inferred) {
        (Some(kind), false) if queue.grouped => format!("{kind} (grouped)"),
        (Some(kind), false) => kind.to_owned(),
        (Some(kind), true) => format!("{kind} (names)"),
        (None, _) => "?".to_owned(),
    };
    let oldest = match queue.oldest_message_age_ms {
        Some(ms) => age(ms),
        None if queue.oldest_message_age_known => "-".to_owned(),
        None => "?".to_owned(),
    };
    let locks = match &queue.locks {
        Some(locks) => locks.held.to_string(),
        None if queue.lock_path.is_none() => "none".to_owned(),
        None => "?".to_owned(),
    };
    let redelivered = queue.deliveries.as_ref().map_or_else(|| "?".to_owned(), |d| d.redelivered.to_string());
    let child_list = match queue.child_list_bytes {
        Some(b) => {
            let share = b as f64 * 100.0 / JUTE_MAXBUFFER_BYTES as f64;
            format!("{} ({share:.1}%)", bytes(b))
        },
        None => "not read".to_owned(),
    };
    let mut notes = Vec::new();
    if !queue.exists {
        notes.push("no node".to_owned());
    }
    if queue.child_list_bytes.is_some_and(survey::over_java_limit) {
        notes.push("child list over Java's limit".to_owned());
    }
    if let Some(envelopes) = &queue.envelopes
        && envelopes.undecodable_count > 0
    {
        notes.push(format!("{} undecodable", envelopes.undecodable_count));
    }
    if let Some(foreign) = queue.foreign_nodes.filter(|n| *n > 0) {
        notes.push(format!("{foreign} foreign"));
    }
    if let Some(due) = queue.not_yet_due.filter(|n| *n > 0) {
        notes.push(format!("{due} not yet due"));
    }
    if let Some(groups) = queue.groups {
        notes.push(format!("{groups} groups"));
    }
    if !queue.errors.is_empty() {
        notes.push("INCOMPLETE".to_owned());
    }
    [
        printable(&queue.name),
        kind,
        queue.depth.to_string(),
        oldest,
        locks,
        redelivered,
        child_list,
        if notes.is_empty() { "-".to_owned() } else { notes.join(", ") },
    ]
}

fn details(out: &mut String, queue: &QueueReport) {
    let name = printable(&queue.name);
    let mut lines = Vec::new();
    if let Some(locks) = &queue.locks
        && locks.held > 0
    {
        let owners: Vec<String> = locks.owners.iter().map(|o| format!("{} ({})", o.session, o.locks)).collect();
        let mut text =
            format!("locks held by session {}", if owners.is_empty() { "?".to_owned() } else { owners.join(", ") });
        if usize::try_from(locks.held).unwrap_or(0) > locks.looked_up {
            let _ = write!(text, "; {} of {} looked up", locks.looked_up, locks.held);
        }
        if locks.without_message > 0 {
            let _ = write!(text, "; {} without a message", locks.without_message);
        }
        lines.push(text);
    }
    if let Some(deliveries) = &queue.deliveries
        && !deliveries.most.is_empty()
    {
        let most: Vec<String> =
            deliveries.most.iter().map(|r| format!("{} ({})", printable(&r.message_id), r.deliveries)).collect();
        lines.push(format!("delivered more than once: {}", most.join(", ")));
    }
    if let Some(envelopes) = &queue.envelopes
        && !envelopes.undecodable.is_empty()
    {
        let listed: Vec<String> =
            envelopes.undecodable.iter().map(|u| format!("{} ({})", printable(&u.message_id), u.reason)).collect();
        lines.push(format!("not Curator envelopes (of the first {} read): {}", envelopes.checked, listed.join(", ")));
    }
    if queue.child_list_bytes.is_some_and(survey::over_java_limit) {
        lines.push(format!(
            "child list of {} bytes: Curator consumers fail to read it (jute.maxbuffer {}); set max_items",
            queue.child_list_bytes.unwrap_or(0),
            JUTE_MAXBUFFER_BYTES
        ));
    }
    if !queue.child_list_read && queue.exists && queue.errors.is_empty() {
        lines.push("child list not read: more children than a survey reads".to_owned());
    }
    for error in &queue.errors {
        lines.push(format!("error: {}", printable(error)));
    }
    if !lines.is_empty() {
        out.push('\n');
        for line in lines {
            let _ = writeln!(out, "{name}: {line}");
        }
    }
}

fn messages(out: &mut String, queue: &QueueReport) {
    let Some(messages) = &queue.messages else { return };
    let _ = writeln!(
        out,
        "\nfirst {} message{} of {}:",
        messages.len(),
        if messages.len() == 1 { "" } else { "s" },
        printable(&queue.name)
    );
    for (i, m) in messages.iter().enumerate() {
        let mut facts = vec![format!("age {}", age(m.age_ms)), format!("{} B", m.size)];
        if let Some(p) = m.priority {
            facts.push(format!("priority {p}"));
        }
        if let Some(at) = m.deliver_at {
            facts.push(format!("deliver at {at}"));
        }
        if let Some(id) = &m.id {
            facts.push(format!("id {}", printable(id)));
        }
        if let Some(items) = m.items.filter(|n| *n > 1) {
            facts.push(format!("{items} items"));
        }
        if let Some(why) = &m.undecodable {
            facts.push(format!("undecodable: {why}"));
        }
        if let Some(session) = &m.locked_by {
            facts.push(format!("locked by {session}"));
        }
        if let Some(n) = m.deliveries {
            facts.push(format!("delivered {n}x"));
        }
        let _ =
            writeln!(out, "{:>4}. {}  {}  \"{}\"", i + 1, printable(&m.message_id), facts.join(", "), m.body_preview);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_durations() {
        assert_eq!(age(-5), "0ms");
        assert_eq!(age(850), "850ms");
        assert_eq!(age(252_000), "4m12s");
        assert_eq!(age(3_600_000 * 3 + 62_000), "3h1m2s");
    }

    #[test]
    fn names_from_zookeeper_cannot_drive_the_terminal() {
        assert_eq!(printable("ok-é"), "ok-é");
        assert_eq!(printable("a\u{1b}[2Jb\n"), "a\\u{1b}[2Jb\\n");
    }
}
