use super::*;

const S: i64 = 1_000_000;

/// Replays `(time in s, requests)` against one bucket; returns how many were admitted.
fn replay(algorithm: Algorithm, limit: u64, window_s: i64, trace: &[(f64, u32)]) -> u32 {
    let p = Params { algorithm, limit, window_us: window_s * S, calendar: None };
    let mut state: Option<State> = None;
    let mut admitted = 0;
    for &(t, n) in trace {
        let now = (t * S as f64) as i64 + 1_000 * S; // away from the epoch
        for _ in 0..n {
            let v = decide(p, state.as_ref(), 1, now, true);
            if v.allowed {
                admitted += 1;
                state = Some(v.next);
            }
        }
    }
    admitted
}

#[test]
fn token_bucket_allows_a_burst_of_its_capacity_then_its_rate() {
    let p = Params { algorithm: Algorithm::TokenBucket, limit: 10, window_us: 10 * S, calendar: None };
    let mut state = None;
    let mut admitted = 0;
    for _ in 0..15 {
        let v = decide(p, state.as_ref(), 1, 0, true);
        if v.allowed {
            admitted += 1;
            state = Some(v.next);
        }
    }
    assert_eq!(admitted, 10, "the burst is the capacity");
    let denied = decide(p, state.as_ref(), 1, 0, false);
    assert_eq!(denied.retry_us, Some(S), "the next token arrives after 1 s");
    assert!(decide(p, state.as_ref(), 1, S, true).allowed);
    assert!(!decide(p, state.as_ref(), 2, S, true).allowed, "one token, not two");
}

#[test]
fn the_sliding_counter_matches_cloudflares_worked_example() {
    // Limit 50 a minute, 15 s into the window, 42 in the previous one and
    // 18 so far: 42 * 45/60 + 18 = 49.5, so one more is allowed.
    let window = 60 * S;
    let now = 1_000 * window + 15 * S;
    let start = now - 15 * S;
    let stored = State { count: 18, prev: 42, expires_us: start + 2 * window, ..State::default() };
    let p = Params { algorithm: Algorithm::SlidingWindow, limit: 50, window_us: window, calendar: None };
    let v = decide(p, Some(&stored), 1, now, true);
    assert!(v.allowed);
    assert_eq!(v.remaining, 50 - 31 - 19);
    assert!(!decide(p, Some(&v.next), 1, now, true).allowed);
}

#[test]
fn sliding_retry_is_the_first_moment_the_estimate_has_room() {
    let window = 10 * S;
    let p = Params { algorithm: Algorithm::SlidingWindow, limit: 4, window_us: window, calendar: None };
    let start = 1_000 * window;
    let full = State { count: 4, prev: 0, expires_us: start + 2 * window, ..State::default() };
    let v = decide(p, Some(&full), 1, start + 9 * S, false);
    let retry = v.retry_us.expect("denied");
    assert!(!decide(p, Some(&full), 1, retry - 1, false).allowed, "one µs earlier is still denied");
    assert!(decide(p, Some(&full), 1, retry, false).allowed, "at retry_us it is allowed");
}

#[test]
fn log_retry_is_when_the_oldest_entry_leaves() {
    let p = Params { algorithm: Algorithm::SlidingLog, limit: 2, window_us: 10 * S, calendar: None };
    let stored = State { log: vec![S, 3 * S], ..State::default() };
    let v = decide(p, Some(&stored), 1, 5 * S, false);
    assert_eq!(v.retry_us, Some(11 * S));
    assert!(decide(p, Some(&stored), 1, 11 * S, true).allowed);
    assert!(!decide(p, Some(&stored), 1, 11 * S - 1, true).allowed);
}

#[test]
fn demo_2_the_reference_burst_straddling_a_clock_boundary() {
    // 4 at t = 9 and 4 at t = 10, limit 4 per 10 s.
    let trace = [(9.0, 4), (10.0, 4)];
    assert_eq!(replay(Algorithm::SlidingLog, 4, 10, &trace), 4);
    assert_eq!(replay(Algorithm::SlidingWindow, 4, 10, &trace), 4);
    // pglimit's fixed window starts at the key's first request (t = 9),
    // so this trace does not straddle its boundary...
    assert_eq!(replay(Algorithm::FixedWindow, 4, 10, &trace), 4);
    // ...but one that straddles the key's own boundary gets 2 x limit
    // through in one second.
    let straddling = [(0.0, 1), (9.5, 4), (10.0, 4)];
    assert_eq!(replay(Algorithm::FixedWindow, 4, 10, &straddling), 8);
    assert_eq!(replay(Algorithm::SlidingLog, 4, 10, &straddling), 5);
    assert_eq!(replay(Algorithm::SlidingWindow, 4, 10, &straddling), 4);
}

