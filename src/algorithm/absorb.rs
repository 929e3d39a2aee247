//! Folding what one instance admitted on its own (from memory, during an
//! outage) into the shared state, so that a window spanning the outage is
//! not refilled when the shared store returns.
//!
//! Each algorithm adds what is still in force of the outage state to what
//! is still in force of the shared one, capped at a full bucket: an
//! admission whose window has passed (or whose token has refilled) no longer
//! limits anything, so it is not carried over, and a bucket is never
//! pushed past empty into debt.

use super::windows::counts_at;
use super::{Algorithm, Params, State};

/// The shared state after adding `outage` to `stored` at `now_us`; `None`
/// when nothing of either is still in force (no row is needed).
pub fn absorb(p: Params, stored: Option<&State>, outage: &State, now_us: i64) -> Option<State> {
    let window = p.window_us.max(1);
    let next = match p.algorithm {
        Algorithm::FixedWindow => fixed(p.limit, stored, outage, now_us),
        Algorithm::SlidingWindow => sliding(p.limit, window, stored, outage, now_us),
        Algorithm::SlidingLog => log(p.limit, window, stored, outage, now_us),
        Algorithm::TokenBucket => token(p.limit, window, stored, outage, now_us),
        Algorithm::Concurrency => leases(p.limit, stored, outage, now_us),
    };
    next.filter(|s| s.expires_us > now_us)
}

/// The windows started at different moments (each at its own first
/// admission): the outage's count joins the shared window while that is
/// open, else the outage's own window is kept.
fn fixed(limit: u64, stored: Option<&State>, outage: &State, now: i64) -> Option<State> {
    let live = |s: &&State| s.expires_us > now;
    let (base, extra) = match (stored.filter(live), Some(outage).filter(live)) {
        (Some(s), Some(o)) => (s, o.count),
        (Some(s), None) => (s, 0),
        (None, Some(o)) => (o, 0),
        (None, None) => return None,
    };
    Some(State { count: (base.count + extra).min(limit), expires_us: base.expires_us, ..State::default() })
}

/// Windows are aligned on the clock, so both states' counts are read as
/// this window's and the previous one's, and added.
fn sliding(limit: u64, window: i64, stored: Option<&State>, outage: &State, now: i64) -> Option<State> {
    let start = now.div_euclid(window) * window;
    let (count, prev) = counts_at(outage, window, start);
    let (shared_count, shared_prev) = stored.map_or((0, 0), |s| counts_at(s, window, start));
    let (count, prev) = ((count + shared_count).min(limit), (prev + shared_prev).min(limit));
    (count + prev > 0).then(|| State { count, prev, expires_us: start + 2 * window, ..State::default() })
}

/// The union of both logs' entries still in the window, the newest `limit`.
fn log(limit: u64, window: i64, stored: Option<&State>, outage: &State, now: i64) -> Option<State> {
    let shared = stored.map_or(&[][..], |s| &s.log[..]);
    let mut entries: Vec<i64> =
        shared.iter().chain(&outage.log).copied().filter(|&t| t > now - window).collect();
    entries.sort_unstable();
    let keep = entries.len().saturating_sub(limit as usize);
    entries.drain(..keep);
    let last = *entries.last()?;
    Some(State { expires_us: last + window, log: entries, ..State::default() })
}

/// Slots held on both sides, still leased, the latest-ending `limit`: a
/// slot taken from memory holds it in the shared state too, until its lease
/// ends. (A release of a shared lease asked for during the outage is
/// written back before this, by `storage/fallback/releases.rs`.)
fn leases(limit: u64, stored: Option<&State>, outage: &State, now: i64) -> Option<State> {
    let shared = stored.map_or(&[][..], |s| &s.log[..]);
    let mut held: Vec<i64> = shared.iter().chain(&outage.log).copied().filter(|&t| t > now).collect();
    held.sort_unstable();
    let keep = held.len().saturating_sub(limit as usize);
    held.drain(..keep);
    let last = *held.last()?;
    Some(State { expires_us: last, log: held, ..State::default() })
}

