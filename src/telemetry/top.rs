//! `pglimit_top_lost_total`: denials the top list could not keep.
//!
//! Registered when the top list is on (`PGLIMIT_TOP`), so that an instance
//! that counts nothing shows no such series.

use metrics::{counter, describe_counter};

const LOST: &str = "pglimit_top_lost_total";

/// The top list is on: its series at 0 from the start.
pub fn top_expected(on: bool) {
    if !on {
        return;
    }
    describe_counter!(
        LOST,
        "Denials left out of the top list because this instance held as many keys and minutes as \
         PGLIMIT_MEMORY_CAPACITY allows, waiting to be written (between flushes, or while Postgres was away)"
    );
    counter!(LOST).increment(0);
}

/// `denials` were not kept for the top list.
pub fn top_lost(denials: u64) {
    counter!(LOST).increment(denials);
}
