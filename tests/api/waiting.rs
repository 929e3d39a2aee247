//! `max_wait`: a check that would be denied is held until room comes back,
//! across two instances on one database. Every margin is a configured
//! window or `max_wait`, never a guess at how fast this machine is.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::common::{
    adhoc_key, call, check, fresh_database, instance, login, metric, policy_file, unique, Reply,
};
use pglimit::AppState;

/// The window of the tests' keys: short, so a turn comes soon.
const WINDOW: Duration = Duration::from_secs(1);

fn key_check(key: &str, algorithm: &str, window: Duration, max_wait: Option<Duration>) -> Value {
    let window = format!("{}ms", window.as_millis());
    let mut body = json!({ "key": key, "limit": 1, "window": window, "algorithm": algorithm });
    if let Some(wait) = max_wait {
        body["max_wait"] = json!(format!("{}ms", wait.as_millis()));
    }
    body
}

fn waited(reply: &Reply) -> Duration {
    let ms = reply.body["waited_ms"].as_u64().unwrap_or_else(|| panic!("no waited_ms in {}", reply.body));
    Duration::from_millis(ms)
}

async fn two_instances(extra: &[(&str, &str)]) -> (AppState, AppState) {
    let url = fresh_database().await;
    (instance(&url, extra).await, instance(&url, extra).await)
}

