//! pglimit's SQL functions (`pglimit.check`, `enforce`, `reset`) called
//! through PgBouncer in transaction mode, as an application behind the
//! pooler calls them: from many client connections that share a few
//! server connections, each statement perhaps on another one. The
//! policies are written by an instance started through the same pooler.

use std::collections::BTreeMap;

use serde_json::Value;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Row;

use super::{behind, pooled_instance};
use crate::common::pgbouncer::{Mode, PgBouncer};
use crate::common::stoppable::SERIAL;
use crate::common::unique;

/// More client connections than PgBouncer's transaction pool has server
/// connections (3), so that statements of different clients take turns.
const CLIENTS: u32 = 12;

/// A pool of CLIENTS connections to `pooled`.
async fn clients(pooled: &str) -> PgPool {
    let pool = PgPoolOptions::new().max_connections(CLIENTS).min_connections(CLIENTS).connect(pooled).await;
    pool.expect("connect through PgBouncer")
}

/// `sql` sent `times` times at once on `pool`, each in the simple protocol
/// as its own implicit transaction (no prepared statement, which a
/// transaction pooler could send to another server connection): for each,
/// `allowed` or the error's SQLSTATE.
async fn all_at_once(pool: &PgPool, sql: &str, times: usize) -> Vec<Result<bool, String>> {
    let mut sent = tokio::task::JoinSet::new();
    for _ in 0..times {
        let (pool, sql) = (pool.clone(), sql.to_owned());
        sent.spawn(async move {
            match sqlx::raw_sql(&sql).fetch_one(&pool).await {
                Ok(row) => Ok(row.get::<bool, _>("allowed")),
                Err(sqlx::Error::Database(e)) => Err(e.code().map(|c| c.into_owned()).unwrap_or_default()),
                Err(e) => panic!("{sql}: {e}"),
            }
        });
    }
    let mut answers = Vec::with_capacity(times);
    while let Some(answer) = sent.join_next().await {
        answers.push(answer.expect("a call"));
    }
    answers
}

/// How many answers were each outcome: "allowed", "denied" or a SQLSTATE.
fn tally(answers: &[Result<bool, String>]) -> BTreeMap<String, usize> {
    let mut tally = BTreeMap::new();
    for answer in answers {
        let outcome = match answer {
            Ok(true) => "allowed".to_string(),
            Ok(false) => "denied".to_string(),
            Err(code) => code.clone(),
        };
        *tally.entry(outcome).or_insert(0) += 1;
    }
    tally
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect()
}

/// A fresh database behind a transaction pooler, its policies written by an
/// instance started through it, and the clients' pool; PgBouncer stops
/// when the first is dropped.
async fn behind_a_transaction_pooler() -> (PgBouncer, pglimit::AppState, PgPool) {
    let (bouncer, _, pooled) = behind(Mode::Transaction).await;
    let app = pooled_instance(&pooled, Mode::Transaction, &[("PGLIMIT_SQL", "on")]).await;
    let pool = clients(&pooled).await;
    (bouncer, app, pool)
}

