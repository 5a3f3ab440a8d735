//! One queue's facts, resolved from the configuration once, where the queue is opened: its kind
//! and nodes, its limits, its dead-letter queue, how its cache watches. Starting a queue
//! (`service/start.rs`) reads this spec and nothing else of the configuration, so what a queue is
//! is decided in one place.

use std::sync::Arc;
use std::time::Duration;

use super::names;
use super::service::{dead_letter_of, queue_layout};
use super::settings::DeadLetter;
use crate::config::{Config, QueueKind};
use crate::queue::cache::Rules;
use crate::types::{Layout, QueueName};

/// Everything a queue needs of the configuration.
#[derive(Debug, Clone)]
pub(crate) struct QueueSpec {
    pub(crate) name: QueueName,
    /// Declared in the configuration (else dynamic: its settings are its node's).
    pub(crate) declared: bool,
    pub(crate) kind: QueueKind,
    pub(crate) grouped: bool,
    pub(crate) path: String,
    pub(crate) lock_path: Option<String>,
    pub(crate) max_items: Option<u32>,
    /// A declared queue's dead-letter queue (a dynamic one's comes with its settings).
    pub(crate) dead_letter: Option<Arc<DeadLetter>>,
    /// A declared queue's retention (a dynamic one's comes with its settings).
    pub(crate) retention: Option<Duration>,
    pub(crate) idempotency_window: Duration,
    /// How the queue's cache watches it.
    pub(super) rules: Rules,
    /// Where zkq keeps the queue's delivery counts, fleet members and (dynamic) settings.
    pub(crate) deliveries_path: String,
    pub(crate) members_path: String,
    pub(crate) settings_path: String,
    pub(crate) max_message_bytes: usize,
    pub(crate) max_peek_bytes: usize,
    pub(crate) max_leases: usize,
}

impl QueueSpec {
    /// The spec of queue `name` under `config`, declared or not.
    pub(crate) fn resolve(config: &Config, name: &QueueName) -> QueueSpec {
        let declared = config.queues.get(name);
        let layout = queue_layout(config, name);
        let (kind, grouped) = (layout.kind, layout.grouped);
        let max_items = declared.and_then(|q| q.max_items);
        let dead_letter = declared
            .and_then(|q| q.dead_letter.as_ref().map(|target| (target, q.max_deliveries)))
            .map(|(target, max_deliveries)| Arc::new(dead_letter_of(config, target, max_deliveries)));
        let eager = dead_letter.is_some() && kind != QueueKind::Simple;
        let watch_always = !config.queues_watch_on_demand || grouped || max_items.is_some() || eager;
        let rules = Rules {
            naming: names::naming(kind, grouped),
            grouped,
            eager,
            watch_always,
            // A queue every member watches anyway, or whose messages fall due by the clock, has
            // no members standing by.
            watchers: if watch_always || kind == QueueKind::Delay { 0 } else { config.queues_fleet_watchers },
        };
        let root = Layout::new(&config.zookeeper.root);
        QueueSpec {
            name: name.clone(),
            declared: declared.is_some(),
            kind,
            grouped,
            path: layout.path,
            lock_path: layout.lock_path,
            max_items,
            dead_letter,
            retention: declared.and_then(|q| q.retention),
            idempotency_window: config.idempotency_window(name),
            rules,
            deliveries_path: root.deliveries(name),
            members_path: root.members(name),
            settings_path: root.settings(name),
            max_message_bytes: config.api.max_message_bytes,
            max_peek_bytes: config.api.max_peek_bytes,
            max_leases: config.lease.max_per_queue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::QueueConfig;

    fn name(text: &str) -> QueueName {
        text.parse().expect("a queue name")
    }

    #[test]
    fn a_dynamic_queue_is_a_watched_on_demand_fifo_queue_of_the_roots_nodes() {
        let config = Config::default();
        let spec = QueueSpec::resolve(&config, &name("jobs"));
        assert!(!spec.declared);
        assert_eq!((spec.kind, spec.grouped), (QueueKind::Fifo, false));
        assert_eq!(spec.path, Layout::new(&config.zookeeper.root).queue("jobs"));
        assert_eq!(spec.lock_path, Some(Layout::new(&config.zookeeper.root).locks("jobs")));
        assert!(!spec.rules.watch_always && spec.rules.watchers == config.queues_fleet_watchers);
        // A name ending in .fifo is an SQS FIFO queue: grouped, watched by every member.
        let fifo = QueueSpec::resolve(&config, &name("orders.fifo"));
        assert!(fifo.grouped && fifo.rules.watch_always && fifo.rules.watchers == 0);
    }

    #[test]
    fn a_declared_queue_takes_its_limits_and_dead_letter_queue_from_its_table() {
        let mut config = Config::default();
        let table = QueueConfig {
            kind: QueueKind::Fifo,
            path: None,
            lock_path: None,
            max_items: Some(10),
            max_deliveries: Some(3),
            dead_letter: Some(name("dead")),
            push: None,
            idempotency_window: None,
            grouped: false,
            sqs_binary_bodies: None,
            retention: Some(Duration::from_secs(60)),
        };
        config.queues.insert(name("work"), table);
        let spec = QueueSpec::resolve(&config, &name("work"));
        assert!(spec.declared);
        assert_eq!(spec.max_items, Some(10));
        assert_eq!(spec.retention, Some(Duration::from_secs(60)));
        let dead = spec.dead_letter.as_ref().expect("a dead-letter queue");
        assert_eq!((dead.name.as_str(), dead.max_deliveries), ("dead", Some(3)));
        // A queue with max_items is watched by every member.
        assert!(spec.rules.watch_always && spec.rules.eager);
    }
}
