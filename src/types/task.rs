//! The kinds of supervised background task: a typed metric label.

/// Every kind of supervised task: the fixed label set of the restart metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Task {
    CacheRefresher,
    LeaseReaper,
    DeliveryCountSweeper,
    LockWatcher,
    CounterWatch,
    UndecodableMover,
    PushWorker,
    PushReadiness,
    IdempotencySweeper,
    FleetMember,
    RetentionSweeper,
}

impl Task {
    /// Every task, for exporting each series from the start.
    pub(crate) const ALL: [Task; 11] = [
        Task::CacheRefresher,
        Task::LeaseReaper,
        Task::DeliveryCountSweeper,
        Task::LockWatcher,
        Task::CounterWatch,
        Task::UndecodableMover,
        Task::PushWorker,
        Task::PushReadiness,
        Task::IdempotencySweeper,
        Task::FleetMember,
        Task::RetentionSweeper,
    ];

    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Task::CacheRefresher => "cache_refresher",
            Task::LeaseReaper => "lease_reaper",
            Task::DeliveryCountSweeper => "delivery_count_sweeper",
            Task::LockWatcher => "lock_watcher",
            Task::CounterWatch => "counter_watch",
            Task::UndecodableMover => "undecodable_mover",
            Task::PushWorker => "push_worker",
            Task::PushReadiness => "push_readiness",
            Task::IdempotencySweeper => "idempotency_sweeper",
            Task::FleetMember => "fleet_member",
            Task::RetentionSweeper => "retention_sweeper",
        }
    }
}
