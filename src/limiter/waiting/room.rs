//! Reading a denial for waiting: whether waiting could turn it, which key
//! to wait on (the bucket that keeps the request out longest), and when to
//! check again (when that bucket has room, on this instance's clock).

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::algorithm::Algorithm;
use crate::limiter::checks::{Applied, BucketDecision, Decision};
use crate::storage::Key;

/// The shortest sleep between two rechecks, so that a denial naming a
/// time already past cannot turn the wait into a busy loop.
const MIN_RECHECK: Duration = Duration::from_millis(10);

/// How often the first waiter for a concurrency slot rechecks where
/// releases cannot be heard: a few round trips a second per waited-on key.
pub(super) const RELEASE_POLL: Duration = Duration::from_millis(250);

/// The key to wait on if `decision` is a denial that waiting could turn:
/// not a block, not a deny list, not shadow, and room due by `deadline`.
/// That is the denying bucket whose room comes last, so a request waits in
/// the queue of what keeps it out longest (its own exhausted bucket, not a
/// shared one others wait for). A release can free a concurrency slot at
/// any time, so only the other buckets' room must be due; a request denied
/// by slots alone waits on the first, which a release heard from any
/// instance wakes.
pub(super) fn held_for(decision: &Decision, deadline: Instant) -> Option<Key> {
    let deny_listed = decision.matched.as_ref().is_some_and(|m| m.action == Applied::Deny);
    if decision.allowed || decision.blocked_by.is_some() || deny_listed || decision.shadow {
        return None;
    }
    let denying = || decision.buckets.iter().filter(|b| !b.allowed);
    let timed = || denying().filter(|b| b.algorithm != Algorithm::Concurrency);
    (room_at(decision, timed()) <= deadline).then_some(())?;
    let last_room = timed().max_by_key(|b| b.retry_at.unwrap_or(b.reset_at));
    last_room.or_else(|| denying().next()).map(|b| b.key)
}

/// When to check `denial`'s request again: when the bucket it waits on
/// has room. Denied by any bucket that is not a slot, that is when the
/// last of those has room (a slot is looked at then); denied by slots
/// alone, when a lease ends, or, where releases cannot be heard
/// (`polls_for_releases`), at the next poll.
pub(super) fn recheck_at(denial: &Decision, polls_for_releases: bool) -> Instant {
    let denying = || denial.buckets.iter().filter(|b| !b.allowed);
    let timed = || denying().filter(|b| b.algorithm != Algorithm::Concurrency);
    let at = if timed().next().is_some() {
        room_at(denial, timed())
    } else if polls_for_releases {
        room_at(denial, denying()).min(Instant::now() + RELEASE_POLL)
    } else {
        room_at(denial, denying())
    };
    at.max(Instant::now() + MIN_RECHECK)
}

/// When every one of `buckets` has room again, on this instance's clock.
fn room_at<'a>(decision: &Decision, buckets: impl Iterator<Item = &'a BucketDecision>) -> Instant {
    let at = buckets.map(|b| b.retry_at.unwrap_or(b.reset_at)).max().unwrap_or(decision.now);
    Instant::now() + until_time(decision.now, at)
}

fn until_time(now: DateTime<Utc>, at: DateTime<Utc>) -> Duration {
    (at - now).to_std().unwrap_or(Duration::ZERO)
}
