//! Calendar windows: their boundaries in Postgres and in the model, how
//! they turn across daylight-saving changes and month ends (at a clock the
//! test sets, through the store), and what the service answers today.

use std::sync::Arc;

use axum::http::StatusCode;
use chrono::{DateTime, Datelike, Days, NaiveDate, TimeZone, Utc};
use chrono_tz::Tz;
use pglimit::algorithm::{parse_zone, Algorithm, Calendar, CalendarUnit};
use pglimit::policy::parse_window_in;
use pglimit::storage::{BucketSpec, Check, MemoryFallback, PgStore};
use serde_json::json;

use crate::common::{
    app, check, fresh_database, functions_pool, instance, policy_file, try_instance, unique,
};

#[path = "calendar_zones.rs"]
mod zones;

/// Zones with daylight saving at 02:00 or 03:00, at midnight (Havana,
/// Santiago), by half an hour (Lord Howe), and none, with odd offsets.
const ZONES: [&str; 9] = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "America/Havana",
    "America/Santiago",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "Asia/Kathmandu",
    "Europe/London",
];

const UNITS: [CalendarUnit; 3] = [CalendarUnit::Day, CalendarUnit::Week, CalendarUnit::Month];

#[tokio::test]
async fn postgres_and_the_model_name_the_same_boundaries_all_through_2027() {
    let url = fresh_database().await;
    let _migrated = crate::common::pg_store(&url).await;
    let pool = functions_pool(&url).await;
    // Every 7 hours through the year (every time of day in turn), and each
    // boundary itself and the instant before it.
    let sql = "SELECT t, e, pglimit_calendar_end(e - 1, $1, $2), pglimit_calendar_end(e, $1, $2)
               FROM generate_series(pglimit_us('2027-01-01Z'), pglimit_us('2028-01-01Z'), 25200000000) AS t,
                    LATERAL (SELECT pglimit_calendar_end(t, $1, $2) AS e) AS x";
    for zone in ZONES {
        for unit in UNITS {
            let calendar = Calendar { unit, zone: parse_zone(zone).expect("zone") };
            let nominal = i64::try_from(unit.nominal().as_micros()).expect("fits");
            let rows: Vec<(i64, i64, i64, i64)> =
                sqlx::query_as(sql).bind(nominal).bind(zone).fetch_all(&pool).await.expect("boundaries");
            assert!(rows.len() > 1000);
            for (t, end, end_before, end_after) in rows {
                let at = format!("{zone} {unit:?} at {t}");
                assert_eq!(calendar.end_after(t), end, "{at}");
                assert_eq!(calendar.end_after(end - 1), end_before, "{at}, just before the boundary");
                // The instant before a boundary is in a window ending no
                // sooner (later where a midnight repeats: Postgres reads it
                // as the second).
                assert!(
                    end_before >= end,
                    "{at}: the instant before {end} is in a window ending at {end_before}"
                );
                assert_eq!(calendar.end_after(end), end_after, "{at}, at the boundary");
            }
        }
    }
}

/// A bucket of limit 2 with this calendar window, as a policy writes it.
fn bucket(window: &str, zone: &str) -> BucketSpec {
    let (window, calendar) = parse_window_in(window, Some(zone), Algorithm::FixedWindow).expect("valid");
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&rand::random::<u64>().to_be_bytes());
    BucketSpec {
        name: Arc::from("q"),
        key,
        limit: 2,
        window,
        algorithm: Algorithm::FixedWindow,
        lockout: None,
        calendar,
    }
}

async fn decide(store: &PgStore, spec: &BucketSpec, cost: u64, now: DateTime<Utc>) -> (bool, DateTime<Utc>) {
    let batch = Check { buckets: vec![spec.clone()], cost, fallback: MemoryFallback::Refuse, lease: None };
    let answer = store.check_as_of(&batch, now).await.expect("postgres answers");
    (answer.buckets[0].allowed, answer.buckets[0].retry_at.unwrap_or(answer.buckets[0].reset_at))
}

fn local(zone: &str, date: (i32, u32, u32), hour: u32) -> DateTime<Utc> {
    let zone: Tz = parse_zone(zone).expect("zone");
    let naive = NaiveDate::from_ymd_opt(date.0, date.1, date.2).and_then(|d| d.and_hms_opt(hour, 0, 0));
    zone.from_local_datetime(&naive.expect("date")).single().expect("a local time").with_timezone(&Utc)
}

