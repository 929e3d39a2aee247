//! Counters in this process's memory: the fallback while PostgreSQL is away.
//!
//! Same algorithms as the Postgres store (both follow [`crate::algorithm`]),
//! but per instance: N instances in fallback admit up to N × limit, unless
//! each enforces its share (`share` in [`MemoryStore::check_at`]). Each
//! state is held with the bucket's own parameters, so that what memory
//! admitted can be handed back to Postgres when it returns. The map
//! is bounded: when a shard is full, expired states are dropped first, then
//! those closest to expiry (they have the least left to protect), so a
//! flood of unique keys costs a bounded amount of memory and cannot push out
//! a busy key's fresh window before older ones.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use super::{
    from_us, to_us, Answer, BucketAnswer, BucketSpec, CheckBatch, Held, Key, Store, StoreError, StoreKind,
};
use crate::algorithm::{absorb, decide_all, Params, State};

const SHARDS: usize = 16;

#[derive(Debug)]
pub struct MemoryStore {
    shards: Vec<Mutex<HashMap<Key, (Params, State)>>>,
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

    /// Takes every state still in force, leaving the store empty.
    pub fn drain(&self, now: DateTime<Utc>) -> Vec<Held> {
        let now_us = to_us(now);
        let taken = self.shards.iter().flat_map(|s| std::mem::take(&mut *lock(s)));
        taken
            .filter(|(_, (_, state))| state.expires_us > now_us)
            .map(|(key, (params, state))| Held { key, params, state })
            .collect()
    }

    /// Puts back states taken by [`Self::drain`], folded into any the store
    /// took since, so that nothing admitted is lost.
    pub fn restore(&self, held: Vec<Held>, now: DateTime<Utc>) {
        let now_us = to_us(now);
        for Held { key, params, state } in held {
            let mut map = lock(&self.shards[shard_of(&key)]);
            let merged = match map.get(&key) {
                Some((_, current)) => absorb(params, Some(current), &state, now_us),
                None => Some(state),
            };
            if let Some(merged) = merged {
                insert_bounded(&mut map, key, (params, merged), now_us, self.per_shard);
            }
        }
    }

    /// Decides `batch` as of `now`, each bucket enforcing `ceil(limit /
    /// share)` (`share` 1: the whole limit). All shards a batch touches are
    /// locked in shard order, so the decision is atomic and concurrent
    /// batches cannot deadlock.
    pub fn check_at(&self, batch: &CheckBatch, now: DateTime<Utc>, share: u64) -> Answer {
        let now_us = to_us(now);
        let mut shard_ids: Vec<usize> = batch.buckets.iter().map(|b| shard_of(&b.key)).collect();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        let mut guards: Vec<_> = shard_ids.iter().map(|&i| lock(&self.shards[i])).collect();
        let slot = |key: &Key| position(&shard_ids, shard_of(key));

        let shared = |b: &BucketSpec| Params { limit: b.limit.div_ceil(share.max(1)), ..b.params() };
        let states: Vec<_> = batch
            .buckets
            .iter()
            .map(|b| (shared(b), guards[slot(&b.key)].get(&b.key).map(|(_, s)| s)))
            .collect();
        let joint = decide_all(&states, batch.cost, now_us);
        drop(states);
        let mut buckets = Vec::with_capacity(batch.buckets.len());
        for (b, verdict) in batch.buckets.iter().zip(joint.verdicts) {
            buckets.push(BucketAnswer {
                allowed: verdict.allowed,
                remaining: verdict.remaining,
                reset_at: from_us(verdict.full_us),
                retry_at: verdict.retry_us.map(from_us),
            });
            if joint.admitted {
                let held = (b.params(), verdict.next);
                insert_bounded(&mut guards[slot(&b.key)], b.key, held, now_us, self.per_shard);
            }
        }
        drop(guards);
        Answer { buckets, now, store: StoreKind::Memory, degraded: false }
    }
}

impl Store for MemoryStore {
    async fn check(&self, batch: &CheckBatch) -> Result<Answer, StoreError> {
        Ok(self.check_at(batch, Utc::now(), 1))
    }
}

type Shard = HashMap<Key, (Params, State)>;

fn insert_bounded(map: &mut Shard, key: Key, held: (Params, State), now_us: i64, cap: usize) {
    if map.len() >= cap && !map.contains_key(&key) {
        map.retain(|_, (_, s)| s.expires_us > now_us);
        if map.len() >= cap {
            evict_soonest(map, cap - cap / 10 - 1);
        }
    }
    map.insert(key, held);
}

