//! Single claims of one queue that are ready at the same time share one round trip.
//!
//! Sixteen consumers taking one message each from a deep queue would otherwise send sixteen
//! reads and sixteen transactions, each its own round trip to ZooKeeper and its own wake-ups
//! through the client's session task. Instead, while one claim is on its way, the claims that
//! become ready join a crowd; when it returns, its leader hands the lead to the crowd's first
//! member, which claims every waiting candidate of its kind with its own in ONE multi-read and
//! ONE transaction (`claim.rs`, the `?max=` pipeline). The deliveries go to the crowd in the
//! order it arrived; a member left without one (its candidate lost to another consumer, or too
//! large to share the transaction) tries its next candidate, as a single claim that lost would.
//!
//! Alone, a claim leads at once and pays nothing: no task, no wait. The lead passes on from task
//! to task (never to a task of its own), and a leader that ends in any way passes it on (its
//! guard's `Drop`), so the crowd never waits for a leader that is gone.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::{Acquire, Caller, Claims, Delivery};
use crate::queue::QueueError;
use crate::queue::names::ItemName;
use crate::zk::{Zk, ZkError};

/// At most this many single claims share a transaction (with the leader's own); the rest wait for
/// the next. A claim's operations are small (a take's delete, a lease's lock and count); the
/// transaction's byte limit is kept by the claim itself.
const MAX_SHARED: usize = 64;

/// The single claims of one queue waiting for a leader.
#[derive(Default)]
pub(super) struct Crew {
    crowd: Mutex<Crowd>,
}

#[derive(Default)]
struct Crowd {
    /// A claim is on its way; claims that become ready wait for its leader's hand-off.
    leading: bool,
    riders: VecDeque<Rider>,
}

/// A single claim waiting in the crowd: its candidate and where its turn comes.
struct Rider {
    how: Acquire,
    candidate: ItemName,
    turn: oneshot::Sender<Turn>,
}

enum Turn {
    /// A leader claimed for it: a delivery, none (try the next candidate), or the claim's error.
    Answered(Result<Option<Box<Delivery>>, QueueError>),
    /// It leads the next shared claim.
    Lead,
}

impl Crew {
    fn crowd(&self) -> MutexGuard<'_, Crowd> {
        self.crowd.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The lead of a crew, held while a shared claim is on its way; passed on as it drops.
struct Lead<'c> {
    claims: &'c Claims,
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        let mut crowd = self.claims.crew.crowd();
        while let Some(rider) = crowd.riders.pop_front() {
            match rider.turn.send(Turn::Lead) {
                Ok(()) => return,
                // Its task is gone (the runtime is stopping): its candidate goes back.
                Err(_) => self.claims.give_back(vec![rider.candidate]),
            }
        }
        crowd.leading = false;
    }
}

impl Claims {
    /// Claims `candidate`, alone or with the single claims ready at the same time (see the
    /// module): a delivery, none when it was not claimed (the caller tries its next candidate),
    /// or the claim's error.
    pub(super) async fn claim_one(
        self: &Arc<Self>,
        zk: &Zk,
        candidate: ItemName,
        how: Acquire,
        caller: &Caller,
    ) -> Result<Option<Delivery>, QueueError> {
        let waiting = {
            let mut crowd = self.crew.crowd();
            if crowd.leading {
                let (turn, waiting) = oneshot::channel();
                crowd.riders.push_back(Rider { how, candidate: candidate.clone(), turn });
                Some(waiting)
            } else {
                crowd.leading = true;
                None
            }
        };
        let zk = match waiting {
            None => zk.clone(),
            Some(waiting) => match waiting.await {
                Ok(Turn::Answered(answer)) => return answer.map(|delivery| delivery.map(|boxed| *boxed)),
                // Its wait took some of the request's time: the claim gets a fresh deadline.
                Ok(Turn::Lead) => match self.ctx.session.current() {
                    Some(zk) => zk.with_deadline(tokio::time::Instant::now() + self.ctx.session.request_timeout()),
                    None => {
                        let _lead = Lead { claims: self };
                        self.give_back(vec![candidate]);
                        return Err(ZkError::Unavailable.into());
                    },
                },
                // The crew went away with the runtime.
                Err(_) => return Err(QueueError::ShuttingDown),
            },
        };
        let lead = Lead { claims: self };
        let riders: Vec<Rider> = {
            let mut crowd = self.crew.crowd();
            let (mut mine, mut others) = (Vec::new(), VecDeque::new());
            while let Some(rider) = crowd.riders.pop_front() {
                if mine.len() < MAX_SHARED - 1 && rider.how == how {
                    mine.push(rider);
                } else {
                    others.push_back(rider);
                }
            }
            crowd.riders = others;
            mine
        };
        let candidates = std::iter::once(candidate).chain(riders.iter().map(|rider| rider.candidate.clone())).collect();
        // Alone, a claim stops retrying once its caller left; shared, it claims for the others too.
        let alone = riders.is_empty();
        let abandoned = || alone && caller.is_closed();
        let claimed = Box::pin(self.claim_now(&zk, candidates, usize::MAX, how, &abandoned)).await;
        drop(lead);
        match claimed {
            Ok(delivered) => {
                let mut delivered = delivered.into_iter();
                let mine = delivered.next();
                for rider in riders {
                    if let Err(Turn::Answered(Ok(Some(delivery)))) =
                        rider.turn.send(Turn::Answered(Ok(delivered.next().map(Box::new))))
                    {
                        self.give_back_delivery(*delivery).await;
                    }
                }
                Ok(mine)
            },
            Err(err) => {
                for rider in riders {
                    let _ = rider.turn.send(Turn::Answered(Err(err.clone())));
                }
                Err(err)
            },
        }
    }
}
