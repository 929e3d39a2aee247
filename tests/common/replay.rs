//! Seeded random traces replayed through one way of deciding in Postgres
//! and through the model (`pglimit::algorithm::decide`), every figure
//! compared: what holds each algorithm's SQL equal to its Rust.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use pglimit::algorithm::{decide, Algorithm, State, Verdict};
use pglimit::storage::{BucketSpec, Check, MemoryFallback, PgStore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;

/// Where the checks of a trace are decided.
#[derive(Clone, Copy)]
pub enum Path<'a> {
    /// Through a store, whose lane picks the statement by the batch's shape
    /// (in Citus mode, the workers' upserts or their function).
    Store(&'a PgStore),
    /// A batch function called by name: `pglimit_check_batch` or
    /// `pglimit_check_distinct` (the pool must find this build's functions).
    Function(&'a PgPool, &'static str),
}

impl Path<'_> {
    fn name(&self) -> &'static str {
        match self {
            Path::Store(_) => "store",
            Path::Function(_, function) => function,
        }
    }
}

/// What a trace's checks look like, which decides the statement a lane sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// One fixed window: the one-bucket upsert.
    OneFixed,
    /// One sliding window, sliding log or token bucket: the algorithms' upsert.
    OneOther,
    /// Two fixed windows: the policy upsert.
    FixedPolicy,
    /// Two buckets of different algorithms: a batch function.
    ///
    /// In every shape some checks cost 0 (a peek, which a batch function
    /// decides on the rows the upserts wrote).
    Mixed,
    /// A concurrency bucket and a bucket of another algorithm: a batch
    /// function (no upsert takes a lease). Not among [`SHAPES`], which the
    /// Citus tier replays too, where concurrency buckets are refused.
    Leased,
}

pub const SHAPES: [Shape; 4] = [Shape::OneFixed, Shape::OneOther, Shape::FixedPolicy, Shape::Mixed];

/// One answer per bucket, as a path gives it.
struct Got {
    allowed: bool,
    remaining: u64,
    reset_us: i64,
    retry_us: Option<i64>,
}

/// Replays 12 rounds of 50 checks of `shape` through `path`, seeded by
/// `seed`, and asserts that every answer is the model's and that no
/// admitted bucket's row ends before the model's state does (the cleanup
/// would forget what limits). `rows` reads the rows (any pool on the
/// database).
pub async fn replay(path: Path<'_>, rows: &PgPool, shape: Shape, seed: u64) {
    replay_on(path, rows, shape, seed, None).await;
}

/// [`replay`] with each check's buckets on the keys' first two bytes
/// `firsts` gives, in turn (`[n, n]`; Citus places a key by them), instead
/// of one random pair for all.
pub async fn replay_on(path: Path<'_>, rows: &PgPool, shape: Shape, seed: u64, firsts: Option<[u8; 2]>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut now: DateTime<Utc> = "2031-06-01T00:00:00.5Z".parse().expect("time");
    for round in 0..12 {
        let specs = buckets(&mut rng, shape, round, firsts);
        let mut model: Vec<Option<State>> = vec![None; specs.len()];
        // Every other round, steps in whole tenths of a second, so that a
        // step lands on a window's edge now and then.
        let coarse = round % 2 == 1;
        for step in 0..50 {
            let step_us = rng.gen_range(0..600_000);
            now += TimeDelta::microseconds(if coarse { step_us / 100_000 * 100_000 } else { step_us });
            // A plain upsert takes no check over its limit (nor a peek, of cost 0).
            let most = if matches!(shape, Shape::Mixed | Shape::Leased) {
                2
            } else {
                specs.iter().map(|s| s.limit).min().unwrap_or(1)
            };
            let cost = rng.gen_range(0..3).min(most);
            let at = format!("{shape:?} seed {seed} round {round} step {step}");
            check_step(path, rows, &specs, &mut model, cost, now, &at).await;
        }
        now += TimeDelta::seconds(100);
    }
}

