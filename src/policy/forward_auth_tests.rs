//! The `forward_auth` table: what it reads, and every mistake at its line.

use super::*;

/// Policy `p` (lines 1 to 7), then its `forward_auth` table from line 8,
/// whose entries are `entries`, one a line from line 9.
fn file_with(entries: &[&str]) -> String {
    let head = [
        "[policies.p]",
        r#"identifiers = { email = "email", ip = "ip" }"#,
        "[[policies.p.buckets]]",
        r#"name = "b""#,
        r#"on = ["email", "ip"]"#,
        "limit = 5",
        r#"window = "1m""#,
        "[policies.p.forward_auth]",
    ];
    head.iter().chain(entries).copied().collect::<Vec<_>>().join("\n")
}

fn error_with(entries: &[&str]) -> String {
    Policies::parse(&file_with(entries)).expect_err("the file has a mistake").to_string()
}

const IP: &str = r#"ip = { header = "X-Forwarded-For", trusted_hops = 1 }"#;
const EMAIL: &str = r#"email = { header = "x-user-email" }"#;

#[test]
fn a_forward_auth_table_maps_each_identifier_to_a_lower_case_header() {
    let text = file_with(&[IP, EMAIL, r#"cost_header = "X-RateLimit-Cost""#, "deny_status = 403"]);
    let policies = Policies::parse(&text).expect("valid");
    let auth = policies.get("p").and_then(|p| p.forward_auth.clone()).expect("a forward_auth table");
    assert_eq!(auth.sources["ip"], HeaderSource { header: "x-forwarded-for".into(), trusted_hops: Some(1) });
    assert_eq!(auth.sources["email"], HeaderSource { header: "x-user-email".into(), trusted_hops: None });
    assert_eq!((auth.cost_header.as_deref(), auth.deny_status), (Some("x-ratelimit-cost"), 403));
}

#[test]
fn without_options_a_denial_is_a_429_and_the_cost_is_not_read() {
    let policies = Policies::parse(&file_with(&[IP, EMAIL])).expect("valid");
    let auth = policies.get("p").and_then(|p| p.forward_auth.clone()).expect("a forward_auth table");
    assert_eq!((auth.cost_header, auth.deny_status), (None, 429));
}

#[test]
fn an_entry_for_an_undeclared_identifier_names_its_line() {
    let err = error_with(&[IP, EMAIL, r#"user = { header = "x-user" }"#]);
    assert_eq!(
        err,
        "policies.p: forward_auth (line 11, column 1): \"user\" is not one of this policy's identifiers \
         (nor cost_header, deny_status or max_wait)"
    );
}

#[test]
fn an_identifier_without_an_entry_names_the_table() {
    let err = error_with(&[IP]);
    assert_eq!(
        err,
        "policies.p: forward_auth (line 8, column 1): no entry for the identifier \"email\": \
         add email = { header = \"...\" }"
    );
}

#[test]
fn a_malformed_header_name_names_its_line() {
    let err = error_with(&[IP, r#"email = { header = "x user" }"#]);
    assert!(
        err.starts_with(
            "policies.p: forward_auth: email (line 10, column 9): \"x user\" is not a header name"
        ),
        "{err}"
    );
    let err = error_with(&[IP, EMAIL, r#"cost_header = """#]);
    assert!(err.starts_with("policies.p: forward_auth: cost_header (line 11, column 15):"), "{err}");
}

#[test]
fn trusted_hops_is_for_ip_identifiers_and_at_least_one() {
    let err = error_with(&[IP, r#"email = { header = "x-user-email", trusted_hops = 1 }"#]);
    assert!(err.ends_with("trusted_hops picks an address: only for an ip identifier"), "{err}");
    let err = error_with(&[r#"ip = { header = "x-forwarded-for", trusted_hops = 0 }"#, EMAIL]);
    assert!(err.ends_with("trusted_hops must be between 1 and 16"), "{err}");
}

#[test]
fn unknown_fields_and_statuses_are_refused() {
    let err = error_with(&[IP, r#"email = { header = "x-user-email", hops = 1 }"#]);
    assert!(err.contains("email (line 10, column 9)") && err.contains("hops"), "{err}");
    let err = error_with(&[IP, EMAIL, "deny_status = 401"]);
    assert!(
        err.ends_with(
            "deny_status (line 11, column 15): must be 429 (the default) or 403 (for nginx auth_request)"
        ),
        "{err}"
    );
}

#[test]
fn a_policy_with_a_concurrency_bucket_has_no_forward_auth_table_as_a_proxy_cannot_release() {
    let text = file_with(&[IP, EMAIL]).replacen(
        r#"window = "1m""#,
        "algorithm = \"concurrency\"\nlease = \"30s\"",
        1,
    );
    let error = Policies::parse(&text).expect_err("refused").to_string();
    assert!(error.contains("forward_auth (line 9"), "the table, after the bucket's extra line: {error}");
    assert!(error.contains("bucket \"b\" is a concurrency bucket") && error.contains("/release"), "{error}");
}