#[test]
fn demo_3_the_counter_lets_six_through_in_ten_seconds() {
    // The previous window's 4 came at t = 9; at t = 15 they count as 2.
    let trace = [(9.0, 4), (15.0, 4)];
    assert_eq!(replay(Algorithm::SlidingWindow, 4, 10, &trace), 6);
    assert_eq!(replay(Algorithm::SlidingLog, 4, 10, &trace), 4);
}

#[test]
fn demo_4_the_counter_rejects_two_that_the_log_allows() {
    // The previous window's 4 came at t = 1; at t = 13 they still count 2.8.
    let trace = [(1.0, 4), (13.0, 4)];
    assert_eq!(replay(Algorithm::SlidingLog, 4, 10, &trace), 8);
    assert_eq!(replay(Algorithm::SlidingWindow, 4, 10, &trace), 6);
}

#[test]
fn demo_5_steady_overload_settles_near_the_limit_for_all() {
    // 2 requests every 2 s for 60 s against 4 per 10 s: about 24 admitted.
    let trace: Vec<(f64, u32)> = (0..30).map(|i| (f64::from(i) * 2.0, 2)).collect();
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow, Algorithm::SlidingLog] {
        let admitted = replay(algorithm, 4, 10, &trace);
        assert!((22..=28).contains(&admitted), "{algorithm:?} admitted {admitted}");
    }
}

#[test]
fn a_check_is_admitted_only_if_every_bucket_has_room() {
    let narrow = Params { algorithm: Algorithm::FixedWindow, limit: 1, window_us: 60 * S, calendar: None };
    let wide = Params { algorithm: Algorithm::TokenBucket, limit: 10, window_us: 60 * S, calendar: None };
    let first = decide_all(&[(narrow, None), (wide, None)], 1, 0);
    assert!(first.admitted);
    let states: Vec<State> = first.verdicts.into_iter().map(|v| v.next).collect();
    let second = decide_all(&[(narrow, Some(&states[0])), (wide, Some(&states[1]))], 1, 0);
    assert!(!second.admitted);
    assert_eq!(second.verdicts[1].remaining, 9, "the wide bucket took nothing");
    assert_eq!(second.verdicts[1].next, states[1], "and its state is unchanged");
    let peek = decide_all(&[(wide, None)], 0, 0);
    assert!(!peek.admitted && peek.verdicts[0].allowed, "a peek is allowed but admits nothing");
}

#[test]
fn every_algorithm_takes_limits_from_one_to_its_maximum() {
    for algorithm in Algorithm::ALL {
        let max = algorithm.max_limit();
        assert_eq!(algorithm.check_limit(1), Ok(()));
        assert_eq!(algorithm.check_limit(max), Ok(()));
        assert_eq!(algorithm.check_limit(0), Err(LimitError::OutOfRange { max }));
        assert!(algorithm.check_limit(max + 1).is_err());
    }
    assert_eq!(Algorithm::SlidingLog.check_limit(1_001), Err(LimitError::LogTooLong { max: 1_000 }));
}

#[test]
fn a_concurrency_slot_is_held_until_its_lease_ends() {
    let p = Params { algorithm: Algorithm::Concurrency, limit: 2, window_us: 30 * S, calendar: None };
    let first = decide(p, None, 1, 0, true);
    let second = decide(p, Some(&first.next), 1, 10 * S, true);
    assert_eq!(second.remaining, 0, "remaining counts free slots");
    let denied = decide(p, Some(&second.next), 1, 20 * S, false);
    assert!(!denied.allowed);
    assert_eq!(denied.retry_us, Some(30 * S), "the earliest lease to end");
    assert_eq!(denied.full_us, 40 * S, "every slot free when the last lease ends");
    assert!(!decide(p, Some(&second.next), 1, 30 * S - 1, false).allowed, "held until 30 s");
    assert!(decide(p, Some(&second.next), 1, 30 * S, false).allowed, "free once the first lease ended");
    assert!(!decide(p, Some(&second.next), 2, 30 * S, false).allowed, "one slot, not two");
}

#[test]
fn a_concurrency_check_of_cost_two_holds_two_slots_and_a_peek_none() {
    let p = Params { algorithm: Algorithm::Concurrency, limit: 3, window_us: 5 * S, calendar: None };
    let taken = decide(p, None, 2, 0, true);
    assert_eq!((taken.remaining, taken.next.log.clone()), (1, vec![5 * S, 5 * S]));
    let peek = decide(p, Some(&taken.next), 0, S, true);
    assert_eq!((peek.remaining, peek.next.log.len()), (1, 2));
}