/// Tokens still missing on each side are added: the theoretical arrival
/// time moves on by the outage's debt, at most to an empty bucket.
fn token(limit: u64, window: i64, stored: Option<&State>, outage: &State, now: i64) -> Option<State> {
    let interval = (window / limit.max(1) as i64).max(1);
    let debt = |tat: i64| (tat - now).max(0);
    let owed = debt(stored.map_or(now, |s| s.tat_us)) + debt(outage.tat_us);
    let tat = now + owed.min(interval * limit as i64);
    Some(State { tat_us: tat, expires_us: tat, ..State::default() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::decide;

    const S: i64 = 1_000_000;

    /// Admits `n` checks of cost 1 at `now`, starting from `state`.
    fn admit(p: Params, mut state: Option<State>, n: u32, now: i64) -> Option<State> {
        for _ in 0..n {
            let v = decide(p, state.as_ref(), 1, now, true);
            assert!(v.allowed, "{:?} admits", p.algorithm);
            state = Some(v.next);
        }
        state
    }

    fn room(p: Params, state: Option<&State>, now: i64) -> u64 {
        decide(p, state, 0, now, false).remaining
    }

    #[test]
    fn what_memory_admitted_is_not_refilled_under_any_algorithm() {
        let now = 1_000 * 60 * S + 5 * S;
        for algorithm in Algorithm::ALL {
            let p = Params { algorithm, limit: 5, window_us: 60 * S, calendar: None };
            let outage = admit(p, None, 3, now).expect("a state");
            let merged = absorb(p, None, &outage, now + S);
            assert_eq!(room(p, merged.as_ref(), now + S), 2, "{algorithm:?} on an empty row");
            let shared = admit(p, None, 1, now - S);
            let merged = absorb(p, shared.as_ref(), &outage, now + S);
            assert_eq!(room(p, merged.as_ref(), now + S), 1, "{algorithm:?} on a row of 1");
        }
    }

    #[test]
    fn a_bucket_is_filled_at_most_to_its_limit() {
        let now = 1_000 * 60 * S;
        for algorithm in Algorithm::ALL {
            let p = Params { algorithm, limit: 5, window_us: 60 * S, calendar: None };
            let full = admit(p, None, 5, now).expect("a state");
            let merged = absorb(p, Some(&full), &full, now).expect("in force");
            assert_eq!(room(p, Some(&merged), now), 0, "{algorithm:?}");
            let later = now + 60 * S + 1;
            let refilled = room(p, Some(&full), later);
            assert_eq!(
                room(p, Some(&merged), later),
                refilled,
                "{algorithm:?} refills as a full bucket would"
            );
        }
    }

    #[test]
    fn admissions_whose_window_has_passed_are_not_carried_over() {
        let now = 1_000 * 60 * S;
        for algorithm in Algorithm::ALL {
            let p = Params { algorithm, limit: 5, window_us: 10 * S, calendar: None };
            let outage = admit(p, None, 3, now).expect("a state");
            assert_eq!(absorb(p, None, &outage, now + 30 * S), None, "{algorithm:?}");
        }
    }

    #[test]
    fn a_calendar_window_written_back_ends_at_its_boundary_not_a_window_later() {
        // 2027-03-28 12:00 in Berlin, a day of 23 hours; the shared row
        // and the outage both hold this day's window.
        let now = 1_822_298_400 * S;
        let zone = crate::algorithm::parse_zone("Europe/Berlin").expect("zone");
        let calendar = crate::algorithm::Calendar { unit: crate::algorithm::CalendarUnit::Day, zone };
        let p = Params {
            algorithm: Algorithm::FixedWindow,
            limit: 5,
            window_us: 86_400 * S,
            calendar: Some(calendar),
        };
        let midnight = 1_822_341_600 * S; // 2027-03-29 00:00 +02:00
        let shared = admit(p, None, 1, now - S);
        let outage = admit(p, None, 3, now).expect("a state");
        let merged = absorb(p, shared.as_ref(), &outage, now + S).expect("in force");
        assert_eq!((merged.count, merged.expires_us), (4, midnight));
        assert_eq!(room(p, Some(&merged), midnight - 1), 1);
        assert_eq!(room(p, Some(&merged), midnight), 5, "a new day");
    }
}
