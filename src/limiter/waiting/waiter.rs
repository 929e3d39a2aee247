//! One key's queue of held requests, and a held request's place in a queue:
//! entered at the back, moved to the back of another key's queue when a
//! recheck shows it waits on another bucket, left when it is answered.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::queues::{lock, Queues};
use crate::storage::Key;
use crate::telemetry;

/// Every key with requests held on it, and its queue.
pub(super) type ByKey = HashMap<Key, Arc<Queue>>;

/// The waiters on one key, first come first.
pub(super) struct Queue {
    order: Mutex<VecDeque<u64>>,
    /// Bumped when the front changes or the key is woken.
    changed: watch::Sender<u64>,
}

impl Queue {
    fn new() -> Arc<Self> {
        let (changed, _) = watch::channel(0);
        Arc::new(Self { order: Mutex::default(), changed })
    }

    /// Its first waiter looks again.
    pub(super) fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub(super) fn len(&self) -> usize {
        lock(&self.order).len()
    }
}

/// A held request's place in its key's queue; leaving (dropping it) lets
/// the next one recheck.
pub struct Waiter<'w> {
    queues: &'w Queues,
    key: Key,
    ticket: u64,
    queue: Arc<Queue>,
    pub changed: watch::Receiver<u64>,
    pub closing: watch::Receiver<bool>,
}

impl<'w> Waiter<'w> {
    /// A place at the back of `key`'s queue, which has room for it
    /// ([`Queues::has_room`]); it is counted as held already.
    pub(super) fn join(queues: &'w Queues, by_key: &mut ByKey, key: Key, ticket: u64) -> Self {
        let queue = join(by_key, key, ticket);
        let (changed, closing) = (queue.changed.subscribe(), queues.closing.subscribe());
        Self { queues, key, ticket, queue, changed, closing }
    }

    /// The key whose queue it is in: the bucket it waits on.
    pub fn key(&self) -> Key {
        self.key
    }

    /// First in its queue: the one that rechecks.
    pub fn is_first(&self) -> bool {
        lock(&self.queue.order).front() == Some(&self.ticket)
    }

    /// To the back of `key`'s queue, as a recheck showed it waits on that
    /// bucket now (so it holds no queue another bucket keeps it out of);
    /// false, and it stays where it is, when that queue holds its key's share.
    pub fn move_to(&mut self, key: Key) -> bool {
        if key == self.key {
            return true;
        }
        let mut by_key = self.queues.lock();
        if !self.queues.has_room(&by_key, &key) {
            return false;
        }
        leave(&mut by_key, self.key, &self.queue, self.ticket);
        self.queue = join(&mut by_key, key, self.ticket);
        self.changed = self.queue.changed.subscribe();
        self.key = key;
        true
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        leave(&mut self.queues.lock(), self.key, &self.queue, self.ticket);
        let held = self.queues.held.fetch_sub(1, Ordering::AcqRel) - 1;
        telemetry::waiting(held);
    }
}

/// Puts `ticket` at the back of `key`'s queue, made if need be.
fn join(queues: &mut ByKey, key: Key, ticket: u64) -> Arc<Queue> {
    let queue = Arc::clone(queues.entry(key).or_insert_with(Queue::new));
    lock(&queue.order).push_back(ticket);
    queue
}

/// Takes `ticket` out of `key`'s queue: the queue is forgotten once empty,
/// and its new first rechecks when `ticket` was first.
fn leave(queues: &mut ByKey, key: Key, queue: &Queue, ticket: u64) {
    let mut order = lock(&queue.order);
    let was_first = order.front() == Some(&ticket);
    order.retain(|t| *t != ticket);
    if order.is_empty() {
        queues.remove(&key);
    } else if was_first {
        queue.bump();
    }
}
