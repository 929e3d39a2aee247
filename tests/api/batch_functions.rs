//! The two batch functions, called directly: `pglimit_check_distinct` (the
//! set-based one the lane sends when no key appears twice) must answer and
//! store exactly what `pglimit_check_batch` (bucket by bucket) does. The
//! random traces of `algorithms.rs` compare the lane's path with the model.

use chrono::{DateTime, TimeDelta, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;

use crate::common::{fresh_database, pg_store};

/// One bucket of a call, as the functions take it.
#[derive(Clone)]
struct Bucket {
    key: Vec<u8>,
    limit: i64,
    window_ms: i64,
    algo: i16,
    block_for_ms: i64,
    name: Option<String>,
}

/// One row of a function's answer.
type Answer = (i32, bool, i64, DateTime<Utc>, Option<DateTime<Utc>>, DateTime<Utc>, bool);

/// Calls `function` for `checks` (each a cost and its buckets) at `now`.
async fn call(
    pool: &PgPool,
    function: &str,
    checks: &[(i64, Vec<&Bucket>)],
    now: DateTime<Utc>,
) -> Vec<Answer> {
    let rows =
        || checks.iter().enumerate().flat_map(|(i, (cost, bs))| bs.iter().map(move |b| (i, *cost, *b)));
    let sql = format!("SELECT * FROM {function}($1, $2, $3, $4, $5, $6, $7, $8, $9) ORDER BY o_pos");
    sqlx::query_as(&sql)
        .bind(rows().map(|(i, _, _)| i as i32).collect::<Vec<_>>())
        .bind(rows().map(|(_, _, b)| b.key.clone()).collect::<Vec<_>>())
        .bind(rows().map(|(_, _, b)| b.limit).collect::<Vec<_>>())
        .bind(rows().map(|(_, _, b)| b.window_ms).collect::<Vec<_>>())
        .bind(rows().map(|(_, _, b)| b.algo).collect::<Vec<_>>())
        .bind(rows().map(|(_, cost, _)| cost).collect::<Vec<_>>())
        .bind(rows().map(|(_, _, b)| b.block_for_ms).collect::<Vec<_>>())
        .bind(rows().map(|(_, _, b)| b.name.clone()).collect::<Vec<_>>())
        .bind(now)
        .fetch_all(pool)
        .await
        .unwrap_or_else(|e| panic!("{function}: {e}"))
}

/// What the database holds for `key`: its bucket row and its block.
async fn stored(pool: &PgPool, key: &[u8]) -> String {
    let sql = "SELECT format('%s %s %s %s %s | %s %s', b.count, b.prev_count, b.expires_at, b.tat_us, b.log,
                             k.until, k.kind)
               FROM pglimit_buckets b FULL JOIN pglimit_blocks k ON k.key = b.key
               WHERE coalesce(b.key, k.key) = $1";
    let row: Option<(String,)> =
        sqlx::query_as(sql).bind(key).fetch_optional(pool).await.expect("stored row");
    row.map_or_else(|| "none".to_string(), |(s,)| s)
}

/// An operator's block, as `POST /admin/blocks` leaves it.
const BLOCK: &str = "INSERT INTO pglimit_blocks (key, until, kind) VALUES ($1, $2, 'admin')
                     ON CONFLICT (key) DO UPDATE SET until = EXCLUDED.until, kind = 'admin'";

/// A bucket and its twin: the same settings on another key.
fn twins(rng: &mut StdRng, slot: u8) -> (Bucket, Bucket) {
    let mut key = [0u8; 32];
    key[0] = slot;
    rng.fill(&mut key[2..]);
    let lockout = rng.gen_bool(0.3);
    let a = Bucket {
        key: key.to_vec(),
        limit: rng.gen_range(1..6),
        window_ms: rng.gen_range(200..3_000),
        algo: rng.gen_range(0..4),
        block_for_ms: if lockout { rng.gen_range(100..2_000) } else { 0 },
        name: lockout.then(|| format!("p/b{slot}")),
    };
    key[1] = 1;
    (a.clone(), Bucket { key: key.to_vec(), ..a })
}

