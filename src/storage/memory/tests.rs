use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use super::MemoryStore;
use crate::algorithm::Algorithm;
use crate::storage::{BucketSpec, Check, MemoryFallback};

fn bucket(name: &str, limit: u64, window_s: u64) -> BucketSpec {
    let mut key = [0u8; 32];
    key[..name.len()].copy_from_slice(name.as_bytes());
    let window = Duration::from_secs(window_s);
    BucketSpec {
        name: Arc::from(name),
        key,
        limit,
        window,
        algorithm: Algorithm::FixedWindow,
        lockout: None,
        calendar: None,
    }
}

fn batch(buckets: &[BucketSpec], cost: u64) -> Check {
    Check { buckets: buckets.to_vec(), cost, fallback: MemoryFallback::Full, lease: None }
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
    assert_eq!(checked.buckets[0].reset_at, at_reset + TimeDelta::seconds(60), "the new window starts now");
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
fn a_share_of_the_limit_is_enforced_and_what_is_owed_counts_whole_units() {
    let store = MemoryStore::new(100);
    let fixed = [bucket("k", 5, 60)];
    let admitted = (0..5).filter(|_| store.check_at(&batch(&fixed, 1), t0(), 3).allowed()).count();
    assert_eq!(admitted, 2, "ceil(5 / 3)");
    let mut token = bucket("t", 6, 60);
    token.algorithm = Algorithm::TokenBucket;
    let admitted = (0..5).filter(|_| store.check_at(&batch(&[token.clone()], 1), t0(), 3).allowed()).count();
    assert_eq!(admitted, 2, "ceil(6 / 3)");
    let mut held = store.drain(t0());
    held.sort_by_key(|h| h.key);
    assert_eq!((held[0].params.limit, held[0].state.count), (5, 2), "the fixed window owes 2 of 5");
    let tat = t0().timestamp_micros() + 2 * 10_000_000;
    assert_eq!(held[1].state.tat_us, tat, "the token bucket owes 2 of its 6 tokens, not 2 of 2");
    assert!(!store.check_at(&batch(&fixed, 1), t0(), 3).allowed(), "draining leaves decisions as they were");
    assert!(store.drain(t0()).is_empty(), "and owes nothing more");
}

#[test]
fn what_is_given_back_joins_what_was_owed_since() {
    let store = MemoryStore::new(100);
    let b = [bucket("k", 5, 60)];
    store.check_at(&batch(&b, 2), t0(), 1);
    let held = store.drain(t0());
    store.check_at(&batch(&b, 1), t0(), 1);
    store.restore(held, t0());
    let owed = store.drain(t0());
    assert_eq!(owed[0].state.count, 3);
    store.clear();
    assert!(store.is_empty());
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

#[test]
fn a_calendar_window_in_memory_ends_at_the_local_midnight_and_takes_its_share() {
    let zone = crate::algorithm::parse_zone("America/New_York").expect("zone");
    let calendar = crate::algorithm::Calendar { unit: crate::algorithm::CalendarUnit::Day, zone };
    let b =
        [BucketSpec { calendar: Some(calendar), window: Duration::from_secs(86_400), ..bucket("cal", 4, 1) }];
    // 2027-03-14 12:00 in New York, a day of 23 hours; two instances share.
    let noon: DateTime<Utc> = "2027-03-14T16:00:00Z".parse().expect("time");
    let midnight: DateTime<Utc> = "2027-03-15T04:00:00Z".parse().expect("time");
    let store = MemoryStore::new(100);
    let admitted = (0..4).filter(|_| store.check_at(&batch(&b, 1), noon, 2).allowed()).count();
    assert_eq!(admitted, 2, "half of 4");
    assert_eq!(store.check_at(&batch(&b, 0), noon, 2).buckets[0].reset_at, midnight);
    let next_day = store.check_at(&batch(&b, 1), midnight, 2);
    assert!(next_day.allowed(), "a new day at local midnight");
}