/// Until `app` holds `count` checks: how a test knows a waiter has arrived
/// without guessing how long arriving takes.
async fn until_held(app: &AppState, count: usize) {
    while app.waiting.queues().held() != count {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_check_is_admitted_when_the_window_turns_for_every_algorithm() {
    let (a, b) = two_instances(&[]).await;
    // A sliding window's previous window weighs on the next one, so its
    // room may come back only at the end of the next: two windows at most.
    let max_wait = 3 * WINDOW;
    for algorithm in ["fixed_window", "token_bucket", "sliding_window"] {
        let key = unique(algorithm);
        let taken = check(&a, key_check(&key, algorithm, WINDOW, None)).await;
        assert_eq!(taken.status, StatusCode::OK, "{}", taken.body);
        let denied = check(&b, key_check(&key, algorithm, WINDOW, None)).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS, "{algorithm}: {}", denied.body);

        let started = Instant::now();
        let admitted = check(&b, key_check(&key, algorithm, WINDOW, Some(max_wait))).await;
        assert_eq!(admitted.status, StatusCode::OK, "{algorithm}: {}", admitted.body);
        assert!(waited(&admitted) > Duration::ZERO && waited(&admitted) <= max_wait, "{}", admitted.body);
        assert!(started.elapsed() >= waited(&admitted), "waited_ms is time held, no more");
        assert_eq!(admitted.body["store"], "postgres", "{}", admitted.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_whose_turn_is_after_max_wait_answers_429_at_once() {
    let (a, b) = two_instances(&[]).await;
    let (key, window) = (unique("later"), 10 * WINDOW);
    check(&a, key_check(&key, "token_bucket", window, None)).await;
    let refused = check(&b, key_check(&key, "token_bucket", window, Some(WINDOW))).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.body);
    assert_eq!(waited(&refused), Duration::ZERO, "waiting could not turn it: {}", refused.body);
    assert!(refused.headers.contains_key("retry-after"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_queued_behind_another_answers_429_at_its_deadline() {
    let (a, b) = two_instances(&[]).await;
    // A token bucket refills one token a window after it was taken.
    let (key, window) = (unique("deadline"), 3 * WINDOW);
    check(&a, key_check(&key, "token_bucket", window, None)).await;
    let first = tokio::spawn({
        let (b, body) = (b.clone(), key_check(&key, "token_bucket", window, Some(2 * window)));
        async move { check(&b, body).await }
    });
    until_held(&b, 1).await;
    let late = check(&b, key_check(&key, "token_bucket", window, Some(WINDOW))).await;
    assert_eq!(late.status, StatusCode::TOO_MANY_REQUESTS, "{}", late.body);
    assert!(waited(&late) >= WINDOW && waited(&late) < window, "held to its deadline: {}", late.body);
    let first = first.await.expect("first waiter");
    assert_eq!(first.status, StatusCode::OK, "the first waiter is admitted at the refill: {}", first.body);
    assert!(waited(&first) <= 2 * window, "{}", first.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_one_key_are_admitted_in_the_order_they_came() {
    let (a, b) = two_instances(&[]).await;
    let admitted_before = metric(&b, "pglimit_waits_total{result=\"admitted\"}").await;
    let key = unique("fifo");
    check(&a, key_check(&key, "token_bucket", WINDOW, None)).await;
    // One token a window: each waiter gets the next, a window apart.
    let mut waiters = Vec::new();
    for n in 1..=3 {
        let (b2, body) = (b.clone(), key_check(&key, "token_bucket", WINDOW, Some(5 * WINDOW)));
        waiters.push(tokio::spawn(async move { (check(&b2, body).await, Instant::now()) }));
        until_held(&b, n).await;
    }
    let mut answered = Vec::new();
    for waiter in waiters {
        let (reply, at) = waiter.await.expect("waiter");
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        answered.push(at);
    }
    assert!(answered.windows(2).all(|pair| pair[0] < pair[1]), "admitted in arrival order: {answered:?}");
    assert!(metric(&b, "pglimit_waits_total{result=\"admitted\"}").await >= admitted_before + 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_check_is_refused_at_once_however_long_it_may_wait() {
    let app = instance(&fresh_database().await, &[]).await;
    let target = json!({ "policy": "login", "identifiers": { "ip": "198.51.100.77" }, "for": "1s" });
    assert_eq!(call(&app, "POST", "/admin/blocks", target).await.status, StatusCode::OK);
    let mut body = login("someone@example.com", "198.51.100.77");
    body["max_wait"] = json!("5s");
    let refused = check(&app, body).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.body);
    assert_eq!(refused.body["blocked_by"], "ip");
    assert_eq!(waited(&refused), Duration::ZERO, "a block is not waited out: {}", refused.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_waiting_held_checks_a_check_answers_at_once() {
    let (a, b) = two_instances(&[("PGLIMIT_MAX_WAITING", "1")]).await;
    let (one, two) = (unique("one"), unique("two"));
    for key in [&one, &two] {
        check(&a, key_check(key, "token_bucket", 2 * WINDOW, None)).await;
    }
    let held = tokio::spawn({
        let (b, body) = (b.clone(), key_check(&one, "token_bucket", 2 * WINDOW, Some(4 * WINDOW)));
        async move { check(&b, body).await }
    });
    until_held(&b, 1).await;
    let at_once = check(&b, key_check(&two, "token_bucket", 2 * WINDOW, Some(4 * WINDOW))).await;
    assert_eq!(at_once.status, StatusCode::TOO_MANY_REQUESTS, "{}", at_once.body);
    assert_eq!(waited(&at_once), Duration::ZERO, "{}", at_once.body);
    assert_eq!(held.await.expect("held").status, StatusCode::OK, "the one held is still served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_shutdown_a_held_check_answers_its_429_at_once() {
    let (a, b) = two_instances(&[]).await;
    let (key, window) = (unique("shutdown"), 5 * WINDOW);
    check(&a, key_check(&key, "token_bucket", window, None)).await;
    let held = tokio::spawn({
        let (b, body) = (b.clone(), key_check(&key, "token_bucket", window, Some(2 * window)));
        async move { check(&b, body).await }
    });
    until_held(&b, 1).await;
    b.waiting.queues().close();
    let reply = held.await.expect("held");
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{}", reply.body);
    assert!(waited(&reply) < window, "answered before the refill it waited for: {}", reply.body);
    let after = check(&b, key_check(&key, "token_bucket", window, Some(2 * window))).await;
    assert_eq!(waited(&after), Duration::ZERO, "nothing is held once closed: {}", after.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waking_a_key_rechecks_its_first_waiter_before_the_time_its_denial_named() {
    let (a, b) = two_instances(&[]).await;
    // Room comes back a window later by itself; a reset frees it now, as a
    // released lease would, and the wake tells the waiter. The reset is made
    // on B, whose memory of the denial it clears at once (on A, B would
    // forget it only once it heard of it).
    let (key, window) = (unique("wake"), 10 * WINDOW);
    check(&a, key_check(&key, "fixed_window", window, None)).await;
    let held = tokio::spawn({
        let (b, body) = (b.clone(), key_check(&key, "fixed_window", window, Some(window + 5 * WINDOW)));
        async move { check(&b, body).await }
    });
    until_held(&b, 1).await;
    let reset = call(&b, "POST", "/reset", key_check(&key, "fixed_window", window, None)).await;
    assert_eq!(reset.status, StatusCode::OK, "{}", reset.body);
    b.waiting.queues().wake(&adhoc_key(&key));
    let reply = held.await.expect("held");
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(waited(&reply) < window, "admitted on the wake, not at the window's turn: {}", reply.body);
}

const DENY_LISTED: &str = r#"
[policies.llm]
identifiers = { account = "text" }
[[policies.llm.buckets]]
name = "account"
on = ["account"]
limit = 1
window = "1s"
algorithm = "token_bucket"
[[policies.llm.overrides]]
when = { account = "banned" }
deny = true
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_listed_check_is_refused_at_once_however_long_it_may_wait() {
    let file = policy_file(DENY_LISTED);
    let app = instance(&fresh_database().await, &[("PGLIMIT_POLICIES", file.to_str().expect("utf-8"))]).await;
    let body = json!({ "policy": "llm", "identifiers": { "account": "banned" }, "max_wait": "5s" });
    let refused = check(&app, body).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.body);
    assert_eq!(refused.body["override"]["action"], "deny", "{}", refused.body);
    assert_eq!(waited(&refused), Duration::ZERO, "a deny list is not waited out: {}", refused.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_check_is_left_out_of_the_slow_check_log() {
    let app = instance(&fresh_database().await, &[]).await;
    let key = unique("slow");
    check(&app, key_check(&key, "token_bucket", WINDOW, None)).await;
    let held = check(&app, key_check(&key, "token_bucket", WINDOW, Some(3 * WINDOW))).await;
    assert_eq!(held.status, StatusCode::OK, "{}", held.body);
    let listing = call(&app, "GET", "/admin/slow-checks", Value::Null).await.body;
    assert_eq!(listing["seen"], 1, "only the check that was not held: {listing}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_holding_its_share_of_the_pool_is_refused_more_while_another_key_still_waits() {
    // A pool of 20: one key may hold a tenth of it, 2.
    let (a, b) = two_instances(&[("PGLIMIT_MAX_WAITING", "20")]).await;
    let (hog, other) = (unique("hog"), unique("other"));
    for key in [&hog, &other] {
        check(&a, key_check(key, "token_bucket", WINDOW, None)).await;
    }
    // One token a window: the hog's two are admitted a window apart.
    let waiting = |key: &str| key_check(key, "token_bucket", WINDOW, Some(4 * WINDOW));
    let mut held = Vec::new();
    for n in 1..=2 {
        let (b2, body) = (b.clone(), waiting(&hog));
        held.push(tokio::spawn(async move { check(&b2, body).await }));
        until_held(&b, n).await;
    }
    let refused = check(&b, waiting(&hog)).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.body);
    assert_eq!(waited(&refused), Duration::ZERO, "past its share, answered at once: {}", refused.body);

    let admitted = check(&b, waiting(&other)).await;
    assert_eq!(admitted.status, StatusCode::OK, "{}", admitted.body);
    assert!(waited(&admitted) > Duration::ZERO, "held, though the hog holds its share: {}", admitted.body);
    for reply in held {
        assert_eq!(reply.await.expect("held").status, StatusCode::OK, "the hog's share is still served");
    }
}
