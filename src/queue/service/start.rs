//! Starting one queue: its parts (cache, claims, leases, puts), and the tasks that keep it
//! (cache refresher, fleet membership, settings follower, lease reaper, sweepers).

use std::sync::Arc;

use super::{QueueService, dead_letter_of};
use crate::config::QueueKind;
use crate::queue::QueueError;
use crate::queue::acquire::Claims;
use crate::queue::browse::Browse;
use crate::queue::cache::ChildrenCache;
use crate::queue::context::Context;
use crate::queue::facade::{Parts, Queue};
use crate::queue::lease::{LeaseTable, Leases};
use crate::queue::names;
use crate::queue::put::Puts;
use crate::queue::retention::Retention;
use crate::queue::settings::{Current, QueueSettings, SettingsCell};
use crate::queue::spec::QueueSpec;
use crate::supervise::{self, Task};
use crate::types::Layout;

impl QueueService {
    /// Builds the queue `spec` describes and starts its tasks (the caller inserts it into the
    /// map); a dynamic queue takes one of `max_dynamic_queues`' slots.
    pub(super) fn start_queue(&self, spec: QueueSpec) -> Result<Arc<Queue>, QueueError> {
        if !spec.declared {
            if !self.config.queues_dynamic {
                return Err(QueueError::UnknownQueue(spec.name));
            }
            let mut dynamic = self.dynamic_count.lock().unwrap_or_else(|p| p.into_inner());
            if *dynamic >= self.config.max_dynamic_queues {
                return Err(QueueError::TooManyQueues(self.config.max_dynamic_queues));
            }
            *dynamic += 1;
        }
        let QueueSpec { name, declared, kind, grouped, path, lock_path, max_items, dead_letter, .. } = spec.clone();
        let name = &name;
        let stop = self.shutdown.child_token();
        let settings = Arc::new(if declared { SettingsCell::declared() } else { SettingsCell::unloaded() });
        let cache = ChildrenCache::new(
            spec.rules,
            path.clone(),
            name.to_owned(),
            self.metrics.clone(),
            stop.clone(),
            self.tasks.clone(),
        );
        let ctx = Arc::new(Context {
            name: name.clone(),
            kind,
            naming: names::naming(kind, grouped),
            grouped,
            path,
            lock_path: lock_path.clone(),
            max_items,
            declared,
            dead_letter,
            settings: settings.clone(),
            retention: spec.retention,
            deliveries_path: spec.deliveries_path.clone(),
            max_message_bytes: spec.max_message_bytes,
            max_peek_bytes: spec.max_peek_bytes,
            max_leases: spec.max_leases,
            session: self.session.clone(),
            qm: self.metrics.queue(name),
            markers: self.markers.clone(),
            group: self.group.clone(),
            background: self.background.clone(),
            shutdown: self.shutdown.clone(),
        });
        let leases = Arc::new(Leases::new(ctx.clone(), cache.clone(), LeaseTable::new(self.lease_memories.open(name))));
        let puts = Arc::new(Puts::new(
            ctx.clone(),
            cache.clone(),
            &Layout::new(&self.config.zookeeper.root),
            spec.idempotency_window,
        ));
        let parts = Parts {
            claims: Arc::new(Claims::new(ctx.clone(), cache.clone(), leases.clone())),
            browse: Browse::new(ctx.clone(), cache.clone()),
            ctx: ctx.clone(),
            cache: cache.clone(),
            puts: puts.clone(),
            leases: leases.clone(),
        };
        let (session, metrics, owner) = (self.session.clone(), self.metrics.clone(), format!("queue {name}"));
        self.tasks.spawn(supervise::until_shutdown(
            Task::CacheRefresher,
            owner.clone(),
            metrics.clone(),
            stop.clone(),
            {
                let (cache, session, stop) = (cache.clone(), session.clone(), stop.clone());
                let (lock_path, marker_dir) = (lock_path.clone(), self.markers.dir().to_owned());
                move || cache.clone().run(session.clone(), marker_dir.clone(), lock_path.clone(), stop.clone())
            },
        ));
        self.tasks.spawn(supervise::until_shutdown(Task::FleetMember, owner.clone(), metrics.clone(), stop.clone(), {
            let (cache, session, stop) = (cache.clone(), session.clone(), stop.clone());
            let dir = spec.members_path.clone();
            move || cache.clone().run_membership(session.clone(), dir.clone(), stop.clone())
        }));
        if !declared {
            // A dynamic queue follows its settings node (a declared one has its configuration).
            let resolve = {
                let config = self.config.clone();
                move |settings: QueueSettings| Current {
                    dead_letter: settings
                        .dead_letter
                        .as_ref()
                        .map(|target| Arc::new(dead_letter_of(&config, target, settings.max_deliveries))),
                    settings,
                }
            };
            let path = spec.settings_path.clone();
            let refused = self.metrics.settings_refused.clone();
            self.tasks.spawn(settings.clone().follow(
                session.clone(),
                path,
                name.clone(),
                resolve,
                refused,
                stop.clone(),
            ));
        }
        self.tasks.spawn(supervise::until_shutdown(Task::LeaseReaper, owner.clone(), metrics.clone(), stop.clone(), {
            let (leases, session, stop) = (leases.clone(), session.clone(), stop.clone());
            move || leases.clone().run_lease_reaper(session.clone(), stop.clone())
        }));
        if ctx.dead_letter.is_some() && kind != QueueKind::Simple {
            self.tasks.spawn(supervise::until_shutdown(
                Task::UndecodableMover,
                owner.clone(),
                metrics.clone(),
                stop.clone(),
                {
                    let (leases, stop) = (leases.clone(), stop.clone());
                    move || leases.clone().run_undecodable_mover(stop.clone())
                },
            ));
        }
        self.tasks.spawn(supervise::until_shutdown(
            Task::DeliveryCountSweeper,
            owner.clone(),
            metrics.clone(),
            stop.clone(),
            {
                let (leases, stop) = (leases.clone(), stop.clone());
                move || leases.clone().run_delivery_count_sweeper(stop.clone())
            },
        ));
        if !declared || spec.retention.is_some() {
            // A declared queue has a retention or never will; a dynamic one's settings may set one.
            let retention = Arc::new(Retention::new(ctx.clone(), cache.clone()));
            self.tasks.spawn(supervise::until_shutdown(
                Task::RetentionSweeper,
                owner.clone(),
                metrics.clone(),
                stop.clone(),
                {
                    let stop = stop.clone();
                    move || retention.clone().run(stop.clone())
                },
            ));
        }
        self.tasks.spawn(supervise::until_shutdown(Task::IdempotencySweeper, owner, metrics, stop.clone(), {
            let (puts, stop) = (puts.clone(), stop.clone());
            move || puts.clone().run_idempotency_sweeper(stop.clone())
        }));
        Ok(Arc::new(Queue::new(parts, stop)))
    }
}