/// Fills the window at `fill` (an hour past its start), and checks that it
/// stays full until `turn` and takes checks again from then on.
async fn assert_turns(store: &PgStore, spec: &BucketSpec, fill: DateTime<Utc>, turn: DateTime<Utc>) {
    let at = format!("{} filled at {fill}", spec.window.as_secs());
    assert_eq!(decide(store, spec, 2, fill).await, (true, turn), "{at}: the window ends at {turn}");
    assert_eq!(decide(store, spec, 1, fill).await, (false, turn), "{at}: full until {turn}");
    let just_before = turn - chrono::TimeDelta::microseconds(1);
    assert!(!decide(store, spec, 1, just_before).await.0, "{at}: still full just before {turn}");
    assert!(decide(store, spec, 2, turn).await.0, "{at}: a new window at {turn}");
}

#[tokio::test]
async fn a_calendar_day_turns_at_local_midnight_across_both_2027_changes_in_berlin_and_one_in_new_york() {
    let store = crate::common::pg_store(&fresh_database().await).await;
    // (zone, the day, its length in hours)
    let days = [
        ("Europe/Berlin", (2027, 3, 28), 23),
        ("Europe/Berlin", (2027, 10, 31), 25),
        ("America/New_York", (2027, 3, 14), 23),
        ("America/New_York", (2027, 11, 7), 25),
        ("Europe/Berlin", (2027, 6, 1), 24),
    ];
    for (zone, (y, m, d), hours) in days {
        let start = local(zone, (y, m, d), 0);
        let next =
            NaiveDate::from_ymd_opt(y, m, d).and_then(|d| d.checked_add_days(Days::new(1))).expect("date");
        let turn = local(zone, (next.year(), next.month(), next.day()), 0);
        assert_eq!((turn - start).num_hours(), hours, "{zone} {y}-{m}-{d} is {hours} hours long");
        let fill = start + chrono::TimeDelta::hours(1);
        assert_turns(&store, &bucket("1 calendar day", zone), fill, turn).await;
    }
}

#[tokio::test]
async fn a_calendar_week_turns_on_monday_and_a_month_on_the_first_in_local_time() {
    let store = crate::common::pg_store(&fresh_database().await).await;
    let cases = [
        // Sunday 28 March 2027 (23 hours) to Monday 29, in Berlin.
        ("1 calendar week", "Europe/Berlin", ((2027, 3, 28), 12), (2027, 3, 29)),
        ("1 calendar week", "America/New_York", ((2027, 11, 3), 12), (2027, 11, 8)),
        // October, whose last day is 25 hours long, to 1 November.
        ("1 calendar month", "Europe/Berlin", ((2027, 10, 15), 12), (2027, 11, 1)),
        ("1 calendar month", "America/New_York", ((2027, 3, 31), 23), (2027, 4, 1)),
        ("1 calendar month", "Europe/Berlin", ((2027, 12, 31), 23), (2028, 1, 1)),
    ];
    for (window, zone, (day, hour), turn) in cases {
        let turn = local(zone, turn, 0);
        assert_turns(&store, &bucket(window, zone), local(zone, day, hour), turn).await;
    }
}

/// The next local midnight (day) or 1st (month) after `now` in `zone`.
fn next_start(zone: &str, unit: CalendarUnit, now: DateTime<Utc>) -> DateTime<Utc> {
    let today = now.with_timezone(&parse_zone(zone).expect("zone")).date_naive();
    let next = match unit {
        CalendarUnit::Month => today.with_day(1).and_then(|d| d.checked_add_months(chrono::Months::new(1))),
        _ => today.checked_add_days(Days::new(1)),
    };
    let next = next.expect("date");
    local(zone, (next.year(), next.month(), next.day()), 0)
}

