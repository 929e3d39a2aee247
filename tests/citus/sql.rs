//! pglimit's SQL functions on a Citus cluster: `pglimit migrate` in Citus
//! mode still installs them, and every function that would decide refuses,
//! since a check made in a caller's transaction on the coordinator could
//! not lock its buckets in key order across shards as Citus mode's checks
//! do on the workers (policies.sql, `pglimit_sql_refused_on_citus`); so
//! does release, of leases that Citus mode never grants.

use sqlx::postgres::PgDatabaseError;

use crate::common::process::output_of;
use crate::{cluster, direct};

/// Each deciding function, in each of its forms, and release.
const CALLS: [&str; 7] = [
    r#"SELECT * FROM pglimit.check('login', '{"email": "citus@example.com", "ip": "203.0.113.20"}')"#,
    "SELECT * FROM pglimit.check('sql-on-citus', 10, '1h', 'fixed_window')",
    r#"SELECT * FROM pglimit.enforce('login', '{"email": "citus@example.com", "ip": "203.0.113.20"}')"#,
    "SELECT * FROM pglimit.enforce('sql-on-citus', 10, interval '1 hour', 'fixed_window')",
    r#"SELECT * FROM pglimit.reset('login', '{"email": "citus@example.com", "ip": "203.0.113.20"}')"#,
    "SELECT * FROM pglimit.reset('sql-on-citus', 10, '1h', 'fixed_window')",
    "SELECT pglimit.release('lease_00000000000000000000000000000000')",
];

#[tokio::test]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn in_citus_mode_migrate_succeeds_and_the_sql_functions_refuse_pointing_at_post_check() {
    let url = cluster().0;
    for run in ["first", "second"] {
        let out = output_of(&["migrate"], &[("DATABASE_URL", &url), ("PGLIMIT_CITUS", "true")]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{run} migrate in Citus mode: {stderr}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "pglimit: migrations applied\n", "{run}");
    }
    let pool = direct(&url).await;
    let (distributed, installed): (bool, bool) = sqlx::query_as(
        "SELECT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'pglimit_buckets'::regclass),
                to_regprocedure('pglimit.check(text, jsonb, bigint)') IS NOT NULL",
    )
    .fetch_one(&pool)
    .await
    .expect("ask the coordinator");
    assert_eq!((distributed, installed), (true, true), "distributed counters, and pglimit.check");
    for call in CALLS {
        let error = sqlx::raw_sql(call).fetch_all(&pool).await.expect_err(call);
        let error = error.as_database_error().unwrap_or_else(|| panic!("{call}: {error}"));
        let error = error.downcast_ref::<PgDatabaseError>();
        assert_eq!(error.code(), "0A000", "{call}: {error:?}");
        assert!(error.message().contains("not offered in Citus mode"), "{call}: {}", error.message());
        let hint = error.hint().unwrap_or_default();
        assert!(hint.contains("POST /check"), "{call}: the hint: {hint}");
    }
}
