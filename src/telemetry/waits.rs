//! `pglimit_waiting` and `pglimit_waits_total`: checks held by `max_wait`.
//!
//! Registered by the limiter when waiting is on (`PGLIMIT_MAX_WAITING` > 0),
//! so an instance that holds nothing shows no such series.

use metrics::{counter, describe_counter, describe_gauge, gauge};

const WAITING: &str = "pglimit_waiting";
const WAITS: &str = "pglimit_waits_total";

/// How a wait ended, as `pglimit_waits_total` counts it.
const RESULTS: [&str; 3] = ["admitted", "timed_out", "full"];

/// Waiting is on: its series at 0 from the start.
pub fn waits_expected(on: bool) {
    if !on {
        return;
    }
    describe_gauge!(WAITING, "Checks held by max_wait on this instance now");
    describe_counter!(
        WAITS,
        "Checks held by max_wait, by how the wait ended: admitted, timed_out (answered 429), or full \
         (PGLIMIT_MAX_WAITING held already, answered at once)"
    );
    gauge!(WAITING).set(0.0);
    for result in RESULTS {
        counter!(WAITS, "result" => result).increment(0);
    }
}

/// Checks held now.
pub fn waiting(held: usize) {
    gauge!(WAITING).set(held as f64);
}

/// A held check was answered: admitted, or denied at its deadline.
pub fn wait_ended(admitted: bool) {
    counter!(WAITS, "result" => if admitted { "admitted" } else { "timed_out" }).increment(1);
}

/// A check that would have been held was answered at once: the bound was
/// reached (or the service is stopping).
pub fn wait_refused() {
    counter!(WAITS, "result" => "full").increment(1);
}
