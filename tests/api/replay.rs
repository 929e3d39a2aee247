//! Every way the SQL decides, replayed against the model on random traces
//! (`tests/common/replay.rs`): the three plain upserts and the two batch
//! functions; the Citus tier replays the workers' function.

use pglimit::storage::{Pooler, Reach};

use crate::common::calendar_replay::{replay_calendar, CalendarShape};
use crate::common::replay::{record_statements, replay, seen, Path, Shape, SHAPES};
use crate::common::{forbid_retries_with_locks, fresh_database, functions_pool, pg_store_through};

/// Through the store, directly and as behind a transaction pooler (where the
/// batch functions take every batch), each shape taking the statement the
/// lane picks for it; a peek (cost 0) takes `pglimit_check_distinct`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_statement_the_lane_sends_decides_exactly_as_the_model() {
    let direct = [
        ["pglimit_check_distinct", "upsert.sql"],
        ["algorithms_upsert.sql", "pglimit_check_distinct"],
        ["pglimit_check_distinct", "policy_upsert.sql"],
        ["pglimit_check_distinct", "pglimit_check_distinct"],
    ];
    for pooler in [Pooler::None, Pooler::Transaction] {
        let url = fresh_database().await;
        let store = pg_store_through(&url, Reach { pooler, schema: None }).await;
        // With one writer no row changes under an upsert: a retry with locks
        // would hide a conflict branch that disagrees with its answer.
        forbid_retries_with_locks(&url).await;
        let log = record_statements(&url).await;
        for (n, (shape, statements)) in SHAPES.into_iter().zip(direct).enumerate() {
            replay(Path::Store(&store), &log, shape, 11 + n as u64).await;
            let mut want =
                if pooler == Pooler::None { statements.to_vec() } else { vec!["pglimit_check_distinct"] };
            want.dedup();
            assert_eq!(seen(&log).await, want, "{pooler:?}, {shape:?}");
        }
    }
}

/// Both batch functions called directly, `pglimit_check_batch` (bucket by
/// bucket, for a batch with a key twice) included.
#[tokio::test]
async fn both_batch_functions_decide_exactly_as_the_model() {
    let url = fresh_database().await;
    let _migrated = crate::common::pg_store(&url).await;
    let pool = functions_pool(&url).await;
    for (f, function) in ["pglimit_check_batch", "pglimit_check_distinct"].into_iter().enumerate() {
        for (n, shape) in SHAPES.into_iter().enumerate() {
            // A seed of its own: another would replay the same keys.
            replay(Path::Function(&pool, function), &pool, shape, 31 + 10 * f as u64 + n as u64).await;
        }
    }
}

/// Calendar windows, alone and beside other algorithms, on traces across
/// daylight-saving changes and month ends: through the store, directly and
/// behind a transaction pooler (a batch function takes them either way: the
/// plain upserts know only windows of a fixed length), and through both
/// batch functions by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calendar_windows_decide_exactly_as_the_model_on_every_path() {
    let shapes = [CalendarShape::Alone, CalendarShape::Mixed];
    for pooler in [Pooler::None, Pooler::Transaction] {
        let url = fresh_database().await;
        let store = pg_store_through(&url, Reach { pooler, schema: None }).await;
        let log = record_statements(&url).await;
        for (n, shape) in shapes.into_iter().enumerate() {
            replay_calendar(Path::Store(&store), &log, shape, 51 + n as u64).await;
            assert_eq!(seen(&log).await, ["pglimit_check_distinct"], "{pooler:?}, {shape:?}");
        }
    }
    let url = fresh_database().await;
    let _migrated = crate::common::pg_store(&url).await;
    let pool = functions_pool(&url).await;
    for (f, function) in ["pglimit_check_batch", "pglimit_check_distinct"].into_iter().enumerate() {
        for (n, shape) in shapes.into_iter().enumerate() {
            replay_calendar(Path::Function(&pool, function), &pool, shape, 61 + 10 * f as u64 + n as u64)
                .await;
        }
    }
}

/// Concurrency buckets (with another bucket, of every algorithm, a
/// concurrency one included) through the store, directly and behind a
/// transaction pooler, and through both batch functions by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_buckets_decide_exactly_as_the_model_on_every_path() {
    for (n, pooler) in [Pooler::None, Pooler::Transaction].into_iter().enumerate() {
        let url = fresh_database().await;
        let store = pg_store_through(&url, Reach { pooler, schema: None }).await;
        let log = record_statements(&url).await;
        replay(Path::Store(&store), &log, Shape::Leased, 71 + n as u64).await;
        assert_eq!(seen(&log).await, vec!["pglimit_check_distinct"], "{pooler:?}");
    }
    let url = fresh_database().await;
    let _migrated = crate::common::pg_store(&url).await;
    let pool = functions_pool(&url).await;
    for (f, function) in ["pglimit_check_batch", "pglimit_check_distinct"].into_iter().enumerate() {
        replay(Path::Function(&pool, function), &pool, Shape::Leased, 81 + f as u64).await;
    }
}
