//! A check across routes: split into one part per route, and the parts'
//! answers merged back into one.

use super::Routes;
use crate::storage::{Answer, CheckBatch, StoreKind};

/// The buckets of one check that share a route, decided together on its shard.
pub(in crate::storage::postgres) struct Part {
    /// Chooses the lane (the same for every check on this route).
    pub slot: usize,
    pub route: i32,
    pub batch: CheckBatch,
    /// Where each of `batch`'s buckets is in the whole check.
    pub positions: Vec<usize>,
}

/// Splits `batch` by route, keeping the buckets' order within each part.
/// A check with one route (or none) is one part.
pub(in crate::storage::postgres) fn split(routes: &Routes, batch: &CheckBatch) -> Vec<Part> {
    let mut parts: Vec<Part> = Vec::new();
    for (position, bucket) in batch.buckets.iter().enumerate() {
        let route = routes.of(&bucket.key);
        let part = match parts.iter_mut().find(|p| p.route == route) {
            Some(part) => part,
            None => {
                let empty = CheckBatch { buckets: Vec::new(), ..batch.clone() };
                let slot = routes.slot(&bucket.key);
                parts.push(Part { slot, route, batch: empty, positions: Vec::new() });
                parts.last_mut().expect("just pushed")
            }
        };
        part.batch.buckets.push(bucket.clone());
        part.positions.push(position);
    }
    if parts.is_empty() {
        parts.push(Part { slot: 0, route: routes.all()[0], batch: batch.clone(), positions: Vec::new() });
    }
    parts
}

/// The whole check's answer from its parts' answers, in the check's bucket
/// order. A part that was given back shows what it has left after the refund.
pub(in crate::storage::postgres) fn merge(
    batch: &CheckBatch,
    parts: &[Part],
    answers: Vec<Answer>,
    refunded: &[bool],
) -> Answer {
    let now = answers.iter().map(|a| a.now).max().unwrap_or_else(chrono::Utc::now);
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
    Answer { buckets, now, store: StoreKind::Postgres, degraded: false, cached: false }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::Algorithm;
    use crate::storage::{BucketAnswer, BucketSpec, MemoryFallback};

    fn bucket(first: u8) -> BucketSpec {
        let mut key = [0; 32];
        key[1] = first;
        BucketSpec {
            name: format!("b{first}").into(),
            key,
            limit: 5,
            window: Duration::from_secs(60),
            algorithm: Algorithm::FixedWindow,
            lockout: None,
        }
    }

    fn check(firsts: &[u8]) -> CheckBatch {
        let buckets = firsts.iter().map(|&f| bucket(f)).collect();
        CheckBatch { buckets, cost: 2, fallback: MemoryFallback::Refuse }
    }

    fn answer(n: usize, remaining: u64) -> Answer {
        let now = chrono::Utc::now();
        let bucket = BucketAnswer { allowed: true, remaining, reset_at: now, retry_at: None, blocked: false };
        Answer { buckets: vec![bucket; n], now, store: StoreKind::Postgres, degraded: false, cached: false }
    }

    #[test]
    fn buckets_on_one_route_stay_one_part_in_their_order() {
        let routes = Routes { routes: vec![10, 20] };
        let parts = split(&routes, &check(&[0, 2, 4]));
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].route, 10);
        assert_eq!(parts[0].positions, vec![0, 1, 2]);
    }

    #[test]
    fn buckets_on_two_routes_become_two_parts_merged_back_in_place() {
        let routes = Routes { routes: vec![10, 20] };
        let batch = check(&[0, 1, 2]);
        let parts = split(&routes, &batch);
        assert_eq!((parts[0].route, parts[1].route), (10, 20));
        assert_eq!((parts[0].positions.clone(), parts[1].positions.clone()), (vec![0, 2], vec![1]));
        let merged = merge(&batch, &parts, vec![answer(2, 1), answer(1, 3)], &[true, false]);
        let remaining: Vec<u64> = merged.buckets.iter().map(|b| b.remaining).collect();
        // The refunded part gets its cost (2) back, up to the limit (5).
        assert_eq!(remaining, vec![3, 3, 3]);
    }
}