/// Keeps the `keep` states that expire last.
fn evict_soonest(map: &mut Shard, keep: usize) {
    let mut expiries: Vec<i64> = map.values().map(|(_, s)| s.expires_us).collect();
    let cut = expiries.len().saturating_sub(keep);
    if cut == 0 {
        return;
    }
    let (_, threshold, _) = expiries.select_nth_unstable(cut - 1);
    let threshold = *threshold;
    map.retain(|_, (_, s)| s.expires_us > threshold);
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use chrono::{DateTime, TimeDelta, Utc};

    use super::MemoryStore;
    use crate::algorithm::Algorithm;
    use crate::storage::{BucketSpec, CheckBatch, MemoryFallback};

    fn bucket(name: &str, limit: u64, window_s: u64) -> BucketSpec {
        let mut key = [0u8; 32];
        key[..name.len()].copy_from_slice(name.as_bytes());
        let window = Duration::from_secs(window_s);
        BucketSpec { name: Arc::from(name), key, limit, window, algorithm: Algorithm::FixedWindow }
    }

    fn batch(buckets: &[BucketSpec], cost: u64) -> CheckBatch {
        CheckBatch { buckets: buckets.to_vec(), cost, fallback: MemoryFallback::Full }
    }

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).expect("valid time")
    }

    #[test]
    fn a_window_admits_its_limit_then_resets_after_its_length() {
        let store = MemoryStore::new(100);
        let b = [bucket("k", 3, 60)];
        let admitted = (0..5).filter(|_| store.check_at(&batch(&b, 1), t0(), 1).allowed()).count();
        assert_eq!(admitted, 3);
        let just_before = t0() + TimeDelta::seconds(59);
        assert!(!store.check_at(&batch(&b, 1), just_before, 1).allowed());
        let at_reset = t0() + TimeDelta::seconds(60);
        let checked = store.check_at(&batch(&b, 1), at_reset, 1);
        assert!(checked.allowed());
        assert_eq!(
            checked.buckets[0].reset_at,
            at_reset + TimeDelta::seconds(60),
            "the new window starts now"
        );
    }

    #[test]
    fn a_denied_batch_consumes_nothing_from_any_bucket() {
        let store = MemoryStore::new(100);
        let narrow = bucket("narrow", 1, 60);
        let wide = bucket("wide", 10, 60);
        assert!(store.check_at(&batch(&[narrow.clone(), wide.clone()], 1), t0(), 1).allowed());
        for _ in 0..5 {
            assert!(!store.check_at(&batch(&[narrow.clone(), wide.clone()], 1), t0(), 1).allowed());
        }
        let alone = store.check_at(&batch(&[wide], 0), t0(), 1);
        assert_eq!(alone.buckets[0].remaining, 9, "only the admitted check was counted");
    }

    #[test]
    fn a_peek_does_not_start_a_window() {
        let store = MemoryStore::new(100);
        let b = [bucket("k", 1, 60)];
        store.check_at(&batch(&b, 0), t0(), 1);
        let later = t0() + TimeDelta::seconds(30);
        let checked = store.check_at(&batch(&b, 1), later, 1);
        assert_eq!(
            checked.buckets[0].reset_at,
            later + TimeDelta::seconds(60),
            "the window starts at the admitted check"
        );
    }

    #[test]
    fn a_share_of_the_limit_is_enforced_and_the_whole_limit_is_kept() {
        let store = MemoryStore::new(100);
        let b = [bucket("k", 5, 60)];
        let admitted = (0..5).filter(|_| store.check_at(&batch(&b, 1), t0(), 3).allowed()).count();
        assert_eq!(admitted, 2, "ceil(5 / 3)");
        let held = store.drain(t0());
        assert_eq!((held.len(), held[0].params.limit, held[0].state.count), (1, 5, 2));
        assert!(store.is_empty(), "drained");
        store.check_at(&batch(&b, 1), t0(), 1);
        store.restore(held, t0());
        let peek = store.check_at(&batch(&b, 0), t0(), 1);
        assert_eq!(peek.buckets[0].remaining, 2, "what was restored joins what came since");
    }

    #[test]
    fn a_flood_of_unique_keys_stays_within_capacity() {
        let store = MemoryStore::new(1_000);
        for n in 0..50_000u32 {
            let mut b = bucket("", 5, 60);
            b.key[..4].copy_from_slice(&n.to_be_bytes());
            b.key[4] = (n % 251) as u8; // spread over the shards
            store.check_at(&batch(&[b], 1), t0(), 1);
        }
        assert!(store.len() <= 1_000 + 16, "held {} keys", store.len());
    }

    #[test]
    fn when_full_the_windows_closest_to_reset_are_evicted_first() {
        let store = MemoryStore::new(16 * 4); // 4 per shard
        let mut keys = Vec::new();
        for n in 0..8u8 {
            let mut b = bucket("", 1, 60 + u64::from(n));
            b.key[0] = 0; // all in one shard
            b.key[1] = n;
            store.check_at(&batch(&[b.clone()], 1), t0(), 1);
            keys.push(b);
        }
        // The key with the longest window (reset last) is still counted.
        assert!(!store.check_at(&batch(&[keys[7].clone()], 1), t0(), 1).allowed());
    }
}
