//! The five algorithms, one function each, with `window` at least 1 µs;
//! see the module above for what they answer.

use super::{Params, State, Verdict};

pub(super) fn fixed(p: Params, stored: Option<&State>, cost: u64, now: i64, admit: bool) -> Verdict {
    let (limit, window) = (p.limit, p.window_us);
    let (count, end) = match stored {
        Some(s) if s.expires_us > now => (s.count, s.expires_us),
        _ => (0, p.calendar.map_or(now + window, |c| c.end_after(now))),
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

pub(super) fn sliding(p: Params, stored: Option<&State>, cost: u64, now: i64, admit: bool) -> Verdict {
    let (limit, window) = (p.limit, p.window_us);
    let start = now.div_euclid(window) * window;
    let end = start + window;
    let (count, prev) = stored.map_or((0, 0), |s| counts_at(s, window, start));
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

/// A sliding window state's counts for the window starting at `start` and
/// the one before it: a state is stamped with the end of its window plus one
/// window, so it is this window's, the previous one's, or too old to count.
pub(super) fn counts_at(s: &State, window: i64, start: i64) -> (u64, u64) {
    match s.expires_us - window - start {
        w if w == window => (s.count, s.prev),
        0 => (0, s.count),
        _ => (0, 0),
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

pub(super) fn log(p: Params, stored: Option<&State>, cost: u64, now: i64, admit: bool) -> Verdict {
    let (limit, window) = (p.limit, p.window_us);
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

pub(super) fn token(p: Params, stored: Option<&State>, cost: u64, now: i64, admit: bool) -> Verdict {
    let (limit, window) = (p.limit, p.window_us);
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

/// Slots in flight: `log` holds one lease expiry per held slot, and a slot
/// is free again once its expiry has passed (or its lease is released,
/// which removes its entries). An admitted check holds `cost` slots until
/// `now + window`, the lease time.
pub(super) fn concurrency(p: Params, stored: Option<&State>, cost: u64, now: i64, admit: bool) -> Verdict {
    let limit = p.limit;
    let mut held: Vec<i64> =
        stored.map(|s| s.log.iter().copied().filter(|&t| t > now).collect()).unwrap_or_default();
    held.sort_unstable();
    let allowed = held.len() as u64 + cost <= limit;
    let retry_us = (!allowed).then(|| {
        // The k-th lease to end frees the k-th slot.
        let k = (held.len() as u64 + cost - limit) as usize;
        held.get(k.saturating_sub(1)).copied().unwrap_or(now)
    });
    if admit {
        held.extend(std::iter::repeat_n(now + p.window_us, cost as usize));
        held.sort_unstable();
    }
    let full_us = held.last().copied().unwrap_or(now);
    Verdict {
        allowed,
        remaining: limit.saturating_sub(held.len() as u64),
        full_us,
        retry_us,
        next: State { expires_us: full_us, log: held, ..State::default() },
    }
}
