//! Counters in this process's memory: the fallback while PostgreSQL is away.
//!
//! Same algorithms as the Postgres store (both follow [`crate::algorithm`]),
//! but per instance: N instances in fallback admit up to N × limit, unless
//! each enforces its share (`share` in [`MemoryStore::check_at`]). Beside
//! the state that decisions read, each key keeps what it *owes*: what was
//! admitted since the last write-back, in the full limit's units, so that
//! it can be handed to Postgres when Postgres returns while decisions go on
//! unchanged. The map
//! is bounded: when a shard is full, expired states are dropped first, then
//! those closest to expiry (they have the least left to protect), so a
//! flood of unique keys costs a bounded amount of memory and cannot push out
//! a busy key's fresh window before older ones.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use super::{
    from_us, to_us, Answer, BucketAnswer, BucketSpec, Check, Held, InspectStore, Inspection, Key, Store,
    StoreError, StoreKind, Stored,
};
use crate::algorithm::{absorb, decide, decide_all, Params, State};

#[cfg(test)]
mod tests;

const SHARDS: usize = 16;

#[derive(Debug)]
pub struct MemoryStore {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
}

type Shard = HashMap<Key, Entry>;

/// One key: what decisions read, and what is owed to Postgres.
#[derive(Debug)]
struct Entry {
    /// The bucket's parameters, with its whole limit.
    params: Params,
    /// Admissions at this instance's share of the limit.
    state: State,
    /// Admitted since the last write-back, at the whole limit's units (a
    /// token bucket's token is the full bucket's).
    owed: Option<State>,
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

    /// Takes what every key owes Postgres and is still in force; decisions
    /// are unchanged.
    pub fn drain(&self, now: DateTime<Utc>) -> Vec<Held> {
        let now_us = to_us(now);
        let mut held = Vec::new();
        for shard in &self.shards {
            for (key, entry) in lock(shard).iter_mut() {
                let owed = entry.owed.take().filter(|s| s.expires_us > now_us);
                held.extend(owed.map(|state| Held { key: *key, params: entry.params, state }));
            }
        }
        held
    }

    /// Gives back what [`Self::drain`] took and Postgres did not take,
    /// folded into what was admitted since, so that nothing is lost.
    pub fn restore(&self, held: Vec<Held>, now: DateTime<Utc>) {
        let now_us = to_us(now);
        for Held { key, params, state } in held {
            let mut map = lock(&self.shards[shard_of(&key)]);
            match map.get_mut(&key) {
                Some(entry) => entry.owed = absorb(params, entry.owed.as_ref(), &state, now_us),
                None => {
                    let entry = Entry { params, state: state.clone(), owed: Some(state) };
                    insert_bounded(&mut map, key, entry, now_us, self.per_shard);
                }
            }
        }
    }

    /// Forgets every decision and debt: Postgres holds them now.
    pub fn clear(&self) {
        self.shards.iter().for_each(|s| lock(s).clear());
    }

    /// Whether any key owes Postgres anything.
    pub fn owes(&self) -> bool {
        self.shards.iter().any(|s| lock(s).values().any(|e| e.owed.is_some()))
    }

    /// The state each bucket of `check` holds here, in its order; reads only.
    pub fn states(&self, check: &Check) -> Vec<Option<State>> {
        let held = |b: &BucketSpec| lock(&self.shards[shard_of(&b.key)]).get(&b.key).map(|e| e.state.clone());
        check.buckets.iter().map(held).collect()
    }

    /// Decides `check` as of `now`, each bucket enforcing `ceil(limit /
    /// share)` (`share` 1: the whole limit). All shards a batch touches are
    /// locked in shard order, so the decision is atomic and concurrent
    /// batches cannot deadlock.
    pub fn check_at(&self, check: &Check, now: DateTime<Utc>, share: u64) -> Answer {
        let now_us = to_us(now);
        let mut shard_ids: Vec<usize> = check.buckets.iter().map(|b| shard_of(&b.key)).collect();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        let mut guards: Vec<_> = shard_ids.iter().map(|&i| lock(&self.shards[i])).collect();
        let slot = |key: &Key| position(&shard_ids, shard_of(key));

        let shared = |b: &BucketSpec| Params { limit: b.limit.div_ceil(share.max(1)), ..b.params() };
        let states: Vec<_> = check
            .buckets
            .iter()
            .map(|b| (shared(b), guards[slot(&b.key)].get(&b.key).map(|e| &e.state)))
            .collect();
        let joint = decide_all(&states, check.cost, now_us);
        drop(states);
        let mut buckets = Vec::with_capacity(check.buckets.len());
        for (b, verdict) in check.buckets.iter().zip(joint.verdicts) {
            buckets.push(BucketAnswer {
                allowed: verdict.allowed,
                remaining: verdict.remaining,
                reset_at: from_us(verdict.full_us),
                retry_at: verdict.retry_us.map(from_us),
                blocked: false,
            });
            if joint.admitted {
                record(&mut guards[slot(&b.key)], b, verdict.next, check.cost, now_us, self.per_shard);
            }
        }
        drop(guards);
        Answer { buckets, now, store: StoreKind::Memory, degraded: false, cached: false, timing: None }
    }
}

/// Stores an admission: the decided state, and the cost added to what the
/// key owes, at the whole limit's units.
fn record(map: &mut Shard, b: &BucketSpec, state: State, cost: u64, now_us: i64, cap: usize) {
    let params = b.params();
    let owed_before = map.get_mut(&b.key).and_then(|e| e.owed.take());
    let owed = decide(params, owed_before.as_ref(), cost, now_us, true).next;
    insert_bounded(map, b.key, Entry { params, state, owed: Some(owed) }, now_us, cap);
}

impl Store for MemoryStore {
    async fn check(&self, check: &Check) -> Result<Answer, StoreError> {
        Ok(self.check_at(check, Utc::now(), 1))
    }
}

impl InspectStore for MemoryStore {
    async fn inspect(&self, check: &Check) -> Result<Inspection, StoreError> {
        Ok(self.inspection(check, 1))
    }
}

impl MemoryStore {
    /// What [`InspectStore::inspect`] answers for this instance's memory,
    /// where each bucket enforces `ceil(limit / share)`.
    pub fn inspection(&self, check: &Check, share: u64) -> Inspection {
        let buckets = self.states(check).into_iter().map(|state| Stored { state, block: None }).collect();
        Inspection {
            now: Utc::now(),
            store: StoreKind::Memory,
            degraded: false,
            share,
            buckets,
            blocks_known: false,
            remembered_until: None,
        }
    }
}

fn insert_bounded(map: &mut Shard, key: Key, entry: Entry, now_us: i64, cap: usize) {
    if map.len() >= cap && !map.contains_key(&key) {
        map.retain(|_, e| e.state.expires_us > now_us);
        if map.len() >= cap {
            evict_soonest(map, cap - cap / 10 - 1);
        }
    }
    map.insert(key, entry);
}

/// Keeps the `keep` states that expire last.
fn evict_soonest(map: &mut Shard, keep: usize) {
    let mut expiries: Vec<i64> = map.values().map(|e| e.state.expires_us).collect();
    let cut = expiries.len().saturating_sub(keep);
    if cut == 0 {
        return;
    }
    let (_, threshold, _) = expiries.select_nth_unstable(cut - 1);
    let threshold = *threshold;
    map.retain(|_, e| e.state.expires_us > threshold);
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
