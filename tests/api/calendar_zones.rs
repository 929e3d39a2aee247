//! Which time zones a calendar window takes: IANA region names and `UTC`,
//! never a name Postgres reads as a fixed offset; and a zone the server
//! does not list refuses its own check, never the batch it would join.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use chrono::Utc;
use pglimit::algorithm::{parse_zone, Algorithm};
use pglimit::error::Error;
use pglimit::limiter::{CheckRequest, Checks, KeySecret, Shared};
use pglimit::policy::Policies;
use pglimit::storage::{Check, FallbackStore, MemoryFallback, MemoryStore, PgStore, Primary, Store};
use serde_json::json;

use super::bucket;
use crate::common::{
    app, check, fresh_database, functions_pool, pg_store, policy_file, try_instance, unique,
};

/// Names chrono-tz knows that are not region names: abbreviations Postgres
/// reads as fixed offsets (CET: +01 all summer), offsets, and aliases.
const NOT_REGIONS: [&str; 10] =
    ["CET", "EET", "MET", "WET", "UTC+5", "Etc/GMT+5", "EST5EDT", "US/Eastern", "GMT", "Etc/UTC"];

#[tokio::test]
async fn an_abbreviation_or_a_fixed_offset_as_an_ad_hoc_timezone_is_a_400_naming_timezone() {
    let app = app().await;
    for zone in NOT_REGIONS {
        let body = json!({ "key": unique("tz"), "limit": 5, "window": "1 calendar day", "timezone": zone });
        let reply = check(&app, body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{zone}: {}", reply.body);
        assert_eq!(reply.body["type"], "urn:pglimit:problem:invalid-field", "{zone}: {}", reply.body);
        assert_eq!(reply.body["field"], "timezone", "{zone}: {}", reply.body);
        let detail = reply.body["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(&format!("timezone {zone:?}")), "{zone}: {detail}");
    }
}

#[tokio::test]
async fn a_policy_file_with_an_abbreviation_as_timezone_is_refused_at_start_up_naming_its_line() {
    let url = fresh_database().await;
    for zone in ["CET", "EET", "MET", "WET", "Etc/GMT-1"] {
        let toml = format!(
            "[policies.api]\nidentifiers = {{ account = \"text\" }}\n[[policies.api.buckets]]\n\
             name = \"daily\"\non = [\"account\"]\nlimit = 3\nwindow = \"1 calendar day\"\n\
             timezone = \"{zone}\"\n"
        );
        let file = policy_file(&toml);
        let env = [("PGLIMIT_POLICIES", file.to_str().expect("path"))];
        let error = try_instance(&url, &env).await.err().expect("refused");
        assert!(error.contains("(line 8, column 12)"), "{zone}: {error}");
        assert!(error.contains(&format!("timezone {zone:?}")), "{zone}: {error}");
    }
}

#[tokio::test]
async fn no_zone_pglimit_accepts_is_one_postgres_reads_as_an_abbreviation() {
    let pool = functions_pool(&fresh_database().await).await;
    let abbreviations: Vec<(String,)> = sqlx::query_as("SELECT lower(abbrev) FROM pg_timezone_abbrevs")
        .fetch_all(&pool)
        .await
        .expect("abbrevs");
    let abbreviations: HashSet<String> = abbreviations.into_iter().map(|(a,)| a).collect();
    assert!(abbreviations.contains("cet"), "the test server reads CET as an abbreviation");
    let accepted: Vec<&str> =
        chrono_tz::TZ_VARIANTS.iter().map(|z| z.name()).filter(|name| parse_zone(name).is_ok()).collect();
    assert!(accepted.len() > 300, "{} region names", accepted.len());
    // UTC is an abbreviation too, of the same offset and without summer time.
    let read_as_offsets: Vec<&&str> =
        accepted.iter().filter(|n| **n != "UTC" && abbreviations.contains(&n.to_lowercase())).collect();
    assert!(read_as_offsets.is_empty(), "read as fixed offsets by Postgres: {read_as_offsets:?}");
}

/// An ad hoc check of a calendar day in `zone`, or of a minute without one.
fn ad_hoc(zone: Option<&str>) -> CheckRequest {
    let window = if zone.is_some() { "1 calendar day" } else { "60s" };
    CheckRequest::AdHoc {
        key: unique("zones"),
        limit: 5,
        window: window.into(),
        timezone: zone.map(str::to_owned),
        algorithm: Algorithm::FixedWindow,
        cost: 1,
    }
}

#[tokio::test]
async fn a_zone_the_server_does_not_list_fails_that_check_alone_while_checks_beside_it_succeed() {
    let pg = pg_store(&fresh_database().await).await;
    pg.forget_zone("Asia/Tokyo");
    let store = FallbackStore::new(
        pg.clone(),
        MemoryStore::new(1000),
        Duration::from_secs(5),
        Duration::from_secs(1),
    );
    let secret = KeySecret::new(crate::common::SECRET).expect("secret");
    let checks = Checks::new(Arc::new(Shared::new(store, Policies::builtin(), secret, false)));
    let others: Vec<CheckRequest> = (0..24).map(|i| ad_hoc([Some("Europe/Berlin"), None][i % 2])).collect();
    let tokyo = ad_hoc(Some("Asia/Tokyo"));
    let (refused, answers) = tokio::join!(
        checks.check(&tokyo),
        futures_util::future::join_all(others.iter().map(|r| checks.check(r)))
    );
    match refused.map_err(Error::from) {
        Err(Error::InvalidField { field, detail }) => {
            assert_eq!(field, "timezone");
            assert!(detail.contains("\"Asia/Tokyo\"") && detail.contains("PostgreSQL server"), "{detail}");
        }
        other => panic!("Asia/Tokyo: {other:?}"),
    }
    for answer in answers {
        let decision = answer.expect("decided");
        assert!(decision.allowed && !decision.degraded, "{decision:?}");
        assert_eq!(decision.store, pglimit::storage::StoreKind::Postgres);
    }
    assert!(!checks.store().is_degraded());
}

#[tokio::test]
async fn the_store_refuses_a_batch_in_a_zone_its_server_lacks_alone_and_reads_the_zones_again_on_reconnect() {
    let pg: PgStore = pg_store(&fresh_database().await).await;
    assert!(pg.knows_zone("Asia/Tokyo") && !pg.knows_zone("Mars/Olympus"), "read from the server");
    pg.forget_zone("Asia/Tokyo");
    let batch = |zone| Check {
        buckets: vec![bucket("1 calendar day", zone)],
        cost: 1,
        fallback: MemoryFallback::Refuse,
        lease: None,
    };
    let (tokyo, berlin) = (batch("Asia/Tokyo"), batch("Europe/Berlin"));
    let now = Utc::now();
    let (refused, allowed) = tokio::join!(pg.check_as_of(&tokyo, now), pg.check_as_of(&berlin, now));
    let refused = refused.expect_err("Tokyo refused").to_string();
    assert!(refused.contains("does not know time zone \"Asia/Tokyo\""), "{refused}");
    assert!(allowed.expect("Berlin decided").allowed());
    pg.probe().await.expect("a reconnect");
    assert!(pg.knows_zone("Asia/Tokyo"), "read again on reconnect");
    assert!(pg.check_as_of(&tokyo, now).await.expect("Tokyo decided").allowed());
}