/// One time in `one_in`, an operator's block on a random slot's twin keys,
/// ending within 2 s of `now`.
async fn block_now_and_then(
    rng: &mut StdRng,
    pool: &PgPool,
    slots: &[(Bucket, Bucket)],
    now: DateTime<Utc>,
    one_in: u32,
) {
    if !rng.gen_ratio(1, one_in) {
        return;
    }
    let (a, b) = &slots[rng.gen_range(0..slots.len())];
    let until = now + TimeDelta::milliseconds(rng.gen_range(0..2_000));
    for key in [&a.key, &b.key] {
        sqlx::query(BLOCK).bind(key).bind(until).execute(pool).await.expect("a block");
    }
}

/// Counts `answers` by branch: denied, admitted, blocked (and both).
fn tally(seen: &mut [usize; 4], answers: &[Answer]) {
    for (_, allowed, _, _, _, _, blocked) in answers {
        seen[usize::from(*allowed) + 2 * usize::from(*blocked)] += 1;
    }
}

/// Denied, admitted, blocked: the trace went through every branch.
fn assert_every_branch(seen: &[usize; 4]) {
    assert!([seen[0], seen[1], seen[2]].iter().all(|&n| n > 20), "seen (denied, allowed, blocked): {seen:?}");
}

/// Random batches of checks with one to three buckets each (no key twice in
/// a batch), over every algorithm, costs 0 to 3, lockouts and an operator's
/// blocks, sent to both functions on twin keys at the same clock.
#[tokio::test]
async fn both_batch_functions_answer_and_store_alike_on_random_batches() {
    let url = fresh_database().await;
    let _migrated = pg_store(&url).await;
    let pool = crate::common::functions_pool(&url).await;
    let mut rng = StdRng::seed_from_u64(23);
    let slots: Vec<(Bucket, Bucket)> = (0..16).map(|s| twins(&mut rng, s)).collect();
    let mut now: DateTime<Utc> = "2032-03-01T00:00:00.250001Z".parse().unwrap();
    let mut seen = [0usize; 4];
    for round in 0..400 {
        now += TimeDelta::microseconds(rng.gen_range(0..500_000));
        block_now_and_then(&mut rng, &pool, &slots, now, 20).await;
        let mut order: Vec<usize> = (0..slots.len()).collect();
        order.sort_by_key(|_| rng.gen::<u32>());
        let mut free = order.into_iter();
        let (mut general, mut distinct) = (Vec::new(), Vec::new());
        for _ in 0..rng.gen_range(1..5) {
            let picked: Vec<usize> = free.by_ref().take(rng.gen_range(1..4)).collect();
            let cost = rng.gen_range(0..4);
            general.push((cost, picked.iter().map(|&s| &slots[s].0).collect()));
            distinct.push((cost, picked.iter().map(|&s| &slots[s].1).collect()));
        }
        let want = call(&pool, "pglimit_check_batch", &general, now).await;
        let got = call(&pool, "pglimit_check_distinct", &distinct, now).await;
        assert_eq!(got, want, "round {round}: the answers differ");
        tally(&mut seen, &got);
    }
    assert_every_branch(&seen);
    for (s, (a, b)) in slots.iter().enumerate() {
        assert_eq!(
            stored(&pool, &b.key).await,
            stored(&pool, &a.key).await,
            "slot {s}: the stored state differs"
        );
    }
    pool.close().await;
}

/// The one-bucket upserts, as the lane sends them: `upsert.sql` when no
/// key appears twice, `hot_upsert.sql` when some key does.
fn upsert(name: &str) -> &'static str {
    pglimit::storage::single_node_statement(name).unwrap_or_else(|| panic!("{name} fills"))
}

/// Calls a one-bucket `upsert` for `checks` (each a cost and its bucket) at `now`.
async fn call_upsert(
    pool: &PgPool,
    upsert: &str,
    checks: &[(i64, &Bucket)],
    now: DateTime<Utc>,
) -> Vec<Answer> {
    sqlx::query_as(upsert)
        .bind(checks.iter().map(|(_, b)| b.key.clone()).collect::<Vec<_>>())
        .bind(checks.iter().map(|(_, b)| b.limit).collect::<Vec<_>>())
        .bind(checks.iter().map(|(_, b)| b.window_ms).collect::<Vec<_>>())
        .bind(checks.iter().map(|(cost, _)| *cost).collect::<Vec<_>>())
        .bind(now)
        .fetch_all(pool)
        .await
        .unwrap_or_else(|e| panic!("a one-bucket upsert: {e}"))
}

