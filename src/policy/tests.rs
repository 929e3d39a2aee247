use super::file::line_column;
use super::*;

#[test]
fn builtin_policies_match_the_reference_design() {
    let policies = Policies::builtin();
    let login = policies.get("login").expect("login policy");
    let shape: Vec<_> = login.buckets.iter().map(|b| (&*b.name, b.limit, b.window.as_secs())).collect();
    assert_eq!(shape, [("email_ip", 5, 60), ("ip", 20, 60), ("email", 50, 900)]);
    let contact = policies.get("contact_confirmation").expect("contact policy");
    assert_eq!(contact.buckets[0].limit, 3);
    assert_eq!(contact.buckets[0].window.as_secs(), 86_400);
    assert_eq!(contact.identifiers["recipient"], IdentifierKind::Email);
}

#[test]
fn type_mistakes_name_the_line_and_column_on_one_line_without_the_value() {
    let text = "[policies.p]\nidentifiers = { email = \"email\" }\n[[policies.p.buckets]]\nname = \"b\"\non = [\"email\"]\nlimit = \"five\"\nwindow = \"1m\"\n";
    let err = Policies::parse(text).unwrap_err().to_string();
    assert_eq!(err, "line 6, column 9: invalid type: string, expected u64");
}

#[test]
fn unknown_kinds_and_fallbacks_are_refused() {
    let policy = |fallback: &str, kind: &str| {
        format!(
            "[policies.p]\n{fallback}identifiers = {{ e = \"{kind}\" }}\n\
             [[policies.p.buckets]]\nname = \"b\"\non = [\"e\"]\nlimit = 1\nwindow = \"1m\"\n"
        )
    };
    assert!(Policies::parse(&policy("", "text")).is_ok(), "the valid variant parses");
    assert!(Policies::parse(&policy("on_store_error = \"deny\"\n", "text")).is_ok());
    let kind = Policies::parse(&policy("", "phone")).unwrap_err().to_string();
    assert!(kind.contains("phone"), "{kind}");
    let fallback = Policies::parse(&policy("on_store_error = \"maybe\"\n", "text")).unwrap_err().to_string();
    assert!(fallback.contains("maybe"), "{fallback}");
}

/// Parses a file given as its lines, so a test reads line numbers off the
/// array (line n is element n - 1), and returns the error it must cause.
fn error_in(lines: &[&str]) -> String {
    Policies::parse(&lines.join("\n")).expect_err("the file has a mistake").to_string()
}

/// A valid policy `p` taking lines 1 to 8, so a mistake after it is not on
/// the first bucket's lines.
pub(super) const HEAD: [&str; 8] = [
    "[policies.p]",
    r#"identifiers = { email = "email", ip = "ip" }"#,
    "",
    "[[policies.p.buckets]]",
    r#"name = "first""#,
    r#"on = ["email"]"#,
    "limit = 1",
    r#"window = "1m""#,
];

/// `HEAD` followed by a second bucket of `p` made of `fields`, one a line:
/// its header is line 9, so `fields` take lines 10 onwards.
pub(super) fn with_second_bucket(fields: &[&str]) -> String {
    let lines: Vec<&str> = HEAD.iter().chain(&["[[policies.p.buckets]]"]).chain(fields).copied().collect();
    lines.join("\n")
}

/// The error of [`with_second_bucket`]'s file.
pub(super) fn second_bucket(fields: &[&str]) -> String {
    error_in(&[&with_second_bucket(fields)])
}

#[test]
fn an_invalid_policy_name_names_its_line() {
    let err = error_in(&[
        "# one policy, badly named",
        r#"[policies."two words"]"#,
        r#"identifiers = { e = "text" }"#,
        r#"[[policies."two words".buckets]]"#,
        r#"name = "b""#,
        r#"on = ["e"]"#,
        "limit = 1",
        r#"window = "1m""#,
    ]);
    assert_eq!(
        err,
        "policies.two words (line 2, column 11): a policy name is 1 to 64 letters, digits, '_' or '-'"
    );
}

