//! A check across workers: split into one part per worker, and the parts'
//! answers merged back into one.

use super::Routes;
use crate::storage::{Answer, Check, StoreKind};

/// The buckets of one check whose shards are on one worker, decided together.
pub(in crate::storage::postgres) struct WorkerCheck {
    /// The worker (Citus group id) as last read; chooses the lane.
    pub worker: i32,
    pub batch: Check,
    /// Where each of `batch`'s buckets is in the whole check.
    pub positions: Vec<usize>,
}

/// Splits `batch` by worker, keeping the buckets' order within each part.
/// A check on one worker (or with no bucket) is one part.
pub(in crate::storage::postgres) fn split(routes: &Routes, batch: &Check) -> Vec<WorkerCheck> {
    let mut parts: Vec<WorkerCheck> = Vec::new();
    for (position, bucket) in batch.buckets.iter().enumerate() {
        let worker = routes.worker(&bucket.key);
        let part = match parts.iter().position(|p| p.worker == worker) {
            Some(i) => &mut parts[i],
            None => {
                let empty = Check { buckets: Vec::new(), ..batch.clone() };
                parts.push(WorkerCheck { worker, batch: empty, positions: Vec::new() });
                let last = parts.len() - 1;
                &mut parts[last]
            }
        };
        part.batch.buckets.push(bucket.clone());
        part.positions.push(position);
    }
    if parts.is_empty() {
        parts.push(WorkerCheck { worker: 0, batch: batch.clone(), positions: Vec::new() });
    }
    parts
}

/// The whole check's answer from its parts' answers, in the check's bucket
/// order. A part that was given back shows what it has left after the refund.
pub(in crate::storage::postgres) fn merge(
    batch: &Check,
    parts: &[WorkerCheck],
    answers: Vec<Answer>,
    refunded: &[bool],
) -> Answer {
    let now = answers.iter().map(|a| a.now).max().unwrap_or_else(chrono::Utc::now);
    // The parts ran at once: the check waited for the one that took longest.
    let timing = answers.iter().filter_map(|a| a.timing).max_by_key(|t| t.queued + t.call);
    let mut buckets = vec![None; batch.buckets.len()];
    for ((part, answer), &given_back) in parts.iter().zip(answers).zip(refunded) {
        for ((&position, mut bucket), spec) in
            part.positions.iter().zip(answer.buckets).zip(&part.batch.buckets)
        {
            if given_back {
                bucket.remaining = (bucket.remaining + batch.cost).min(spec.limit);
            }
            buckets[position] = Some(bucket);
        }
    }
    let buckets = buckets.into_iter().flatten().collect();
    Answer { buckets, now, store: StoreKind::Postgres, degraded: false, cached: false, timing }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::Algorithm;
    use crate::storage::{BucketAnswer, BucketSpec, MemoryFallback};

    /// Two slots: route 10 on worker 1, route 20 on worker 2.
    fn routes() -> Routes {
        Routes::for_tests(vec![10, 20], vec![1, 2])
    }

    fn bucket(second_byte: u8) -> BucketSpec {
        let mut key = [0; 32];
        key[1] = second_byte;
        BucketSpec {
            name: format!("b{second_byte}").into(),
            key,
            limit: 5,
            window: Duration::from_secs(60),
            algorithm: Algorithm::FixedWindow,
            lockout: None,
            calendar: None,
        }
    }

    fn check(seconds: &[u8]) -> Check {
        let buckets = seconds.iter().map(|&f| bucket(f)).collect();
        Check { buckets, cost: 2, fallback: MemoryFallback::Refuse, lease: None }
    }

    fn answer(n: usize, remaining: u64) -> Answer {
        let now = chrono::Utc::now();
        let bucket = BucketAnswer { allowed: true, remaining, reset_at: now, retry_at: None, blocked: false };
        let (store, timing) = (StoreKind::Postgres, None);
        Answer { buckets: vec![bucket; n], now, store, degraded: false, cached: false, timing }
    }

    #[test]
    fn buckets_on_one_worker_stay_one_part_in_their_order() {
        let parts = split(&routes(), &check(&[0, 2, 4]));
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].worker, 1);
        assert_eq!(parts[0].positions, vec![0, 1, 2]);
    }

    #[test]
    fn buckets_on_two_workers_become_two_parts_merged_back_in_place() {
        let batch = check(&[0, 1, 2]);
        let parts = split(&routes(), &batch);
        assert_eq!((parts[0].worker, parts[1].worker), (1, 2));
        assert_eq!((parts[0].positions.clone(), parts[1].positions.clone()), (vec![0, 2], vec![1]));
        let merged = merge(&batch, &parts, vec![answer(2, 1), answer(1, 3)], &[true, false]);
        let remaining: Vec<u64> = merged.buckets.iter().map(|b| b.remaining).collect();
        // The refunded part gets its cost (2) back, up to the limit (5).
        assert_eq!(remaining, vec![3, 3, 3]);
    }
}