#[tokio::test]
async fn an_ad_hoc_calendar_day_resets_at_the_next_local_midnight_and_says_so_in_its_headers() {
    let app = app().await;
    let body =
        json!({ "key": unique("day"), "limit": 2, "window": "1 calendar day", "timezone": "Europe/Berlin" });
    let before = Utc::now();
    let first = check(&app, body.clone()).await;
    check(&app, body.clone()).await;
    let denied = check(&app, body).await;
    let after = Utc::now();
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert_eq!(first.header("ratelimit-policy"), "\"default\";q=2;w=86400");
    let reset: DateTime<Utc> = first.body["reset_at"].as_str().expect("reset_at").parse().expect("time");
    let midnights = [before, after].map(|t| next_start("Europe/Berlin", CalendarUnit::Day, t));
    assert!(midnights.contains(&reset), "reset {reset}, Berlin's next midnight {midnights:?}");
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    let wait = denied.body["retry_after_s"].as_i64().expect("retry_after_s");
    let until = (reset - after).num_seconds()..=(reset - before).num_seconds() + 1;
    assert!(until.contains(&wait), "retry after {wait} s, the midnight {until:?} s away");
    assert_eq!(denied.header("retry-after"), wait.to_string());
}

#[tokio::test]
async fn a_monthly_quota_in_a_policy_resets_on_the_first_in_its_zone() {
    let toml = "[policies.api]\nidentifiers = { account = \"text\" }\n[[policies.api.buckets]]\n\
                name = \"monthly\"\non = [\"account\"]\nlimit = 3\nwindow = \"1 calendar month\"\n\
                timezone = \"America/New_York\"\n";
    let file = policy_file(toml);
    let app = instance(&fresh_database().await, &[("PGLIMIT_POLICIES", file.to_str().expect("path"))]).await;
    let body = json!({ "policy": "api", "identifiers": { "account": unique("acct") }, "cost": 3 });
    let before = Utc::now();
    let reply = check(&app, body).await;
    let after = Utc::now();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let reset: DateTime<Utc> = reply.body["reset_at"].as_str().expect("reset_at").parse().expect("time");
    let firsts = [before, after].map(|t| next_start("America/New_York", CalendarUnit::Month, t));
    assert!(firsts.contains(&reset), "reset {reset}, New York's next 1st {firsts:?}");
}

#[tokio::test]
async fn a_calendar_window_with_another_algorithm_or_an_unknown_zone_is_a_4xx_naming_the_field() {
    let app = app().await;
    let cases = [
        (
            json!({ "key": "k", "limit": 5, "window": "1 calendar week", "algorithm": "sliding_window" }),
            "window",
        ),
        (
            json!({ "key": "k", "limit": 5, "window": "1 calendar day", "algorithm": "token_bucket" }),
            "window",
        ),
        (
            json!({ "key": "k", "limit": 5, "window": "1 calendar day", "timezone": "Europe/Atlantis" }),
            "timezone",
        ),
        (json!({ "key": "k", "limit": 5, "window": "60s", "timezone": "Europe/Berlin" }), "timezone"),
        (json!({ "key": "k", "limit": 5, "window": "1 calendar year" }), "window"),
        (json!({ "policy": "login", "identifiers": {}, "timezone": "UTC" }), "timezone"),
    ];
    for (body, field) in cases {
        let reply = check(&app, body.clone()).await;
        assert!(reply.status.is_client_error(), "{body}: {}", reply.body);
        assert_eq!(reply.body["field"], field, "{body}: {}", reply.body);
    }
}

#[tokio::test]
async fn a_policy_file_with_a_calendar_window_it_cannot_take_is_refused_at_start_up_naming_the_setting() {
    let url = fresh_database().await;
    let bucket = |extra: &str| {
        format!(
            "[policies.api]\nidentifiers = {{ account = \"text\" }}\n[[policies.api.buckets]]\n\
             name = \"monthly\"\non = [\"account\"]\nlimit = 3\nwindow = \"1 calendar month\"\n{extra}"
        )
    };
    for (extra, field) in
        [("algorithm = \"sliding_log\"\n", "window"), ("timezone = \"Berlin\"\n", "timezone")]
    {
        let file = policy_file(&bucket(extra));
        let env = [("PGLIMIT_POLICIES", file.to_str().expect("path"))];
        let error = try_instance(&url, &env).await.err().expect("refused");
        assert!(error.contains(&format!("buckets[0]: {field}")) || error.contains(field), "{error}");
        assert!(!error.contains('\n'), "one line: {error}");
    }
}
