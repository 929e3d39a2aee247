//! Which statements decide a worker's batch.

use std::time::Duration;

use super::*;
use crate::algorithm::Algorithm;
use crate::storage::{BucketSpec, MemoryFallback};

/// Three slots: routes 10 and 30 on worker 1, route 20 on worker 2; a key's
/// slot is its second byte modulo 3.
fn routes() -> Routes {
    Routes::for_tests(vec![10, 20, 30], vec![1, 2, 1])
}

fn bucket(second_byte: u8, algorithm: Algorithm) -> BucketSpec {
    let mut key = [0; 32];
    key[1] = second_byte;
    let (name, window) = (format!("b{second_byte}").into(), Duration::from_secs(60));
    BucketSpec { name, key, limit: 5, window, algorithm, lockout: None, calendar: None }
}

fn check(buckets: Vec<BucketSpec>) -> CheckBatch {
    CheckBatch { buckets, cost: 1, fallback: MemoryFallback::Refuse, lease: None }
}

fn fixed(second_byte: u8) -> CheckBatch {
    check(vec![bucket(second_byte, Algorithm::FixedWindow)])
}

fn decided_by(batches: &[CheckBatch], direct: Option<i32>) -> Vec<(&'static str, Vec<usize>)> {
    let batches: Vec<&CheckBatch> = batches.iter().collect();
    let statements = statements_of(&routes(), &batches, (0..batches.len()).collect(), direct);
    let named = |s: Statement| match s {
        Statement::Upsert(members, Road::HotKeys) => ("hot upsert", members),
        Statement::Upsert(members, _) => ("upsert", members),
        Statement::Node(members) => ("node", members),
    };
    statements.into_iter().map(named).collect()
}

#[test]
fn one_bucket_checks_on_the_connected_worker_take_one_upsert_per_route() {
    let batches = [fixed(0), fixed(2), fixed(3), fixed(5)];
    let expected = vec![("upsert", vec![0, 2]), ("upsert", vec![1, 3])];
    assert_eq!(decided_by(&batches, Some(1)), expected, "routes 10 (slot 0) and 30 (slot 2)");
}

#[test]
fn a_batch_with_any_other_check_goes_whole_to_the_route_function() {
    let token = check(vec![bucket(3, Algorithm::TokenBucket)]);
    let policy = check(vec![bucket(0, Algorithm::FixedWindow), bucket(2, Algorithm::FixedWindow)]);
    for other in [token, policy] {
        let batches = [fixed(0), other, fixed(5)];
        assert_eq!(decided_by(&batches, Some(1)), vec![("node", vec![0, 1, 2])]);
    }
}

#[test]
fn a_key_twice_takes_its_routes_hot_upsert_and_the_other_routes_theirs() {
    let expected = vec![("hot upsert", vec![0, 1]), ("upsert", vec![2])];
    assert_eq!(decided_by(&[fixed(0), fixed(0), fixed(2)], Some(1)), expected);
}

#[test]
fn a_key_twice_with_other_limits_goes_to_the_route_function_which_decides_them_in_turn() {
    let mut other = fixed(0);
    other.buckets[0].limit = 6;
    assert_eq!(decided_by(&[fixed(0), other, fixed(2)], Some(1)), vec![("node", vec![0, 1, 2])]);
}

#[test]
fn through_the_coordinator_or_off_its_worker_a_check_takes_the_route_function() {
    assert_eq!(decided_by(&[fixed(0)], None), vec![("node", vec![0])], "through the coordinator");
    assert_eq!(decided_by(&[fixed(1)], Some(1)), vec![("node", vec![0])], "a key of worker 2");
}
