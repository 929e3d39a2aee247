//! What the server asks of limits, as five services over one shared state.
//!
//! - [`Checks`] (`checks/`): the `/check` path. A request is validated
//!   (`request.rs`), its keys derived (never stored raw, `key.rs`), its
//!   policy's buckets made one batch, so that a check of any number of
//!   buckets is one store call, and the policy's choice for an unreachable
//!   store applied; the answer is a [`Decision`].
//! - [`Waiting`] (`waiting/`): a check with `max_wait`, held until it is
//!   admitted or its time is up.
//! - [`Leases`] (`leases.rs`): a concurrency bucket's lease released or renewed.
//! - [`Actions`] (`actions.rs`): resets, and an operator's blocks.
//! - [`Overrides`] (`overrides/`): overrides set through the API.
//! - [`Top`] (`denials/`): the denials callers saw, counted for the top list.
//!
//! The policies in force are also written to the database, compiled
//! (`compiled.rs`), for pglimit's SQL functions ([`Shared::publish`]).
//!
//! Each holds an `Arc` of [`Shared`]: the store, the policies in force, the
//! API overrides in force and the key secret, so that a reload or a new
//! override reaches every service at once.

mod actions;
mod checks;
mod compiled;
mod denials;
mod explain;
mod key;
mod leases;
mod outcomes;
mod overrides;
mod request;
mod shared;
mod waiting;

pub use actions::{Actions, BlockRequest};
pub use checks::{
    seconds_until, Applied, BucketDecision, Checks, Decision, Granted, Matched, MatchedBy, Plan,
};
pub use compiled::compile;
pub use denials::{Denial, Tally, Top, FLUSH_EVERY};
pub use explain::{Explain, Explanation, Reason, KEY_PREFIX_HEX};
pub use key::{bucket_key, KeyScope, KeySecret, MIN_SECRET_LEN};
pub use leases::{refused_leasing, Leases};
pub use overrides::{OverrideError, OverrideRequest, Overrides};
pub use request::{CheckError, CheckRequest, Invalid, MAX_KEY_LEN, MAX_REASON_LEN};
pub use shared::Shared;
pub use waiting::{Queues, WaitLimits, Waiting};
