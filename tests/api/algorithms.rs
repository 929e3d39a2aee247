//! The four algorithms through Postgres: the SQL agrees with the model,
//! every algorithm is exact across instances, and mixes all or nothing.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{check, fresh_database, instance, unique};
use axum::http::StatusCode;
use chrono::{DateTime, TimeDelta, Utc};
use pglimit::algorithm::{decide, Algorithm, State};
use pglimit::storage::{BucketSpec, Check, MemoryFallback};
use serde_json::json;

const ALGORITHMS: [&str; 4] = ["fixed_window", "sliding_window", "sliding_log", "token_bucket"];

fn spec(n: u8, algorithm: Algorithm, limit: u64, window_ms: u64) -> BucketSpec {
    let mut key = [0u8; 32];
    key[0] = n;
    key[1..9].copy_from_slice(&rand::random::<u64>().to_be_bytes());
    BucketSpec {
        name: Arc::from(format!("b{n}")),
        key,
        limit,
        window: Duration::from_millis(window_ms),
        algorithm,
        lockout: None,
        calendar: None,
    }
}

#[tokio::test]
async fn every_algorithm_admits_its_limit_through_post_check() {
    let app = crate::common::app().await;
    for algorithm in ALGORITHMS {
        let body = json!({ "key": unique(algorithm), "limit": 3, "window": "1h", "algorithm": algorithm });
        for n in 1..=3 {
            let reply = check(&app, body.clone()).await;
            assert_eq!(reply.status, StatusCode::OK, "{algorithm} request {n}");
            assert_eq!(reply.body["remaining"], 3 - n, "{algorithm}");
            assert_eq!(reply.body["buckets"][0]["algorithm"], algorithm);
        }
        let reply = check(&app, body).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{algorithm}");
        let retry = reply.body["retry_after_s"].as_u64().unwrap();
        // Fixed and log: a window from the first request; token bucket: one
        // token every 20 minutes; sliding counter: its windows are aligned
        // on the clock, and with 3 of 3 used the estimate has room again
        // the moment the next hour starts.
        let expected = match algorithm {
            "token_bucket" => 1200,
            "sliding_window" => 3600 - Utc::now().timestamp() as u64 % 3600,
            _ => 3600,
        };
        assert!(
            retry <= expected && retry + 2 >= expected,
            "{algorithm}: retry after {retry}, expected ~{expected}"
        );
        assert_eq!(reply.header("retry-after"), retry.to_string());
    }
}

