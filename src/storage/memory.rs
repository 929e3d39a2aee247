//! Counters in this process's memory: the fallback while PostgreSQL is away.
//!
//! Same semantics as the Postgres store, but per instance: N instances in
//! fallback admit up to N × limit. The map is bounded: when a shard is full,
//! expired windows are dropped first, then the windows closest to their reset
//! (they have the least left to protect), so a flood of unique keys costs a
//! bounded amount of memory and cannot push out a busy key's fresh window
//! before older ones.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use super::{window_end, BucketState, CheckBatch, Checked, Key, Store, StoreError, StoreKind};

const SHARDS: usize = 16;

#[derive(Debug, Clone, Copy)]
struct Window {
    count: u64,
    reset_at: DateTime<Utc>,
}

#[derive(Debug)]
pub struct MemoryStore {
    shards: Vec<Mutex<HashMap<Key, Window>>>,
    per_shard: usize,
}

impl MemoryStore {
    /// A store that holds at most about `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        let shards = (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect();
        Self { shards, per_shard }
    }

    /// Number of keys held (expired ones included until they are evicted).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides `batch` as of `now`. All shards a batch touches are locked in
    /// shard order, so the decision is atomic and concurrent batches cannot deadlock.
    pub fn check_at(&self, batch: &CheckBatch, now: DateTime<Utc>) -> Checked {
        let mut shard_ids: Vec<usize> = batch.buckets.iter().map(|b| shard_of(&b.key)).collect();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        let mut guards: Vec<_> = shard_ids.iter().map(|&i| (i, lock(&self.shards[i]))).collect();

        let current: Vec<Window> = batch
            .buckets
            .iter()
            .map(|b| {
                let map = &guards[position(&shard_ids, shard_of(&b.key))].1;
                effective(map.get(&b.key).copied(), now, b.window)
            })
            .collect();
        let admit =
            batch.cost > 0 && batch.buckets.iter().zip(&current).all(|(b, w)| fits(w, batch.cost, b.limit));

        let states = batch.buckets.iter().zip(&current).map(|(b, w)| {
            let mut w = *w;
            if admit {
                w.count += batch.cost;
                let map = &mut guards[position(&shard_ids, shard_of(&b.key))].1;
                insert_bounded(map, b.key, w, now, self.per_shard);
            }
            BucketState {
                allowed: fits(&w, if admit { 0 } else { batch.cost }, b.limit),
                count: w.count,
                reset_at: w.reset_at,
            }
        });
        let buckets = states.collect();
        drop(guards);
        Checked { buckets, now, store: StoreKind::Memory, degraded: false }
    }
}

impl Store for MemoryStore {
    async fn check(&self, batch: &CheckBatch) -> Result<Checked, StoreError> {
        Ok(self.check_at(batch, Utc::now()))
    }

    async fn probe(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The window as a check at `now` sees it: an expired or missing one is empty
/// and would start now.
fn effective(stored: Option<Window>, now: DateTime<Utc>, window: std::time::Duration) -> Window {
    match stored {
        Some(w) if w.reset_at > now => w,
        _ => Window { count: 0, reset_at: window_end(now, window) },
    }
}

fn fits(w: &Window, cost: u64, limit: u64) -> bool {
    w.count.saturating_add(cost) <= limit
}

fn insert_bounded(map: &mut HashMap<Key, Window>, key: Key, w: Window, now: DateTime<Utc>, cap: usize) {
    if map.len() >= cap && !map.contains_key(&key) {
        map.retain(|_, w| w.reset_at > now);
        if map.len() >= cap {
            evict_soonest(map, cap - cap / 10 - 1);
        }
    }
    map.insert(key, w);
}

/// Keeps the `keep` windows that reset last.
fn evict_soonest(map: &mut HashMap<Key, Window>, keep: usize) {
    let mut resets: Vec<DateTime<Utc>> = map.values().map(|w| w.reset_at).collect();
    let cut = resets.len().saturating_sub(keep);
    if cut == 0 {
        return;
    }
    let (_, threshold, _) = resets.select_nth_unstable(cut - 1);
    let threshold = *threshold;
    map.retain(|_, w| w.reset_at > threshold);
}

fn shard_of(key: &Key) -> usize {
    usize::from(key[0]) % SHARDS
}

fn position(ids: &[usize], id: usize) -> usize {
    ids.binary_search(&id).unwrap_or(0)
}

/// A poisoned shard only means another thread panicked mid-update of plain
/// counters; the data is still usable, so carry on rather than fail checks.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