/// Decides one check of `cost` on `specs` at `now` through `path` and
/// asserts that every figure is the model's (whose states `model` holds and
/// this moves on); `at` names the step in a failure.
pub async fn check_step(
    path: Path<'_>,
    rows: &PgPool,
    specs: &[BucketSpec],
    model: &mut [Option<State>],
    cost: u64,
    now: DateTime<Utc>,
    at: &str,
) {
    let got = decide_through(path, specs, cost, now).await;
    let at = |i: usize| format!("{at} bucket {i}, cost {cost}");
    let now_us = now.timestamp_micros();
    let admit = cost > 0
        && specs
            .iter()
            .zip(model.iter())
            .all(|(s, m)| decide(s.params(), m.as_ref(), cost, now_us, false).allowed);
    for (i, s) in specs.iter().enumerate() {
        let want = decide(s.params(), model[i].as_ref(), cost, now_us, admit);
        // A one-bucket upsert reads a denied check's figures from its
        // snapshot, and keeps `remaining` below the cost so that it
        // never contradicts the denial (upsert.rs).
        let capped = specs.len() == 1
            && !want.allowed
            && want.remaining.min(cost.saturating_sub(1)) == got[i].remaining;
        assert_eq!(got[i].allowed, want.allowed, "allowed, {}", at(i));
        assert!(
            got[i].remaining == want.remaining || capped,
            "remaining {} for {}, {}",
            got[i].remaining,
            want.remaining,
            at(i)
        );
        assert_eq!(got[i].reset_us, want.full_us, "reset_at, {}", at(i));
        assert_eq!(got[i].retry_us, want.retry_us, "retry_at, {}", at(i));
        if admit {
            assert_row_lasts(rows, s, &want, &at(i)).await;
            model[i] = Some(want.next);
        }
    }
}

/// The buckets of a round's trace: keys `[r, r, i, random...]`, the same
/// route `r` for every bucket (one worker, in Citus mode).
fn buckets(rng: &mut StdRng, shape: Shape, round: usize, firsts: Option<[u8; 2]>) -> Vec<BucketSpec> {
    let others = [Algorithm::SlidingWindow, Algorithm::SlidingLog, Algorithm::TokenBucket];
    let algorithms = match shape {
        Shape::OneFixed => vec![Algorithm::FixedWindow],
        Shape::OneOther => vec![others[round % 3]],
        Shape::FixedPolicy => vec![Algorithm::FixedWindow; 2],
        Shape::Mixed => vec![Algorithm::ALL[round % 4], Algorithm::ALL[(round + 1) % 4]],
        Shape::Leased => vec![Algorithm::Concurrency, Algorithm::ALL[round % 5]],
    };
    let route: u8 = rng.gen();
    let window_ms = |rng: &mut StdRng| {
        rng.gen_range(2..30) * 100 + if round % 2 == 1 { 0 } else { rng.gen_range(0..100) }
    };
    algorithms
        .into_iter()
        .enumerate()
        .map(|(i, algorithm)| {
            let mut key = [firsts.map_or(route, |f| f[i % 2]); 32];
            key[2] = i as u8;
            rng.fill(&mut key[3..]);
            BucketSpec {
                name: Arc::from(format!("b{i}")),
                key,
                limit: rng.gen_range(1..7),
                window: Duration::from_millis(window_ms(rng)),
                algorithm,
                lockout: None,
                calendar: None,
            }
        })
        .collect()
}

async fn decide_through(path: Path<'_>, specs: &[BucketSpec], cost: u64, now: DateTime<Utc>) -> Vec<Got> {
    match path {
        Path::Store(store) => {
            let batch =
                Check { buckets: specs.to_vec(), cost, fallback: MemoryFallback::Refuse, lease: None };
            let answer = store.check_as_of(&batch, now).await.expect("postgres answers");
            let got = |b: &pglimit::storage::BucketAnswer| Got {
                allowed: b.allowed,
                remaining: b.remaining,
                reset_us: b.reset_at.timestamp_micros(),
                retry_us: b.retry_at.map(|t| t.timestamp_micros()),
            };
            answer.buckets.iter().map(got).collect()
        }
        Path::Function(pool, function) => call(pool, function, specs, cost, now).await,
    }
}

/// A batch function's row: allowed, remaining, reset at, retry at.
type FunctionRow = (bool, i64, DateTime<Utc>, Option<DateTime<Utc>>);

