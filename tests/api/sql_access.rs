//! Who may reach what through the SQL interface: a role with only
//! EXECUTE checks but reads nothing; the key secret is in the database
//! only while `PGLIMIT_SQL` is on, and never given away by default
//! privileges.

use sqlx::postgres::{PgDatabaseError, PgPool};

use crate::common::{fresh_database, instance, policy_file};
use crate::sql_interface::{contact, refusal, service, sql_check, try_sql_check, POLICIES};

#[tokio::test]
async fn a_role_with_only_execute_checks_but_reads_neither_the_secret_nor_the_buckets() {
    let (_app, pool, _) = service().await;
    let mut app_role = pool.acquire().await.expect("a connection");
    for grant in [
        "CREATE ROLE sql_app NOLOGIN",
        "GRANT USAGE ON SCHEMA pglimit TO sql_app",
        "GRANT EXECUTE ON FUNCTION pglimit.check(text, jsonb, bigint) TO sql_app",
        "SET ROLE sql_app",
    ] {
        sqlx::query(grant).execute(&mut *app_role).await.expect(grant);
    }
    let answer = sql_check(&mut *app_role, "contact", contact("cy@example.com", "192.0.2.3"), 1).await;
    assert_eq!((answer["allowed"].as_bool(), answer["remaining"].as_i64()), (Some(true), Some(2)));
    for refused in [
        "SELECT * FROM pglimit_key_secret",
        "SELECT * FROM pglimit_buckets",
        "SELECT * FROM pglimit_policies",
        "SELECT * FROM pglimit.reset('contact', '{\"recipient\": \"cy@example.com\", \"ip\": \"192.0.2.3\"}')",
        &format!("SELECT * FROM {}.pglimit_sql_pads()", pglimit::storage::functions_schema()),
    ] {
        let e = sqlx::query(refused).execute(&mut *app_role).await.expect_err(refused);
        assert_eq!(refusal(&e).0, "42501", "{refused}: {e}");
    }
}

/// The key secret reaches the database only when asked for, and leaves
/// it when no longer: a leaked dump must not let an email be tested
/// against the keys unless the SQL interface needs the secret there.
#[tokio::test]
async fn the_secret_is_in_the_database_only_while_pglimit_sql_is_on() {
    let url = fresh_database().await;
    let file = policy_file(POLICIES);
    let path = file.to_str().expect("a path");
    let pool = PgPool::connect(&url).await.expect("connect");
    let secrets = || sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pglimit_key_secret").fetch_one(&pool);
    let _off = instance(&url, &[("PGLIMIT_POLICIES", path)]).await;
    assert_eq!(secrets().await.expect("count"), 0);
    let e = try_sql_check(&pool, "contact", contact("gus@example.com", "192.0.2.50"), 1)
        .await
        .expect_err("no secret");
    let pg = e.as_database_error().and_then(|d| d.try_downcast_ref::<PgDatabaseError>()).expect("pg");
    assert_eq!(pg.code(), "55000");
    assert!(pg.hint().is_some_and(|h| h.contains("PGLIMIT_SQL=on")), "{:?}", pg.hint());
    let _on = instance(&url, &[("PGLIMIT_POLICIES", path), ("PGLIMIT_SQL", "on")]).await;
    assert_eq!(secrets().await.expect("count"), 1);
    let _off_again = instance(&url, &[("PGLIMIT_POLICIES", path)]).await;
    assert_eq!(secrets().await.expect("count"), 0, "turned off: removed");
}

/// Supabase's default privileges give every new table of schema public to
/// its API roles: the migration takes the secret's table back from them.
#[tokio::test]
async fn a_role_given_every_new_table_by_default_privileges_is_not_given_the_secret() {
    let url = fresh_database().await;
    let pool = PgPool::connect(&url).await.expect("connect");
    let role = format!("api_{:08x}", rand::random::<u32>());
    for statement in [
        format!("CREATE ROLE {role} NOLOGIN"),
        format!("ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON TABLES TO {role}"),
    ] {
        sqlx::query(&statement).execute(&pool).await.expect("set up the role");
    }
    let _app = instance(&url, &[("PGLIMIT_SQL", "on")]).await;
    let may = |table: &'static str| {
        sqlx::query_scalar::<_, bool>("SELECT has_table_privilege($1, $2, 'SELECT')")
            .bind(role.clone())
            .bind(table)
            .fetch_one(&pool)
    };
    assert!(may("pglimit_buckets").await.expect("privilege"), "default privileges apply elsewhere");
    assert!(!may("pglimit_key_secret").await.expect("privilege"), "but not to the secret");
}