/// Random batches of one-bucket fixed-window checks on a few keys, each
/// with one cost a batch (up to its limit), and an operator's blocks: the
/// hot-key upsert, with keys repeated, answers and counts as
/// `pglimit_check_batch` does check by check, on twin keys at the same clock.
#[tokio::test]
async fn the_hot_key_upsert_decides_repeated_keys_as_the_general_function_does() {
    replay_one_bucket(upsert("hot_upsert.sql"), true, 29).await;
}

/// The same for `upsert.sql`, each key once a batch.
#[tokio::test]
async fn the_one_bucket_upsert_decides_as_the_general_function_does() {
    replay_one_bucket(upsert("upsert.sql"), false, 31).await;
}

async fn replay_one_bucket(upsert: &str, repeats: bool, seed: u64) {
    let url = fresh_database().await;
    let _migrated = pg_store(&url).await;
    let pool = crate::common::functions_pool(&url).await;
    let mut rng = StdRng::seed_from_u64(seed);
    let slots: Vec<(Bucket, Bucket)> = (0..if repeats { 3 } else { 6 })
        .map(|s| {
            let (a, b) = twins(&mut rng, s);
            let fixed = |b: Bucket| Bucket { algo: 0, block_for_ms: 0, name: None, limit: b.limit * 2, ..b };
            (fixed(a), fixed(b))
        })
        .collect();
    let mut now: DateTime<Utc> = "2032-03-01T00:00:00.250001Z".parse().unwrap();
    let mut seen = [0usize; 4];
    for round in 0..300 {
        now += TimeDelta::microseconds(rng.gen_range(0..400_000));
        block_now_and_then(&mut rng, &pool, &slots, now, 12).await;
        let costs: Vec<i64> = slots.iter().map(|(a, _)| rng.gen_range(1..=a.limit.min(3))).collect();
        let mut picked: Vec<usize> =
            (0..rng.gen_range(1..12)).map(|_| rng.gen_range(0..slots.len())).collect();
        if !repeats {
            picked.sort_unstable();
            picked.dedup();
        }
        let mine: Vec<(i64, &Bucket)> = picked.iter().map(|&s| (costs[s], &slots[s].0)).collect();
        let general: Vec<(i64, Vec<&Bucket>)> =
            picked.iter().map(|&s| (costs[s], vec![&slots[s].1])).collect();
        let want = call(&pool, "pglimit_check_batch", &general, now).await;
        let got = call_upsert(&pool, upsert, &mine, now).await;
        assert_eq!(got, want, "round {round}: the answers differ");
        tally(&mut seen, &got);
    }
    assert_every_branch(&seen);
    let counted = "SELECT format('%s %s', count, expires_at) FROM pglimit_buckets WHERE key = $1";
    for (s, (a, b)) in slots.iter().enumerate() {
        let row = |key: &Vec<u8>| sqlx::query_scalar::<_, String>(counted).bind(key.clone()).fetch_one(&pool);
        assert_eq!(row(&a.key).await.ok(), row(&b.key).await.ok(), "slot {s}: the counts differ");
    }
    pool.close().await;
}

/// A call whose clock is behind another's (its transaction began first,
/// then waited for a row lock) must not take from a window that ends at the
/// other's clock: the row a batch function creates to lock a new key, and
/// leaves unwritten (a peek), is over for every clock.
#[tokio::test]
async fn a_take_at_an_earlier_clock_after_a_peek_on_a_new_key_still_counts() {
    let url = fresh_database().await;
    let _migrated = pg_store(&url).await;
    let pool = crate::common::functions_pool(&url).await;
    let at: DateTime<Utc> = "2032-03-01T00:00:00Z".parse().unwrap();
    let earlier = at - TimeDelta::seconds(1);
    for (n, function) in ["pglimit_check_batch", "pglimit_check_distinct"].into_iter().enumerate() {
        let key = vec![0xc0 + n as u8; 32];
        let bucket = Bucket { key, limit: 5, window_ms: 60_000, algo: 0, block_for_ms: 0, name: None };
        call(&pool, function, &[(0, vec![&bucket])], at).await;
        let taken = call(&pool, function, &[(1, vec![&bucket])], earlier).await;
        assert_eq!(taken[0].3, earlier + TimeDelta::minutes(1), "{function}: a window of its own");
        let next = call(&pool, function, &[(1, vec![&bucket])], at + TimeDelta::milliseconds(1)).await;
        let row = stored(&pool, &bucket.key).await;
        assert_eq!(next[0].2, 3, "{function}: the earlier take still counts: {row}");
    }
    pool.close().await;
}