#[test]
fn a_policy_without_buckets_names_its_line() {
    let err = error_in(&["[policies.p]", r#"identifiers = { e = "text" }"#, "", "buckets = []"]);
    assert_eq!(err, "policies.p: buckets (line 4, column 11): needs at least one [[buckets]] entry");
}

#[test]
fn an_invalid_bucket_name_names_its_line() {
    let err =
        second_bucket(&[r#"name = "no spaces please""#, r#"on = ["ip"]"#, "limit = 1", r#"window = "1m""#]);
    assert_eq!(
        err,
        "policies.p: buckets[1]: name (line 10, column 8): \
         a bucket name is 1 to 64 letters, digits, '_' or '-'"
    );
}

#[test]
fn a_bucket_on_no_identifiers_names_its_line() {
    let err = second_bucket(&[r#"name = "b""#, "limit = 1", "on = []", r#"window = "1m""#]);
    assert_eq!(err, "policies.p: buckets[1]: on (line 12, column 6): list at least one identifier");
}

#[test]
fn a_bucket_on_an_undeclared_identifier_names_its_line() {
    let err = second_bucket(&[r#"name = "b""#, r#"on = ["ip", "mail"]"#, "limit = 1", r#"window = "1m""#]);
    assert_eq!(
        err,
        r#"policies.p: buckets[1]: on (line 11, column 13): "mail" is not one of this policy's identifiers"#
    );
}

#[test]
fn a_limit_out_of_range_names_its_line() {
    let err = second_bucket(&[r#"name = "b""#, r#"on = ["ip"]"#, r#"window = "1m""#, "limit = 0"]);
    assert_eq!(err, "policies.p: buckets[1]: limit (line 13, column 9): must be between 1 and 1000000000");
}

#[test]
fn a_sliding_log_limit_above_its_maximum_names_the_limits_line() {
    let err = second_bucket(&[
        r#"name = "b""#,
        r#"on = ["ip"]"#,
        "limit = 1001",
        r#"window = "1m""#,
        r#"algorithm = "sliding_log""#,
    ]);
    assert!(
        err.starts_with("policies.p: buckets[1]: limit (line 12, column 9): sliding_log stores"),
        "{err}"
    );
}

#[test]
fn a_window_that_is_not_a_duration_names_its_line() {
    let err = second_bucket(&[r#"window = "5 parsecs""#, r#"name = "b""#, r#"on = ["ip"]"#, "limit = 1"]);
    assert!(
        err.starts_with(
            r#"policies.p: buckets[1]: window (line 10, column 10): "5 parsecs" is not a duration"#
        ),
        "{err}"
    );
}

#[test]
fn a_window_out_of_range_names_its_line() {
    let err = second_bucket(&[r#"name = "b""#, r#"on = ["ip"]"#, "limit = 1", r#"window = "367d""#]);
    assert!(err.starts_with(r#"policies.p: buckets[1]: window (line 13, column 10): "367d" is out of range"#));
}

#[test]
fn a_bucket_name_used_twice_names_the_line_of_its_second_use() {
    let err = second_bucket(&[r#"on = ["ip"]"#, r#"name = "first""#, "limit = 1", r#"window = "1m""#]);
    assert_eq!(
        err,
        r#"policies.p: buckets[1]: name (line 11, column 8): the bucket name "first" is used twice"#
    );
}

#[test]
fn mistakes_in_inline_tables_and_dotted_keys_name_their_line() {
    let err = error_in(&[
        r#"policies.ok = { identifiers = { e = "text" }, buckets = [{ name = "b", on = ["e"], limit = 1, window = "1s" }] }"#,
        r#"policies.p.identifiers = { e = "text" }"#,
        r#"policies.p.buckets = [{ name = "b", on = ["e"], limit = 1, window = "1s" },"#,
        r#"  { name = "c", on = ["e"], limit = 1, window = "1 s" }]"#,
    ]);
    assert!(err.starts_with(r#"policies.p: buckets[1]: window (line 4, column 49): "1 s" is not"#), "{err}");
}

#[test]
fn columns_count_characters_not_bytes() {
    let err = error_in(&[
        "[policies.p]",
        r#"identifiers = { "café" = "text" }"#,
        "[[policies.p.buckets]]",
        r#"name = "b""#,
        r#"on = ["café", "cafe"]"#,
        "limit = 1",
        r#"window = "1m""#,
    ]);
    assert!(err.starts_with("policies.p: buckets[0]: on (line 5, column 15): \"cafe\""), "{err}");
}

/// Overrides hold emails and addresses, and errors are logged: whatever
/// is wrong in an override, its error gives the place, never the value.
#[test]
fn an_override_that_fails_is_placed_without_quoting_its_value_or_its_line() {
    for (override_lines, place) in [
        (&[r#"when = { email = "alice smith@example.com" }"#, "deny = true"][..], "(line 10, column 18): "),
        (&[r#"when = { email = "203.0.113.77" }"#, "deny = true"], "(line 10, column 18): "),
        (&[r#"when = { ip = "203.0.113.77/24" }"#, "deny = true"], "(line 10, column 15): "),
        (&[r#"when = { ip = "*@example.com" }"#, "deny = true"], "(line 10, column 15): "),
        (
            &[r#"when = { email = "alice@example.com" }"#, r#"limits = { first = "alice@example.com" }"#],
            "line 11, column 20: ",
        ),
        (&[r#"when = { email = "alice@example.com" } deny = true"#], "line 10, column 40: "),
        (&[r#"when = { email = "alice@exa"#], "line 10, column 28: "),
    ] {
        let lines = [&HEAD[..], &["[[policies.p.overrides]]"], override_lines].concat();
        let err = error_in(&lines);
        assert!(err.contains(place), "{override_lines:?}: {err}");
        assert!(!err.contains("alice") && !err.contains("example") && !err.contains("203.0"), "{err}");
        assert!(!err.contains('\n'), "one line: {err}");
    }
}

#[test]
fn offsets_past_the_end_or_inside_a_character_do_not_panic() {
    assert_eq!(line_column("a\nb", 99), (2, 2));
    assert_eq!(line_column("é", 1), (1, 2));
    assert_eq!(line_column("", 0), (1, 1));
}

#[test]
fn a_loaded_file_names_its_path_before_the_line() {
    let path = std::env::temp_dir().join(format!("pglimit-policy-lines-{}.toml", std::process::id()));
    let lines =
        [&HEAD[..], &["[[policies.p.buckets]]", r#"name = "b""#, "on = []", "limit = 1", r#"window = "1m""#]]
            .concat();
    std::fs::write(&path, lines.join("\n")).expect("write the policy file");
    let err = Policies::load(&path).expect_err("the file has a mistake").to_string();
    std::fs::remove_file(&path).expect("remove the policy file");
    let expected = format!(
        "policy file {}: policies.p: buckets[1]: on (line 11, column 6): list at least one identifier",
        path.display()
    );
    assert_eq!(err, expected);
}

#[test]
fn an_override_written_as_an_inline_table_names_its_line() {
    let err = error_in(&[
        "[policies.p]",
        r#"identifiers = { ip = "ip" }"#,
        r#"buckets = [{ name = "b", on = ["ip"], limit = 1, window = "1s" }]"#,
        r#"overrides = [{ when = { ip = "10.0.0.1" }, deny = true },"#,
        r#"  { when = { ip = "10.0.0.2" } }]"#,
    ]);
    assert!(err.starts_with("policies.p: overrides[1] (line 5, column 3): give it one action"), "{err}");
}

#[test]
fn an_identifier_declared_as_a_table_with_show_is_shown_and_a_kind_alone_is_not() {
    let text = "[policies.p]\nidentifiers = { ip = { kind = \"ip\", show = true }, email = \"email\", \
                user = { kind = \"text\" } }\n[[policies.p.buckets]]\nname = \"b\"\non = [\"ip\"]\nlimit = 1\n\
                window = \"1m\"\n";
    let policies = Policies::parse(text).expect("valid");
    let p = policies.get("p").expect("p");
    assert_eq!(p.shown.iter().collect::<Vec<_>>(), ["ip"]);
    assert_eq!(p.identifiers["ip"], IdentifierKind::Ip);
    assert_eq!(p.identifiers["user"], IdentifierKind::Text);
    let unknown = text.replace("show = true", "shown = true");
    let err = Policies::parse(&unknown).unwrap_err().to_string();
    assert!(err.contains("line 2") && err.contains("shown"), "an unknown key in the table is named: {err}");
}
