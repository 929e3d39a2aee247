//! The five algorithms, as pure functions of a stored state and a clock,
//! in integer microseconds.
//!
//! This is the model: the memory store runs it directly. The arithmetic is
//! written once more, in SQL, as functions every statement calls; a test
//! replays random traces through each statement and this model. Keeping
//! `now` a parameter is what makes both deterministic to test. Nothing here
//! knows of configuration, storage or HTTP.
//!
//! Every place that encodes an algorithm (change them together; the
//! replays in `tests/api/replay.rs` and `tests/citus/decisions.rs` hold
//! every statement to the model). The SQL is `storage/postgres/sql/
//! algorithms.sql`; its functions are named `pglimit_` and what follows:
//!
//! | algorithm (code) | model (`windows.rs`) | SQL: state, room, reset, retry, take | outage write-back |
//! |---|---|---|---|
//! | all counting ones | `limit.saturating_sub` | `fits`, `room` | |
//! | fixed window (0, `fixed_window()`) | `fixed` | `fixed_count`, `fixed_end` (reset and retry), `fixed_takes` (a hot key's k of n) | `absorb.rs` |
//! | calendar window (fixed) | `calendar.rs` | `window_end`, `calendar_end` | `absorb.rs` (as fixed) |
//! | sliding window (1, `sliding_window()`) | `sliding`, `counts_at`, `weighted`, `sliding_retry` | `sliding_start`, `_row_end`, `_current`, `_previous`, `_weight`, `_full`, `_earliest`, `_retry` | `absorb.rs` |
//! | sliding log (2, `sliding_log()`) | `log` | `log_keeps`, `log_live`, `log_full`, `log_retry`, `log_take` | `absorb.rs` |
//! | token bucket (3, `token_bucket()`) | `token` | `token_step`, `_tat`, `_fits`, `_remaining`, `_retry` | `absorb.rs` |
//! | concurrency (4, `concurrency()`) | `concurrency` | `lease_holds`, `leases_held`, `lease_take`, `log_full` and `log_retry` with no window; `sql/leases.sql` | `absorb.rs` |
//!
//! `pglimit_decide` composes them into one bucket's decision; the set-based
//! `pglimit_check_distinct`, the four plain upserts
//! (`storage/postgres/*upsert.sql`) and Citus' refund
//! (`citus/functions.sql`, which undoes a step) call them too, and derive
//! nothing themselves. The upserts carry what their conflict branch needs
//! in the proposed row; how is said at the top of each.
//!
//! Every algorithm answers the same questions, so responses mean the same
//! whatever the algorithm: is there room for `cost` (`allowed`), how much
//! is left (`remaining`), when the bucket is back to its full limit
//! (`full_us`), and, when denied, the earliest time a check of this cost
//! could pass (`retry_us`).

mod absorb;
mod calendar;
#[cfg(test)]
mod tests;
mod windows;

use serde::{Deserialize, Serialize};

pub use absorb::absorb;
pub use calendar::{parse_zone, Calendar, CalendarUnit, SPELLINGS as CALENDAR_SPELLINGS};

/// Largest limit a bucket may have.
pub const MAX_LIMIT: u64 = 1_000_000_000;
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
    /// In flight: at most `limit` slots held at once. Each admitted unit
    /// holds a slot until its lease ends (`window` is the lease time),
    /// unless released or renewed (`sql/leases.sql`). Stored as one expiry
    /// time per held slot.
    Concurrency,
}

/// A limit an algorithm cannot take; the message is a sentence for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("must be between 1 and {max}")]
    OutOfRange { max: u64 },
    #[error(
        "sliding_log stores one timestamp per admitted request, so its limit is at most {max}; \
         use sliding_window for larger limits"
    )]
    LogTooLong { max: u64 },
}

impl Algorithm {
    pub const ALL: [Algorithm; 5] =
        [Self::FixedWindow, Self::SlidingWindow, Self::SlidingLog, Self::TokenBucket, Self::Concurrency];

    /// The code passed to SQL (`pglimit_decide`'s `algo`, which raises on
    /// any other); a test checks that each code selects this algorithm there.
    pub fn code(self) -> i16 {
        match self {
            Self::FixedWindow => 0,
            Self::SlidingWindow => 1,
            Self::SlidingLog => 2,
            Self::TokenBucket => 3,
            Self::Concurrency => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::FixedWindow => "fixed_window",
            Self::SlidingWindow => "sliding_window",
            Self::SlidingLog => "sliding_log",
            Self::TokenBucket => "token_bucket",
            Self::Concurrency => "concurrency",
        }
    }

    /// Largest limit this algorithm accepts.
    pub fn max_limit(self) -> u64 {
        match self {
            // Both store one time per unit: an entry per admission, or per slot.
            Self::SlidingLog | Self::Concurrency => MAX_LOG_LIMIT,
            _ => MAX_LIMIT,
        }
    }

    /// The one rule for limits, whether from a policy file or a request.
    pub fn check_limit(self, limit: u64) -> Result<(), LimitError> {
        let max = self.max_limit();
        match limit {
            1.. if limit <= max => Ok(()),
            _ if self == Self::SlidingLog && limit > max => Err(LimitError::LogTooLong { max }),
            _ => Err(LimitError::OutOfRange { max }),
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
    /// A fixed window's calendar window, which then ends at the next
    /// calendar boundary rather than `window_us` after it starts.
    pub calendar: Option<Calendar>,
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
    let p = Params { window_us: p.window_us.max(1), ..p };
    match p.algorithm {
        Algorithm::FixedWindow => windows::fixed(p, stored, cost, now_us, admit),
        Algorithm::SlidingWindow => windows::sliding(p, stored, cost, now_us, admit),
        Algorithm::SlidingLog => windows::log(p, stored, cost, now_us, admit),
        Algorithm::TokenBucket => windows::token(p, stored, cost, now_us, admit),
        Algorithm::Concurrency => windows::concurrency(p, stored, cost, now_us, admit),
    }
}

/// The answer to a check of several buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joint {
    /// Every bucket allowed and the cost is above zero: store every `next`.
    pub admitted: bool,
    /// One verdict per bucket, in order.
    pub verdicts: Vec<Verdict>,
}

/// Decides a check of several buckets, all or nothing: it is admitted only
/// if every bucket allows it and `cost > 0`; then every bucket takes the
/// cost, otherwise none does. The SQL batch function follows the same rule.
pub fn decide_all(buckets: &[(Params, Option<&State>)], cost: u64, now_us: i64) -> Joint {
    let admitted = cost > 0 && buckets.iter().all(|(p, s)| decide(*p, *s, cost, now_us, false).allowed);
    let verdicts = buckets.iter().map(|(p, s)| decide(*p, *s, cost, now_us, admitted)).collect();
    Joint { admitted, verdicts }
}

/// A sliding window's counts as they stand at `now_us`: when the current
/// window started, its count, and the previous window's whole count (which
/// [`decide`] weighs by how much of it still overlaps the last window).
pub fn sliding_counts(window_us: i64, stored: &State, now_us: i64) -> (i64, u64, u64) {
    let window = window_us.max(1);
    let start = now_us.div_euclid(window) * window;
    let (count, prev) = windows::counts_at(stored, window, start);
    (start, count, prev)
}
