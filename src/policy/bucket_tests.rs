//! A bucket's optional settings in a policy file: `block_for`, and a
//! concurrency bucket's `lease`, within its policy's `max_lease_life`.

use super::tests::{second_bucket, with_second_bucket, HEAD};
use super::*;

#[test]
fn a_policy_without_overrides_or_block_for_has_none() {
    let policies = Policies::builtin();
    let login = policies.get("login").expect("login policy");
    assert!(login.overrides.is_empty());
    assert!(login.buckets.iter().all(|b| b.block_for.is_none()));
    let values = BTreeMap::from([("email", "a@b.c".to_string()), ("ip", "10.0.0.1".to_string())]);
    assert_eq!(login.override_for(&values), None);
}

#[test]
fn block_for_is_read_as_a_duration() {
    let lines = [&HEAD[..], &["block_for = \"15m\""]].concat();
    let policies = Policies::parse(&lines.join("\n")).expect("the file is valid");
    let first = &policies.get("p").expect("policy p").buckets[0];
    assert_eq!(first.block_for, Some(std::time::Duration::from_secs(900)));
}

#[test]
fn a_block_for_that_is_not_a_duration_or_out_of_range_names_its_line() {
    for (value, reason) in
        [("forever", "is not a duration"), ("400d", "a block must be between 100ms and 366d")]
    {
        let block_for = format!("block_for = \"{value}\"");
        let err =
            second_bucket(&[r#"name = "b""#, r#"on = ["ip"]"#, "limit = 1", r#"window = "1m""#, &block_for]);
        let place = "policies.p: buckets[1]: block_for (line 14, column 13): ";
        assert!(err.starts_with(place) && err.contains(reason), "{value}: {err}");
    }
}

#[test]
fn a_concurrency_bucket_takes_a_lease_in_place_of_a_window() {
    let ok = |fields: &[&str]| Policies::parse(&with_second_bucket(fields)).is_ok();
    assert!(ok(&[
        r#"name = "b""#,
        r#"on = ["ip"]"#,
        "limit = 2",
        r#"algorithm = "concurrency""#,
        r#"lease = "30s""#
    ]));
    let missing =
        second_bucket(&[r#"name = "b""#, r#"on = ["ip"]"#, "limit = 2", r#"algorithm = "concurrency""#]);
    assert!(missing.starts_with("policies.p: buckets[1]: lease (line 10"), "{missing}");
    let window = second_bucket(&[
        r#"name = "b""#,
        r#"on = ["ip"]"#,
        "limit = 2",
        r#"algorithm = "concurrency""#,
        r#"window = "1m""#,
    ]);
    assert!(window.starts_with("policies.p: buckets[1]: window (line 14"), "{window}");
    let lease = second_bucket(&[
        r#"name = "b""#,
        r#"on = ["ip"]"#,
        "limit = 2",
        r#"window = "1m""#,
        r#"lease = "1s""#,
    ]);
    assert!(lease.starts_with("policies.p: buckets[1]: lease (line 14"), "{lease}");
    assert!(lease.contains("concurrency"), "{lease}");
}

/// `HEAD` with `max_lease_life` (line 3) and a concurrency bucket of this lease (line 14).
fn leasing(max_lease_life: Option<&str>, lease: &str) -> String {
    let mut lines: Vec<String> = HEAD.iter().map(|l| l.to_string()).collect();
    lines[2] = max_lease_life.map_or_else(String::new, |life| format!("max_lease_life = \"{life}\""));
    let bucket = [r#"name = "b""#, r#"on = ["ip"]"#, "limit = 2", r#"algorithm = "concurrency""#];
    lines.extend(["[[policies.p.buckets]]"].iter().chain(&bucket).map(|l| l.to_string()));
    lines.push(format!("lease = \"{lease}\""));
    lines.join("\n")
}

#[test]
fn max_lease_life_is_a_day_unless_the_policy_says_and_bounds_its_leases() {
    let life = |text: &str| Policies::parse(text).map(|p| p.get("p").expect("policy p").max_lease_life);
    assert_eq!(life(&leasing(None, "30s")).ok(), Some(Duration::from_secs(86_400)));
    assert_eq!(life(&leasing(Some("2h"), "30s")).ok(), Some(Duration::from_secs(7200)));
    assert_eq!(life(&leasing(Some("1h"), "1h")).ok(), Some(Duration::from_secs(3600)), "as long is fine");
    let longer = Policies::parse(&leasing(Some("1h"), "2h")).expect_err("a lease over its life").to_string();
    assert!(longer.starts_with("policies.p: buckets[1]: lease (line 14"), "{longer}");
    assert!(longer.contains("max_lease_life (1h)"), "{longer}");
    let by_default = Policies::parse(&leasing(None, "2d")).expect_err("over a day").to_string();
    assert!(by_default.contains("max_lease_life (1d)"), "{by_default}");
}

#[test]
fn max_lease_life_that_is_not_a_duration_or_without_a_concurrency_bucket_names_its_line() {
    let bad = Policies::parse(&leasing(Some("forever"), "30s")).expect_err("not a duration").to_string();
    assert!(bad.starts_with("policies.p: max_lease_life (line 3"), "{bad}");
    let mut lines: Vec<&str> = HEAD.to_vec();
    lines[2] = r#"max_lease_life = "1h""#;
    let alone = Policies::parse(&lines.join("\n")).expect_err("no concurrency bucket").to_string();
    assert!(alone.starts_with("policies.p: max_lease_life (line 3"), "{alone}");
    assert!(alone.contains("concurrency"), "{alone}");
}
