//! The four window algorithms, as pure functions of a stored state and a
//! clock, in integer microseconds.
//!
//! This is the model: the memory store runs it directly, and the SQL
//! function `pglimit_decide` (migrations/) is a line-by-line translation
//! whose equivalence a test checks on random traces. Keeping `now` a
//! parameter is what makes both deterministic to test.
//!
//! Every algorithm answers the same questions, so responses mean the same
//! whatever the algorithm: is there room for `cost` (`allowed`), how much
//! is left (`remaining`), when the bucket is back to its full limit
//! (`full_us`), and, when denied, the earliest time a check of this cost
//! could pass (`retry_us`).

use serde::{Deserialize, Serialize};

/// Largest limit a `sliding_log` bucket may have: it stores one timestamp
/// per admitted unit.
pub const MAX_LOG_LIMIT: u64 = 1_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// One counter per window; the window starts at the key's first admitted
    /// request. Admits up to 2 × limit across a window boundary.
    #[default]
    FixedWindow,
    /// Clock-aligned windows; the previous window's count weighted by how
    /// much of it still overlaps the last `window` (Cloudflare, Upstash).
    SlidingWindow,
    /// Exact: one timestamp per admitted unit in the last `window`.
    SlidingLog,
    /// GCRA: capacity `limit`, refilling `limit` per `window`, stored as one
    /// theoretical arrival time.
    TokenBucket,
}

impl Algorithm {
    pub const ALL: [Algorithm; 4] =
        [Self::FixedWindow, Self::SlidingWindow, Self::SlidingLog, Self::TokenBucket];

    /// The code stored in SQL arrays (`pglimit_decide`'s `algo`).
    pub fn code(self) -> i16 {
        match self {
            Self::FixedWindow => 0,
            Self::SlidingWindow => 1,
            Self::SlidingLog => 2,
            Self::TokenBucket => 3,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::FixedWindow => "fixed_window",
            Self::SlidingWindow => "sliding_window",
            Self::SlidingLog => "sliding_log",
            Self::TokenBucket => "token_bucket",
        }
    }

    /// Largest limit this algorithm accepts.
    pub fn max_limit(self) -> u64 {
        match self {
            Self::SlidingLog => MAX_LOG_LIMIT,
            _ => crate::policy::MAX_LIMIT,
        }
    }
}

/// What is stored for a bucket. Fields an algorithm does not use stay zero
/// or empty. `expires_us` is when the state becomes equivalent to no state
/// at all (cleanup deletes it then); it is also the fixed window's end, the
/// sliding window's current window end plus one window, and the token
/// bucket's theoretical arrival time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    pub count: u64,
    pub prev: u64,
    pub expires_us: i64,
    pub tat_us: i64,
    pub log: Vec<i64>,
}

/// One bucket's parameters.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub algorithm: Algorithm,
    pub limit: u64,
    pub window_us: i64,
}

/// The answer for one bucket, and the state to store if the check is admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    pub remaining: u64,
    pub full_us: i64,
    pub retry_us: Option<i64>,
    pub next: State,
}

/// Decides one bucket at `now_us`. `admit` says whether the whole check is
/// admitted (every bucket allowed and cost > 0): only then does the cost
/// count, in `remaining` and in `next`.
pub fn decide(p: Params, stored: Option<&State>, cost: u64, now_us: i64, admit: bool) -> Verdict {
    let window = p.window_us.max(1);
    match p.algorithm {
        Algorithm::FixedWindow => fixed(p.limit, window, stored, cost, now_us, admit),
        Algorithm::SlidingWindow => sliding(p.limit, window, stored, cost, now_us, admit),
        Algorithm::SlidingLog => log(p.limit, window, stored, cost, now_us, admit),
        Algorithm::TokenBucket => token(p.limit, window, stored, cost, now_us, admit),
    }
}

fn fixed(limit: u64, window: i64, stored: Option<&State>, cost: u64, now: i64, admit: bool) -> Verdict {
    let (count, end) = match stored {
        Some(s) if s.expires_us > now => (s.count, s.expires_us),
        _ => (0, now + window),
    };
    let allowed = count + cost <= limit;
    let count = if admit { count + cost } else { count };
    Verdict {
        allowed,
        remaining: limit.saturating_sub(count),
        full_us: end,
        retry_us: (!allowed).then_some(end),
        next: State { count, expires_us: end, ..State::default() },
    }
}

fn sliding(limit: u64, window: i64, stored: Option<&State>, cost: u64, now: i64, admit: bool) -> Verdict {
    let start = now.div_euclid(window) * window;
    let end = start + window;
    let (count, prev) = match stored {
        Some(s) if s.expires_us - window == end => (s.count, s.prev),
        Some(s) if s.expires_us - window == start => (0, s.count),
        _ => (0, 0),
    };
    let weighted = weighted(prev, window, now - start);
    let allowed = weighted + count + cost <= limit;
    let count = if admit { count + cost } else { count };
    let full_us = if count > 0 {
        end + window
    } else if prev > 0 {
        end
    } else {
        now
    };
    let retry_us = (!allowed).then(|| sliding_retry(limit, window, start, count, prev, cost));
    Verdict {
        allowed,
        remaining: limit.saturating_sub(weighted + count),
        full_us,
        retry_us,
        next: State { count, prev, expires_us: end + window, ..State::default() },
    }
}

