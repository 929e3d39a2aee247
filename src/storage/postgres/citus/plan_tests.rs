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

fn check(buckets: Vec<BucketSpec>) -> Check {
    Check { buckets, cost: 1, fallback: MemoryFallback::Refuse, lease: None }
}

fn fixed(second_byte: u8) -> Check {
    check(vec![bucket(second_byte, Algorithm::FixedWindow)])
}

fn decided_by(batches: &[Check], direct: Option<i32>) -> Vec<(&'static str, Vec<Vec<usize>>)> {
    decided_on(&routes(), batches, direct)
}

fn decided_on(
    routes: &Routes,
    batches: &[Check],
    direct: Option<i32>,
) -> Vec<(&'static str, Vec<Vec<usize>>)> {
    let batches: Vec<&Check> = batches.iter().collect();
    // Each segment's checks (one bucket each, but in the policy tests below).
    let checks =
        |segments: Vec<Segment>| segments.into_iter().map(|s| s.into_iter().map(|(i, _)| i).collect());
    let named = |statement| match statement {
        Statement::Upsert(_, Shards::All, segments, Upsert::HotKeys) => {
            ("hot upsert", checks(segments).collect())
        }
        Statement::Upsert(_, Shards::All, segments, Upsert::Policy) => {
            ("policy upsert", checks(segments).collect())
        }
        Statement::Upsert(_, Shards::All, segments, _) => ("upsert", checks(segments).collect()),
        Statement::Upsert(_, Shards::One(_), segments, _) => ("a shard's upsert", checks(segments).collect()),
        Statement::Node(members) => ("node", vec![members]),
    };
    statements_of(routes, &batches, (0..batches.len()).collect(), direct).into_iter().map(named).collect()
}

#[test]
fn one_bucket_checks_on_the_connected_worker_take_one_statement_a_segment_per_route() {
    let batches = [fixed(2), fixed(0), fixed(3), fixed(5)];
    let expected = vec![("upsert", vec![vec![1, 2], vec![0, 3]])];
    assert_eq!(decided_by(&batches, Some(1)), expected, "routes 10 (slot 0) and 30 (slot 2), in route order");
}

#[test]
fn a_batch_with_a_check_of_another_algorithm_goes_whole_to_the_route_function() {
    let sliding = check(vec![bucket(3, Algorithm::SlidingWindow)]);
    let batches = [fixed(0), sliding, fixed(5)];
    assert_eq!(decided_by(&batches, Some(1)), vec![("node", vec![vec![0, 1, 2]])]);
}

#[test]
fn a_check_of_buckets_on_two_of_the_workers_shards_has_a_segment_on_each() {
    let policy = check(vec![bucket(6, Algorithm::FixedWindow), bucket(8, Algorithm::FixedWindow)]);
    let batches = [fixed(0), policy, fixed(5)];
    assert_eq!(decided_by(&batches, Some(1)), vec![("policy upsert", vec![vec![0, 1], vec![1, 2]])]);
    let token = check(vec![bucket(3, Algorithm::TokenBucket)]);
    let expected = vec![("policy upsert", vec![vec![0, 1], vec![2]])];
    assert_eq!(decided_by(&[fixed(0), token, fixed(5)], Some(1)), expected, "a token bucket too");
}

#[test]
fn a_check_across_two_shards_of_many_takes_the_statement_over_all_of_them() {
    let nine = Routes::for_tests((1..=9).collect(), vec![1; 9]);
    let policy = check(vec![bucket(0, Algorithm::FixedWindow), bucket(4, Algorithm::FixedWindow)]);
    let batches: Vec<&Check> = vec![&policy];
    let statements = statements_of(&nine, &batches, vec![0], Some(1));
    let [Statement::Upsert(_, Shards::All, segments, Upsert::Policy)] = &statements[..] else {
        panic!("one statement over the nine shards: 2 of 9 alone would decide each bucket apart");
    };
    assert_eq!((segments[0].clone(), segments[4].clone()), (vec![(0, 0)], vec![(0, 1)]));
}

#[test]
fn a_key_twice_takes_the_hot_upsert_for_every_route() {
    let expected = vec![("hot upsert", vec![vec![0, 1], vec![2]])];
    assert_eq!(decided_by(&[fixed(0), fixed(0), fixed(2)], Some(1)), expected);
}

#[test]
fn a_key_twice_with_other_limits_goes_to_the_route_function_which_decides_them_in_turn() {
    let mut other = fixed(0);
    other.buckets[0].limit = 6;
    assert_eq!(decided_by(&[fixed(0), other, fixed(2)], Some(1)), vec![("node", vec![vec![0, 1, 2]])]);
}

#[test]
fn through_the_coordinator_or_off_its_worker_a_check_takes_the_route_function() {
    assert_eq!(decided_by(&[fixed(0)], None), vec![("node", vec![vec![0]])], "through the coordinator");
    assert_eq!(decided_by(&[fixed(1)], Some(1)), vec![("node", vec![vec![0]])], "a key of worker 2");
}

#[test]
fn checks_on_one_shard_or_few_of_many_take_each_shards_own_statement() {
    assert_eq!(decided_by(&[fixed(2), fixed(5)], Some(1)), vec![("a shard's upsert", vec![vec![0, 1]])]);
    // Nine routes, all on worker 1: a key's slot is its second byte.
    let nine = Routes::for_tests((1..=9).collect(), vec![1; 9]);
    let expected = vec![("a shard's upsert", vec![vec![0]]), ("a shard's upsert", vec![vec![1]])];
    assert_eq!(decided_on(&nine, &[fixed(0), fixed(4)], Some(1)), expected, "2 of 9 shards");
    let three = decided_on(&nine, &[fixed(0), fixed(4), fixed(8)], Some(1));
    assert_eq!(three.len(), 1, "3 of 9 shards: {three:?}");
    assert_eq!(three[0].1.iter().filter(|s| !s.is_empty()).count(), 3);
}