/// Concurrent one-bucket checks of the sliding window, the sliding log and
/// the token bucket on distinct keys share the lane's batches, which the
/// algorithms' upsert decides: each is admitted, then denied, with the
/// model's figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn algorithms_mixed_in_one_batch_decide_exactly_as_the_model() {
    let url = fresh_database().await;
    let pg = crate::common::pg_store(&url).await;
    crate::common::forbid_retries_with_locks(&url).await;
    let counter = crate::common::count_calls(&url).await;
    let kinds = [Algorithm::SlidingWindow, Algorithm::SlidingLog, Algorithm::TokenBucket];
    let specs: Vec<BucketSpec> = (0..150).map(|i| spec(i as u8, kinds[i % 3], 2, 60_000)).collect();
    let mut models: Vec<Option<State>> = vec![None; specs.len()];
    let start: DateTime<Utc> = "2031-06-01T00:00:00.5Z".parse().unwrap();
    for (wave, after_ms) in [0, 7, 13].into_iter().enumerate() {
        let now = start + TimeDelta::milliseconds(after_ms);
        let batches: Vec<Check> = (specs.iter())
            .map(|s| Check {
                buckets: vec![s.clone()],
                cost: 1,
                fallback: MemoryFallback::Refuse,
                lease: None,
            })
            .collect();
        let answers = futures_util::future::join_all(batches.iter().map(|b| pg.check_as_of(b, now))).await;
        for (i, answer) in answers.into_iter().enumerate() {
            let (s, model) = (&specs[i], &mut models[i]);
            let got = &answer.expect("postgres answers").buckets[0];
            let want = decide(s.params(), model.as_ref(), 1, now.timestamp_micros(), true);
            let at = format!("wave {wave}, check {i} ({:?})", s.algorithm);
            assert_eq!(got.allowed, want.allowed, "allowed, {at}");
            assert_eq!(got.allowed, wave < 2, "a limit of 2 admits two waves, {at}");
            let held = decide(s.params(), model.as_ref(), 1, now.timestamp_micros(), false);
            // A denied one-bucket check reports less than its cost left.
            let remaining = if want.allowed { want.remaining } else { 0 };
            assert_eq!(got.remaining, remaining, "remaining, {at}");
            assert_eq!(got.retry_at.map(|t| t.timestamp_micros()), held.retry_us, "retry_at, {at}");
            if want.allowed {
                *model = Some(want.next);
            }
            let full = decide(s.params(), model.as_ref(), 0, now.timestamp_micros(), false).full_us;
            assert_eq!(got.reset_at.timestamp_micros(), full, "reset_at, {at}");
        }
    }
    let calls = crate::common::calls(&counter).await;
    assert!(calls < 150, "{calls} calls for 450 checks: the checks were not batched together");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_algorithm_is_exact_across_three_instances() {
    let url = fresh_database().await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(instance(&url, &[]).await);
    }
    for algorithm in ALGORITHMS {
        let key = unique(algorithm);
        let tasks: Vec<_> = (0..150)
            .map(|i| {
                let app = apps[i % 3].clone();
                let body = json!({ "key": key, "limit": 40, "window": "1h", "algorithm": algorithm });
                tokio::spawn(async move { check(&app, body).await })
            })
            .collect();
        let mut allowed = 0;
        for task in tasks {
            let reply = task.await.unwrap();
            assert_eq!(reply.body["store"], "postgres", "{algorithm}");
            if reply.status == StatusCode::OK {
                allowed += 1;
            }
        }
        assert_eq!(allowed, 40, "{algorithm}");
    }
}

#[tokio::test]
async fn a_policy_may_mix_algorithms_and_stays_all_or_nothing() {
    let file = crate::common::policy_file(
        r#"
        [policies.api]
        identifiers = { account = "text" }
        [[policies.api.buckets]]
        name = "burst"
        on = ["account"]
        algorithm = "token_bucket"
        limit = 5
        window = "1m"
        [[policies.api.buckets]]
        name = "hourly"
        on = ["account"]
        algorithm = "sliding_log"
        limit = 3
        window = "1h"
        "#,
    );
    let app = instance(&fresh_database().await, &[("PGLIMIT_POLICIES", file.to_str().unwrap())]).await;
    let body = json!({ "policy": "api", "identifiers": { "account": "acct_1" } });
    for _ in 0..3 {
        assert_eq!(check(&app, body.clone()).await.status, StatusCode::OK);
    }
    for _ in 0..4 {
        let reply = check(&app, body.clone()).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            reply.body["buckets"][0]["remaining"], 2,
            "the token bucket lost nothing to denied checks"
        );
        assert_eq!(reply.body["buckets"][1]["allowed"], false);
    }
    let _ = std::fs::remove_file(&file);
}

#[tokio::test]
async fn sliding_log_limits_above_the_bound_are_refused_with_a_reason() {
    let app = crate::common::app().await;
    let reply =
        check(&app, json!({ "key": "k", "limit": 1001, "window": "1h", "algorithm": "sliding_log" })).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.body["field"], "limit");
    assert!(reply.body["detail"].as_str().unwrap().contains("at most 1000"));
    let reply = check(&app, json!({ "key": "k", "limit": 5, "window": "1h", "algorithm": "leaky" })).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.body["field"], "algorithm");
}