fn login(email: &str) -> String {
    format!(r#"'login', '{{"email": "{email}", "ip": "203.0.113.9"}}'"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_sql_checks_made_at_once_admit_exactly_the_limit() {
    let _serial = SERIAL.lock().await;
    let (_bouncer, _app, pool) = behind_a_transaction_pooler().await;
    let key = unique("sql-shared");
    let adhoc = format!("SELECT allowed FROM pglimit.check('{key}', 10, '1h', 'fixed_window')");
    assert_eq!(tally(&all_at_once(&pool, &adhoc, 40).await), counts(&[("allowed", 10), ("denied", 30)]));
    let email = format!("{}@example.com", unique("alice"));
    let policy = format!("SELECT allowed FROM pglimit.check({})", login(&email));
    let answers = all_at_once(&pool, &policy, 9).await;
    assert_eq!(tally(&answers), counts(&[("allowed", 5), ("denied", 4)]), "email_ip's limit of 5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_sql_enforce_raises_rl429_past_the_limit_until_a_reset() {
    let _serial = SERIAL.lock().await;
    let (_bouncer, _app, pool) = behind_a_transaction_pooler().await;
    let key = unique("sql-enforced");
    let enforce = format!("SELECT allowed FROM pglimit.enforce('{key}', 4, '1h', 'fixed_window')");
    let reset = format!("SELECT remaining FROM pglimit.reset('{key}', 4, '1h', 'fixed_window')");
    let email = format!("{}@example.com", unique("bob"));
    let enforce_login = format!("SELECT allowed FROM pglimit.enforce({})", login(&email));
    let reset_login = format!("SELECT remaining FROM pglimit.reset({})", login(&email));
    for round in ["before a reset", "after a reset"] {
        let answers = all_at_once(&pool, &enforce, 12).await;
        assert_eq!(tally(&answers), counts(&[("allowed", 4), ("RL429", 8)]), "{round}");
        let answers = all_at_once(&pool, &enforce_login, 9).await;
        assert_eq!(tally(&answers), counts(&[("allowed", 5), ("RL429", 4)]), "login {round}");
        let full = sqlx::raw_sql(&reset).fetch_one(&pool).await.expect("reset the ad hoc key");
        assert_eq!(full.get::<i64, _>(0), 4, "the reset's peek");
        let full = sqlx::raw_sql(&reset_login).fetch_one(&pool).await.expect("reset the login buckets");
        assert_eq!(full.get::<i64, _>(0), 5, "the reset's peek: email_ip full again");
    }
}

/// Checks made in transactions that roll back, at once from several
/// connections, each with bound parameters (in a transaction, PgBouncer
/// keeps one server connection for it): none is counted, so each sees the
/// buckets full, and a check committed after them takes the first unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_a_rolled_back_sql_check_is_not_counted() {
    let _serial = SERIAL.lock().await;
    let (_bouncer, _app, pool) = behind_a_transaction_pooler().await;
    let email = format!("{}@example.com", unique("carol"));
    let ids = serde_json::json!({ "email": email, "ip": "203.0.113.10" });
    let key = unique("sql-rolled-back");
    let check = |pool: PgPool, ids: Value, key: String, commit: bool| async move {
        let mut tx = pool.begin().await.expect("BEGIN through PgBouncer");
        let policy = sqlx::query("SELECT allowed, remaining FROM pglimit.check($1, $2)")
            .bind("login")
            .bind(&ids)
            .persistent(false)
            .fetch_one(&mut *tx)
            .await
            .expect("pglimit.check, policy form");
        let adhoc = sqlx::query("SELECT allowed, remaining FROM pglimit.check($1, $2, $3, $4)")
            .bind(&key)
            .bind(3_i64)
            .bind("1h")
            .bind("fixed_window")
            .persistent(false)
            .fetch_one(&mut *tx)
            .await
            .expect("pglimit.check, ad hoc form");
        if commit {
            tx.commit().await.expect("COMMIT");
        } else {
            tx.rollback().await.expect("ROLLBACK");
        }
        [policy, adhoc].map(|row| (row.get::<bool, _>("allowed"), row.get::<i64, _>("remaining")))
    };
    // More than either limit (email_ip's 5, the key's 3).
    let mut rolled_back = tokio::task::JoinSet::new();
    for _ in 0..8 {
        rolled_back.spawn(check(pool.clone(), ids.clone(), key.clone(), false));
    }
    while let Some(answer) = rolled_back.join_next().await {
        assert_eq!(answer.expect("a check"), [(true, 4), (true, 2)], "each saw the buckets full");
    }
    let committed = check(pool.clone(), ids, key, true).await;
    assert_eq!(committed, [(true, 4), (true, 2)], "no rolled-back check was counted");
}

/// A concurrency slot taken by pglimit.check through the pooler is given
/// back by pglimit.release on another connection, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_a_lease_from_sql_is_released_from_sql() {
    let _serial = SERIAL.lock().await;
    let (_bouncer, _app, pool) = behind_a_transaction_pooler().await;
    let slot =
        format!("SELECT allowed, lease FROM pglimit.check('{}', 1, '1h', 'concurrency')", unique("slot"));
    let held = sqlx::raw_sql(&slot).fetch_one(&pool).await.expect("take the slot");
    let lease: String = held.get("lease");
    assert!(held.get::<bool, _>("allowed"), "the first check takes the slot");
    assert_eq!(tally(&all_at_once(&pool, &slot, 4).await), counts(&[("denied", 4)]), "the slot is held");
    let release = format!("SELECT pglimit.release('{lease}')");
    for expected in [Some(true), Some(false)] {
        let released = sqlx::raw_sql(&release).fetch_one(&pool).await.expect("release");
        assert_eq!(released.get::<Option<bool>, _>(0), expected, "released, then already released");
    }
    assert_eq!(tally(&all_at_once(&pool, &slot, 4).await), counts(&[("allowed", 1), ("denied", 3)]));
}