/// `prev` weighted by the share of the previous window still inside the
/// last `window`, `elapsed` into the current one; rounded down.
fn weighted(prev: u64, window: i64, elapsed: i64) -> u64 {
    (i128::from(prev) * i128::from(window - elapsed) / i128::from(window)) as u64
}

/// The earliest time the estimate leaves room for `cost`: later in this
/// window if this window's own count leaves room, else in the next one
/// (where this window's count becomes the previous count).
fn sliding_retry(limit: u64, window: i64, start: i64, count: u64, prev: u64, cost: u64) -> i64 {
    // Smallest elapsed e with floor(prev * (window - e) / window) <= need.
    let earliest = |prev: u64, need: u64| -> i64 {
        let q = (i128::from(need) + 1) * i128::from(window);
        let p = i128::from(prev.max(1));
        (i128::from(window) - (q + p - 1) / p + 1).max(0) as i64
    };
    if count + cost <= limit {
        start + earliest(prev, limit - count - cost)
    } else {
        start + window + earliest(count, limit.saturating_sub(cost))
    }
}

fn log(limit: u64, window: i64, stored: Option<&State>, cost: u64, now: i64, admit: bool) -> Verdict {
    let mut entries: Vec<i64> =
        stored.map(|s| s.log.iter().copied().filter(|&t| t > now - window).collect()).unwrap_or_default();
    entries.sort_unstable();
    let allowed = entries.len() as u64 + cost <= limit;
    let retry_us = (!allowed).then(|| {
        // The k-th oldest entry must leave the window (at t + window).
        let k = (entries.len() as u64 + cost - limit) as usize;
        entries.get(k.saturating_sub(1)).map_or(now, |t| t + window)
    });
    if admit {
        entries.extend(std::iter::repeat_n(now, cost as usize));
    }
    let full_us = entries.last().map_or(now, |t| t + window);
    Verdict {
        allowed,
        remaining: limit.saturating_sub(entries.len() as u64),
        full_us,
        retry_us,
        next: State { expires_us: full_us, log: entries, ..State::default() },
    }
}

fn token(limit: u64, window: i64, stored: Option<&State>, cost: u64, now: i64, admit: bool) -> Verdict {
    // One token every `interval` µs; a full bucket holds `limit` tokens.
    let interval = (window / limit.max(1) as i64).max(1);
    let capacity = interval * limit as i64;
    let tat = stored.map_or(now, |s| s.tat_us).max(now);
    let new_tat = tat + cost as i64 * interval;
    let allowed = new_tat - now <= capacity;
    let tat = if admit { new_tat } else { tat };
    Verdict {
        allowed,
        remaining: ((now + capacity - tat) / interval).max(0) as u64,
        full_us: tat,
        retry_us: (!allowed).then_some(new_tat - capacity),
        next: State { tat_us: tat, expires_us: tat, ..State::default() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    /// Replays `(time in s, requests)` against one bucket; returns how many were admitted.
    fn replay(algorithm: Algorithm, limit: u64, window_s: i64, trace: &[(f64, u32)]) -> u32 {
        let p = Params { algorithm, limit, window_us: window_s * S };
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
        let p = Params { algorithm: Algorithm::TokenBucket, limit: 10, window_us: 10 * S };
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
        let p = Params { algorithm: Algorithm::SlidingWindow, limit: 50, window_us: window };
        let v = decide(p, Some(&stored), 1, now, true);
        assert!(v.allowed);
        assert_eq!(v.remaining, 50 - 31 - 19);
        assert!(!decide(p, Some(&v.next), 1, now, true).allowed);
    }

    #[test]
    fn sliding_retry_is_the_first_moment_the_estimate_has_room() {
        let window = 10 * S;
        let p = Params { algorithm: Algorithm::SlidingWindow, limit: 4, window_us: window };
        let start = 1_000 * window;
        let full = State { count: 4, prev: 0, expires_us: start + 2 * window, ..State::default() };
        let v = decide(p, Some(&full), 1, start + 9 * S, false);
        let retry = v.retry_us.expect("denied");
        assert!(!decide(p, Some(&full), 1, retry - 1, false).allowed, "one µs earlier is still denied");
        assert!(decide(p, Some(&full), 1, retry, false).allowed, "at retry_us it is allowed");
    }

    #[test]
    fn log_retry_is_when_the_oldest_entry_leaves() {
        let p = Params { algorithm: Algorithm::SlidingLog, limit: 2, window_us: 10 * S };
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
}