/// Both rows are written as of 10 ms after a clock-aligned boundary (the
/// store takes a clock for replays), so their lifetimes are known exactly:
/// each cleanup runs 100 ms after one row's end and, for the first, almost
/// a whole window before the other's, whenever the writes really happened.
#[tokio::test]
async fn cleanup_keeps_a_sliding_window_row_for_two_windows() {
    let pg = crate::common::pg_store(&fresh_database().await).await;
    let window_ms = 2_000;
    let window = TimeDelta::milliseconds(window_ms as i64);
    let sliding = spec(1, Algorithm::SlidingWindow, 10, window_ms);
    let fixed = spec(2, Algorithm::FixedWindow, 10, window_ms);
    let now = Utc::now();
    let boundary =
        now - TimeDelta::milliseconds(now.timestamp_millis().rem_euclid(window_ms as i64)) + window;
    let at = boundary + TimeDelta::milliseconds(10);
    for s in [&sliding, &fixed] {
        let batch =
            Check { buckets: vec![s.clone()], cost: 1, fallback: MemoryFallback::Refuse, lease: None };
        pg.check_as_of(&batch, at).await.expect("postgres answers");
    }
    let until = |t: DateTime<Utc>| (t - Utc::now()).to_std().unwrap_or_default() + Duration::from_millis(100);
    // The fixed row lives one window from its check; the sliding row to the
    // end of the next aligned window, where it still weighs as the previous one.
    tokio::time::sleep(until(at + window)).await;
    assert_eq!(pg.cleanup().await.expect("cleanup"), 1, "the fixed row is gone, the sliding row stays");
    tokio::time::sleep(until(boundary + window * 2)).await;
    assert_eq!(pg.cleanup().await.expect("cleanup"), 1, "then the sliding row goes too");
}

/// `Algorithm::code` and `pglimit_decide` agree on which code is which
/// algorithm: on a state where they all answer differently, each code gives
/// its own algorithm's answer in SQL; any other code is an error, not a
/// silent default.
#[tokio::test]
async fn each_algorithm_code_selects_the_same_algorithm_in_sql() {
    let url = fresh_database().await;
    let _migrated = crate::common::pg_store(&url).await;
    let pool = crate::common::functions_pool(&url).await;
    let window: i64 = 10_000_000;
    let now = 1_000 * window + window / 2;
    let state = State {
        count: 3,
        prev: 4,
        expires_us: now + window,
        tat_us: now + 4_000_000,
        log: vec![now - 2, now - 1],
    };
    let decide_in_sql = |code: i16| {
        sqlx::query_as::<_, (bool, i64, i64, Option<i64>, i64)>(
            "SELECT allowed, remaining, full_us, retry_us, n_expires
             FROM pglimit_decide($1, $2, $3, $4, $5, $6, 5, $7, 1, $8, false)",
        )
        .bind(code)
        .bind(state.count as i64)
        .bind(state.prev as i64)
        .bind(state.expires_us)
        .bind(state.tat_us)
        .bind(&state.log)
        .bind(window)
        .bind(now)
        .fetch_one(&pool)
    };
    let mut answers = std::collections::HashSet::new();
    for algorithm in Algorithm::ALL {
        let params = pglimit::algorithm::Params { algorithm, limit: 5, window_us: window, calendar: None };
        let want = decide(params, Some(&state), 1, now, false);
        let want = (want.allowed, want.remaining as i64, want.full_us, want.retry_us, want.next.expires_us);
        let got = decide_in_sql(algorithm.code()).await.expect("pglimit_decide answers");
        assert_eq!(got, want, "{algorithm:?} (code {})", algorithm.code());
        answers.insert(want);
    }
    assert_eq!(answers.len(), Algorithm::ALL.len(), "the state tells the algorithms apart");
    for unknown in [-1, 5] {
        let err = decide_in_sql(unknown).await.expect_err("an unknown code is refused");
        assert!(err.to_string().contains("unknown algorithm code"), "{err}");
    }
}