/// One check through a batch function.
async fn call(
    pool: &PgPool,
    function: &str,
    specs: &[BucketSpec],
    cost: u64,
    now: DateTime<Utc>,
) -> Vec<Got> {
    let sql = format!(
        "SELECT o_allowed, o_remaining, o_reset_at, o_retry_at
         FROM {function}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ORDER BY o_pos"
    );
    let column = |f: fn(&BucketSpec) -> i64| specs.iter().map(f).collect::<Vec<_>>();
    let rows: Vec<FunctionRow> = sqlx::query_as(&sql)
        .bind(vec![0i32; specs.len()])
        .bind(specs.iter().map(|s| s.key.to_vec()).collect::<Vec<_>>())
        .bind(column(|s| s.limit as i64))
        .bind(column(|s| s.window.as_millis() as i64))
        .bind(specs.iter().map(|s| s.algorithm.code()).collect::<Vec<_>>())
        .bind(vec![cost as i64; specs.len()])
        .bind(vec![0i64; specs.len()])
        .bind(vec![None::<String>; specs.len()])
        .bind(now)
        .bind(specs.iter().map(|s| s.calendar.map(|c| c.zone.name())).collect::<Vec<_>>())
        .fetch_all(pool)
        .await
        .unwrap_or_else(|e| panic!("{function}: {e}"));
    let got = |(allowed, remaining, reset, retry): FunctionRow| Got {
        allowed,
        remaining: remaining as u64,
        reset_us: reset.timestamp_micros(),
        retry_us: retry.map(|t| t.timestamp_micros()),
    };
    rows.into_iter().map(got).collect()
}

/// The row of an admitted bucket ends no earlier than the model's state.
async fn assert_row_lasts(rows: &PgPool, spec: &BucketSpec, want: &Verdict, at: &str) {
    let (end,): (i64,) = sqlx::query_as(
        "SELECT (extract(epoch FROM expires_at) * 1000000)::bigint FROM pglimit_buckets WHERE key = $1",
    )
    .bind(spec.key.as_slice())
    .fetch_one(rows)
    .await
    .unwrap_or_else(|e| panic!("the row, {at}: {e}"));
    assert!(end >= want.next.expires_us, "the row ends before the model's state, {at}");
}

/// Records the statement that writes `pglimit_buckets` in each call (its
/// text, as the server received it) in a table `seen`, read by [`seen`].
pub async fn record_statements(url: &str) -> PgPool {
    let pool = PgPool::connect(url).await.expect("connect");
    for statement in [
        "CREATE TABLE seen (statement text NOT NULL)",
        "CREATE FUNCTION record_statement() RETURNS trigger LANGUAGE plpgsql AS
         $$ BEGIN INSERT INTO seen VALUES (current_query()); RETURN NULL; END $$",
        "CREATE TRIGGER record_statements AFTER INSERT ON pglimit_buckets
         FOR EACH STATEMENT EXECUTE FUNCTION record_statement()",
    ] {
        sqlx::query(statement).execute(&pool).await.expect("set up the statement log");
    }
    pool
}

/// Which statements decided since the last call, by name, once each.
pub async fn seen(pool: &PgPool) -> Vec<&'static str> {
    let texts: Vec<(String,)> =
        sqlx::query_as("DELETE FROM seen RETURNING statement").fetch_all(pool).await.expect("seen");
    let name = |text: &str| match () {
        _ if text.contains("pglimit_check_distinct(") => "pglimit_check_distinct",
        _ if text.contains("pglimit_check_batch(") => "pglimit_check_batch",
        _ if text.contains("PARTITION BY r.key") => "hot_upsert.sql",
        _ if text.contains("AS r(key, lim, win, cost, pos)") => "upsert.sql",
        _ if text.contains("AS r(key, lim, win, cost, algo, pos)") => "algorithms_upsert.sql",
        _ if text.contains("AS r(chk, key, lim, win, cost, algo, n, pos)") => "policy_upsert.sql",
        _ => "unknown",
    };
    let mut names: Vec<&'static str> = texts.iter().map(|(t,)| name(t)).collect();
    names.sort_unstable();
    names.dedup();
    names
}
