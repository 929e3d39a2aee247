//! The audit log read back: pages newest first with no repeat or gap,
//! filters, a cursor that belongs to its query, mistakes named by field;
//! the rows the service writes of itself (start-ups, reloads); retention.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::audit::{act, audit, audited_instance, entries, tokens, ALICE};
use crate::common::{fresh_database, pg_store, policy_file, try_service};

/// Adds `n` rows straight to the table, alternating two actions and targets.
async fn add_rows(url: &str, n: usize) {
    let pool = sqlx::PgPool::connect(url).await.expect("connect");
    for i in 0..n {
        let (action, target) = if i % 2 == 0 { ("block", "login/ip") } else { ("unblock", "login/email") };
        sqlx::query("INSERT INTO pglimit_audit (actor, action, target) VALUES ('alice', $1, $2)")
            .bind(action)
            .bind(target)
            .execute(&pool)
            .await
            .unwrap();
    }
    pool.close().await;
}

/// The ids of every page of `query`, `limit` at a time, following `next`.
async fn walk(app: &pglimit::AppState, query: &str, limit: usize) -> Vec<Vec<u64>> {
    let (mut pages, mut cursor) = (Vec::new(), None::<String>);
    loop {
        let parts =
            [Some(query.to_owned()), Some(format!("limit={limit}")), cursor.map(|c| format!("cursor={c}"))];
        let parts: Vec<String> = parts.into_iter().flatten().filter(|p| !p.is_empty()).collect();
        let reply = audit(app, &parts.join("&")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let ids = reply.body["entries"].as_array().expect("entries").iter();
        pages.push(ids.map(|e| e["id"].as_str().and_then(|id| id.parse().ok()).expect("an id")).collect());
        match reply.body["next"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return pages,
        }
        assert!(pages.len() < 100, "paging does not end");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_walks_every_row_newest_first_with_no_repeat_or_gap() {
    let url = fresh_database().await;
    let app = audited_instance(&url).await;
    add_rows(&url, 22).await;
    let pages = walk(&app, "", 5).await;
    assert!(pages.iter().all(|p| p.len() <= 5) && pages.len() == 5, "{pages:?}");
    let ids: Vec<u64> = pages.concat();
    let mut expected = ids.clone();
    expected.sort_unstable_by(|a, b| b.cmp(a));
    expected.dedup();
    assert_eq!(ids, expected, "newest first, none twice");
    assert_eq!(ids.len(), 23, "22 rows and the start-up's");
    assert_eq!(ids.first().copied(), Some(ids.len() as u64), "the ids are 1..=23, so none is missed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_by_action_and_target_page_through_only_their_rows() {
    let url = fresh_database().await;
    let app = audited_instance(&url).await;
    add_rows(&url, 9).await;
    let blocks: Vec<u64> = walk(&app, "action=block", 2).await.concat();
    assert_eq!(blocks.len(), 5, "{blocks:?}");
    let email: Vec<u64> = walk(&app, "target=login%2Femail", 3).await.concat();
    assert_eq!(email.len(), 4, "{email:?}");
    assert!(BTreeSet::from_iter(&blocks).is_disjoint(&BTreeSet::from_iter(&email)));
    let both = audit(&app, "action=block&target=login%2Femail").await;
    assert_eq!(both.body["entries"], json!([]), "{}", both.body);
    assert_eq!(both.body["next"], Value::Null);
    let started = audit(&app, "action=started").await;
    assert_eq!(started.body["entries"].as_array().map(Vec::len), Some(1), "{}", started.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_from_another_query_and_every_malformed_parameter_are_400s_naming_their_field() {
    let url = fresh_database().await;
    let app = audited_instance(&url).await;
    add_rows(&url, 4).await;
    let first = audit(&app, "action=block&limit=1").await;
    let next = first.body["next"].as_str().expect("a next page").to_owned();
    assert_eq!(audit(&app, &format!("action=block&limit=1&cursor={next}")).await.status, StatusCode::OK);
    for (query, field) in [
        (format!("action=unblock&cursor={next}"), "cursor"),
        (format!("cursor={next}"), "cursor"),
        (format!("action=block&target=login%2Fip&cursor={next}"), "cursor"),
        ("cursor=not-a-cursor".to_owned(), "cursor"),
        ("cursor=12.ffff".to_owned(), "cursor"),
        ("action=delete".to_owned(), "action"),
        ("limit=0".to_owned(), "limit"),
        ("limit=1001".to_owned(), "limit"),
        ("limit=ten".to_owned(), "limit"),
        ("colour=red".to_owned(), "query"),
        ("target=a%00b".to_owned(), "target"),
    ] {
        let reply = audit(&app, &query).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{query}: {}", reply.body);
        assert_eq!(reply.body["field"], field, "{query}: {}", reply.body);
    }
    let stranger = act(&app, "GET", "/admin/audit", Value::Null, "api-token-77ab", "r").await;
    assert_eq!(stranger.status, StatusCode::UNAUTHORIZED, "an API token does not read the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_up_records_its_configuration_digest_and_a_reload_its_policy_digests() {
    let url = fresh_database().await;
    let file = policy_file(&policies(10));
    let path = file.to_str().expect("a UTF-8 path").to_owned();
    let vars = [("PGLIMIT_ADMIN_TOKENS", tokens()), ("PGLIMIT_POLICIES", path.clone())];
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let service = try_service(&url, &vars).await.expect("starts");
    let app = &service.state;
    let started = entries(app).await;
    assert_eq!(started.len(), 1, "{started:#?}");
    let row = &started[0];
    assert_eq!((row["actor"].as_str(), row["action"].as_str()), (Some("system"), Some("started")));
    assert_eq!((row["target"].as_str(), row["request_id"].clone()), (Some(path.as_str()), Value::Null));
    assert_eq!(row["detail"]["config_digest"].as_str().map(str::len), Some(16), "{row}");
    let settings = &row["detail"]["settings"];
    assert_eq!(settings["PGLIMIT_POLICIES"], path.as_str());
    assert_eq!(settings["PGLIMIT_ADMIN_TOKENS"], "set", "a secret is only said to be set: {settings}");
    assert!(!row.to_string().contains(ALICE) && !row.to_string().contains("test-secret"), "{row}");
    let before = row["detail"]["policies"].as_str().expect("the policies' digest").to_owned();

    std::fs::write(&file, policies(20)).expect("rewrite the policy file");
    let deadline = Instant::now() + 20 * pglimit::reload::SETTLE + Duration::from_secs(10);
    let reload = loop {
        let rows = entries(app).await;
        if let Some(row) = rows.into_iter().find(|e| e["action"] == "policies_reloaded") {
            break row;
        }
        assert!(Instant::now() < deadline, "no reload row");
        tokio::time::sleep(pglimit::reload::SETTLE).await;
    };
    assert_eq!((reload["actor"].as_str(), reload["target"].as_str()), (Some("system"), Some(path.as_str())));
    assert_eq!(
        (reload["detail"]["before"].as_str(), reload["detail"]["trigger"].as_str()),
        (Some(before.as_str()), Some("file change"))
    );
    let after = reload["detail"]["after"].as_str().expect("the new digest");
    assert_ne!(after, before);
    assert_eq!(after, pglimit::policy::short_hash(&policies(20)));
    let _ = std::fs::remove_file(file);
}

fn policies(limit: u32) -> String {
    format!(
        "[policies.p]\nidentifiers = {{ ip = \"ip\" }}\n[[policies.p.buckets]]\nname = \"b\"\non = [\"ip\"]\n\
         window = \"1h\"\nlimit = {limit}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_only_the_rows_older_than_it() {
    let url = fresh_database().await;
    let app = audited_instance(&url).await;
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    for age in ["91 days", "200 days", "89 days", "1 hour"] {
        sqlx::query(&format!(
            "INSERT INTO pglimit_audit (at, actor, action, target) VALUES (now() - interval '{age}', 'alice', 'block', '{age}')"
        ))
        .execute(&pool)
        .await
        .unwrap();
    }
    let deleted = pg_store(&url).await.cleanup().await.expect("a cleanup");
    assert_eq!(deleted, 2, "the two rows past 90 days, and nothing else expired");
    let kept: Vec<String> =
        entries(&app).await.iter().filter_map(|e| e["target"].as_str().map(str::to_owned)).collect();
    assert_eq!(
        kept,
        ["1 hour", "89 days", "builtin"],
        "newest first by id, the start-up's row first written"
    );
    pool.close().await;
}
