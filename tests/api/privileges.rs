//! Least privilege: `serve` as a role that may use pglimit's objects but
//! owns and creates nothing, once a privileged role ran `pglimit migrate`.

use axum::http::StatusCode;
use serde_json::json;

use crate::common::docs::fenced_block;
use crate::common::{call, check, fresh_database, login, remaining, try_instance, unique};
use pglimit::storage::{Citus, Reach};

/// A role with the grants the README lists, and the URL of `database` as it.
async fn app_role(admin_url: &str) -> String {
    app_role_in(admin_url, "public").await
}

/// The README's grants (read from it, the role and schema put in), one
/// statement each.
fn readme_grants(role: &str, schema: &str) -> Vec<String> {
    let block = fenced_block("README.md", "sql", "GRANT USAGE ON SCHEMA public TO pglimit_app");
    let in_schema = format!("SCHEMA \"{schema}\"");
    let statements: Vec<String> = block
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.trim_start().starts_with("--"))
        .map(|line| line.replace("SCHEMA public", &in_schema).replace("pglimit_app", role))
        .collect();
    let whole = |s: &String| s.ends_with(';') && s.contains(role) && s.contains(&in_schema);
    assert!(statements.len() >= 3 && statements.iter().all(whole), "{statements:?}");
    statements
}

/// As [`app_role`], with pglimit's objects in `schema`.
async fn app_role_in(admin_url: &str, schema: &str) -> String {
    let role = unique("app").replace('-', "_");
    let admin = sqlx::PgPool::connect(admin_url).await.expect("admin");
    let database: (String,) =
        sqlx::query_as("SELECT current_database()").fetch_one(&admin).await.expect("db");
    let mut grants = vec![
        format!("CREATE ROLE {role} LOGIN PASSWORD 'app-password'"),
        format!("GRANT CONNECT ON DATABASE {} TO {role}", database.0),
    ];
    grants.extend(readme_grants(&role, schema));
    for grant in grants {
        sqlx::query(&grant).execute(&admin).await.unwrap_or_else(|e| panic!("{grant}: {e}"));
    }
    admin.close().await;
    let (_, rest) = admin_url.split_once('@').expect("user@host");
    format!("postgres://{role}:app-password@{rest}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_creates_nothing_serves_once_the_schema_is_migrated() {
    let admin_url = fresh_database().await;
    pglimit::storage::migrate(&admin_url, Reach::default(), false, Citus::Auto).await.expect("migrate");
    let url = app_role(&admin_url).await;
    let conn = sqlx::PgPool::connect(&url).await.expect("the app role connects");
    let create = sqlx::query("CREATE TABLE mine (id int)").execute(&conn).await;
    assert!(create.is_err(), "the role may not create objects");

    let app = try_instance(&url, &[]).await.expect("serve starts without privileges to create");
    let alice = login("alice@example.com", "192.0.2.60");
    for n in 1..=5 {
        let reply = check(&app, alice.clone()).await;
        assert_eq!(
            (reply.status, reply.body["store"].as_str()),
            (StatusCode::OK, Some("postgres")),
            "{n}: {}",
            reply.body
        );
    }
    assert_eq!(check(&app, alice.clone()).await.status, StatusCode::TOO_MANY_REQUESTS);
    let mut reset = alice.clone();
    reset["buckets"] = json!(["email_ip"]);
    let reply = call(&app, "POST", "/reset", reset).await;
    assert_eq!((reply.status, remaining(&reply.body, "email_ip")), (StatusCode::OK, 5), "{}", reply.body);
    let block = json!({ "policy": "login", "identifiers": { "ip": "192.0.2.60" }, "for": "1m" });
    let blocked = call(&app, "POST", "/admin/blocks", block).await;
    assert_eq!(blocked.status, StatusCode::OK, "the block writes its audit row: {}", blocked.body);
    let audit = call(&app, "GET", "/admin/audit", serde_json::Value::Null).await;
    let actions: Vec<&str> = audit.body["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(actions, ["block", "started"], "{}", audit.body);
}

#[tokio::test]
async fn a_role_that_creates_nothing_on_an_unmigrated_database_is_told_to_run_migrate() {
    let url = app_role(&fresh_database().await).await;
    let error = try_instance(&url, &[]).await.err().expect("refused");
    assert!(error.contains("run `pglimit migrate`"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pglimit_db_schema_keeps_every_object_in_a_schema_of_its_own() {
    let admin_url = fresh_database().await;
    let schema = "rate \"limits\"";
    let reach = Reach { schema: Some(schema.to_owned()), ..Reach::default() };
    pglimit::storage::migrate(&admin_url, reach, false, Citus::Auto).await.expect("migrate into the schema");
    let admin = sqlx::PgPool::connect(&admin_url).await.expect("admin");
    let placed: Vec<(String, String)> = sqlx::query_as(
        "SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relkind = 'r' AND (c.relname LIKE 'pglimit%' OR c.relname = '_sqlx_migrations')",
    )
    .fetch_all(&admin)
    .await
    .expect("tables");
    assert!(placed.len() >= 4 && placed.iter().all(|(n, _)| n == schema), "{placed:?}");
    admin.close().await;

    let url = app_role_in(&admin_url, &schema.replace('"', "\"\"")).await;
    let app = try_instance(&url, &[("PGLIMIT_DB_SCHEMA", schema)]).await.expect("serve in the schema");
    let alice = login("alice@example.com", "192.0.2.61");
    for n in 1..=5 {
        let reply = check(&app, alice.clone()).await;
        assert_eq!((reply.status, reply.body["store"].as_str()), (StatusCode::OK, Some("postgres")), "{n}");
    }
    assert_eq!(check(&app, alice).await.status, StatusCode::TOO_MANY_REQUESTS);
}

/// Each build calls the functions of its own schema, found first on its
/// search path: another build's, here ahead of the tables on the role's
/// search path and refusing every check (the login policy's upsert calls
/// `pglimit_fixed_count`), are neither called nor replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_build_calls_its_own_functions_and_leaves_another_builds_alone() {
    let url = fresh_database().await;
    let admin = sqlx::PgPool::connect(&url).await.expect("admin");
    let other = "pglimit_000000000000";
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA {other};
         CREATE FUNCTION {other}.pglimit_fixed_count(bigint, bigint, bigint) RETURNS bigint
             LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'another build'; END $$;
         DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET search_path = {other}, public', current_database()); END $$"
    ))
    .execute(&admin)
    .await
    .expect("another build's schema");
    admin.close().await;
    let app = try_instance(&url, &[]).await.expect("serves");
    let alice = login("alice@example.com", "192.0.2.77");
    let reply = check(&app, alice).await;
    assert_eq!(
        (reply.status, reply.body["store"].as_str()),
        (StatusCode::OK, Some("postgres")),
        "{}",
        reply.body
    );
    let admin = sqlx::PgPool::connect(&url).await.expect("admin");
    let call = format!("SELECT {other}.pglimit_fixed_count(1, 2, 3)");
    let untouched = sqlx::query(&call).execute(&admin).await.expect_err("still the other build's");
    assert!(untouched.to_string().contains("another build"), "{untouched}");
    let ours = pglimit::storage::functions_schema();
    let (count,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = $1 AND p.proname IN ('pglimit_decide', 'pglimit_check_batch', 'pglimit_check_distinct')",
    )
    .bind(ours)
    .fetch_one(&admin)
    .await
    .expect("our functions");
    assert_eq!(count, 3, "this build's functions in {ours}");
}
