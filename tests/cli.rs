//! The command line of the real binary: its subcommands, flags over
//! variables, and exit statuses.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::process::*;
use serde_json::json;
use sqlx::{Connection, PgConnection};

const POLICIES: &str = r#"
[policies.signup]
identifiers = { ip = "ip" }

[[policies.signup.buckets]]
name = "ip"
on = ["ip"]
limit = 10
window = "1h"

[policies.otp]
identifiers = { phone = "text" }

[[policies.otp.buckets]]
name = "phone"
on = ["phone"]
limit = 3
window = "15m"
"#;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `check-policies` on `text`, with an empty environment in a fresh
/// directory; returns its output and whether it left a data directory.
fn check_policies(text: &str) -> (Output, String, bool) {
    let dir = temp_dir("check-policies");
    let file = dir.join("policies.toml");
    std::fs::write(&file, text).expect("policy file");
    let out = Command::new(BIN)
        .env_clear()
        .current_dir(&dir)
        .args(["check-policies", file.to_str().expect("UTF-8 path")])
        .output()
        .expect("run pglimit");
    (out, file.display().to_string(), dir.join(".pglimit").exists())
}

/// 1-based line and column where `needle` starts in `text`.
fn place_of(text: &str, needle: &str) -> (usize, usize) {
    let offset = text.find(needle).expect("needle in text");
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    (1 + text[..offset].matches('\n').count(), 1 + offset - line_start)
}

#[test]
fn check_policies_on_a_valid_file_exits_0_naming_its_policies_without_any_environment() {
    let (out, file, made_a_cluster) = check_policies(POLICIES);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("{file}: 2 policies (otp, signup) OK\n"));
    assert!(!made_a_cluster, "check-policies started no database");
}

#[test]
fn check_policies_on_a_zero_limit_exits_1_naming_the_line_and_column_of_the_value() {
    let text = POLICIES.replace("limit = 3", "limit = 0");
    let (out, file, _) = check_policies(&text);
    assert_eq!(out.status.code(), Some(1));
    let (line, column) = place_of(&text, "limit = 0");
    let column = column + "limit = ".len();
    let expected = format!(
        "pglimit: policy file {file}: policies.otp: buckets[0]: limit (line {line}, column {column}): \
         must be between 1 and 1000000000\n"
    );
    assert_eq!(stderr(&out), expected);
    assert!(stdout(&out).is_empty());
}

#[test]
fn check_policies_on_an_unknown_field_exits_1_naming_its_line_and_column() {
    let text = POLICIES.replace("limit = 10", "colour = \"red\"\nlimit = 10");
    let (out, _, _) = check_policies(&text);
    assert_eq!(out.status.code(), Some(1));
    let (line, column) = place_of(&text, "colour");
    let err = stderr(&out);
    assert!(err.contains(&format!("line {line}, column {column}")), "{err}");
    assert!(err.contains("unknown field `colour`"), "{err}");
}

async fn buckets_table(url: &str) -> (i64, String) {
    let mut conn = PgConnection::connect(url).await.expect("connect");
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pglimit_buckets").fetch_one(&mut conn).await.expect("rows");
    let persistence: String = sqlx::query_scalar(
        "SELECT relpersistence::text FROM pg_class WHERE oid = 'pglimit_buckets'::regclass",
    )
    .fetch_one(&mut conn)
    .await
    .expect("persistence");
    (rows, persistence)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_the_counters_table_and_may_run_again() {
    let cluster = throwaway_cluster().await;
    let url = cluster.url();
    for run in 1..=2 {
        let out = output_of(&["migrate"], &[("DATABASE_URL", &url)]);
        assert_eq!(out.status.code(), Some(0), "run {run}: {}", stderr(&out));
        assert_eq!(stdout(&out), "pglimit: migrations applied\n");
    }
    assert_eq!(buckets_table(&url).await, (0, "p".to_owned()), "an empty, logged table");

    // PGLIMIT_UNLOGGED is honoured as at start-up, here as a flag.
    let other = common::create_database(&url).await;
    let out = output_of(&["migrate", "--database-url", &other, "--unlogged", "true"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(buckets_table(&other).await, (0, "u".to_owned()), "an empty, unlogged table");

    // DATABASE_URL from a file, as a container secret.
    let dir = temp_dir("migrate-url-file");
    let (third, file) = (common::create_database(&url).await, dir.join("database-url"));
    std::fs::write(&file, format!("{third}\n")).expect("write the secret file");
    let out = output_of(&["migrate"], &[("DATABASE_URL_FILE", file.to_str().expect("UTF-8 path"))]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(buckets_table(&third).await, (0, "p".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_pglimit_db_schema_and_its_objects_in_it() {
    let cluster = throwaway_cluster().await;
    let url = cluster.url();
    let out = output_of(&["migrate"], &[("DATABASE_URL", &url), ("PGLIMIT_DB_SCHEMA", "limits")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut conn = PgConnection::connect(&url).await.expect("connect");
    let schemas: Vec<String> = sqlx::query_scalar(
        "SELECT relnamespace::regnamespace::text FROM pg_class WHERE relname = 'pglimit_buckets'",
    )
    .fetch_all(&mut conn)
    .await
    .expect("the counters table's schema");
    assert_eq!(schemas, ["limits"]);
    let interface: Vec<String> = sqlx::query_scalar(
        "SELECT pronamespace::regnamespace::text FROM pg_proc WHERE proname = 'check' AND prosecdef",
    )
    .fetch_all(&mut conn)
    .await
    .expect("the SQL interface's schema");
    assert_eq!(interface, ["limits", "limits", "limits"], "pglimit.check's three forms, in the schema");
}

const PUSHED: &str = r#"
[policies.signup]
identifiers = { ip = "ip" }
[[policies.signup.buckets]]
name = "hourly"
on = ["ip"]
limit = 2
window = "1h"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_push_writes_a_file_that_pglimit_check_then_decides_by() {
    let cluster = throwaway_cluster().await;
    let url = cluster.url();
    let dir = temp_dir("policies-push");
    let file = dir.join("policies.toml");
    std::fs::write(&file, PUSHED).expect("write the policy file");
    let env = [("DATABASE_URL", url.as_str()), ("PGLIMIT_KEY_SECRET", common::SECRET)];
    for run in 1..=2 {
        let out = output_of(&["policies", "push", file.to_str().expect("UTF-8 path")], &env);
        assert_eq!(out.status.code(), Some(0), "run {run}: {}", stderr(&out));
        assert!(
            stdout(&out).starts_with("pglimit: policies ") && stdout(&out).ends_with(" pushed (signup)\n")
        );
    }
    let mut conn = PgConnection::connect(&url).await.expect("connect");
    let check = "SELECT allowed FROM pglimit.check('signup', '{\"ip\": \"198.51.100.7\"}')";
    for want in [true, true, false] {
        let allowed: bool = sqlx::query_scalar(check).fetch_one(&mut conn).await.expect("pglimit.check");
        assert_eq!(allowed, want);
    }
}

#[test]
fn policies_push_without_a_database_or_with_a_bad_file_exits_1_saying_why() {
    let dir = temp_dir("policies-push-refused");
    let file = dir.join("policies.toml");
    std::fs::write(&file, PUSHED.replace("limit = 2", "limit = 0")).expect("write the policy file");
    let path = file.to_str().expect("UTF-8 path");
    let out = output_of(&["policies", "push", path], &[("PGLIMIT_KEY_SECRET", common::SECRET)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("DATABASE_URL: policies push needs it"), "{}", stderr(&out));
    let env = [("DATABASE_URL", "postgres://127.0.0.1:1/x"), ("PGLIMIT_KEY_SECRET", common::SECRET)];
    let out = output_of(&["policies", "push", path], &env);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("line 7"), "{}", stderr(&out));
}

#[test]
fn migrate_without_database_url_exits_2_naming_it() {
    let out = output_of(&["migrate"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("migrate needs DATABASE_URL (or --database-url)"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_flag_wins_over_a_bad_pglimit_bind_with_or_without_serve() {
    let cluster = throwaway_cluster().await;
    let dir = temp_dir("flag-over-variable");
    let url = cluster.url();
    let envs =
        [("PGLIMIT_BIND", "nope"), ("DATABASE_URL", url.as_str()), ("PGLIMIT_KEY_SECRET", common::SECRET)];
    let out = output_of(&[], &envs);
    assert_eq!(out.status.code(), Some(1), "without the flag, the variable is refused");
    assert!(stderr(&out).contains("PGLIMIT_BIND"), "{}", stderr(&out));

    // The same key twice: the second run counts in the same database.
    let runs = [(&["serve", "--bind", "127.0.0.1:0"][..], 200), (&["--bind", "127.0.0.1:0"], 429)];
    for (args, expected) in runs {
        let service = start_with_args(args, &envs, &dir);
        let (status, reply) = service.check(json!({ "key": "k", "limit": 1, "window": "1m" })).await;
        assert_eq!((status, reply["store"].as_str()), (expected, Some("postgres")), "{args:?}: {reply}");
        service.terminate();
    }
}

#[test]
fn a_bad_flag_value_exits_1_naming_its_variable() {
    let out = output_of(&["serve", "--db-timeout-ms", "5"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let expected = "pglimit: configuration error: PGLIMIT_DB_TIMEOUT_MS: out of range";
    assert!(stderr(&out).starts_with(expected), "{}", stderr(&out));

    let out = output_of(&["migrate", "--database-url", "postgres://nowhere/x", "--unlogged", "yes"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let expected = "pglimit: configuration error: PGLIMIT_UNLOGGED: \"yes\" is not";
    assert!(stderr(&out).starts_with(expected), "{}", stderr(&out));
}

#[test]
fn an_unreadable_secret_file_stops_start_up_with_one_line_naming_its_variable_and_path() {
    let dir = temp_dir("secret-file");
    let missing = dir.join("key-secret");
    let path = missing.to_str().expect("UTF-8 path");
    // A database that is never reached: start-up must stop before.
    let envs = [("DATABASE_URL", "postgres://127.0.0.1:1/none"), ("PGLIMIT_KEY_SECRET_FILE", path)];
    let out = output_of(&["serve"], &envs);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        format!(
            "pglimit: configuration error: PGLIMIT_KEY_SECRET_FILE: cannot read {path}: \
             No such file or directory (os error 2)\n"
        )
    );
}

#[test]
fn version_prints_the_cargo_version() {
    let out = output_of(&["--version"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stdout(&out), format!("pglimit {}\n", env!("CARGO_PKG_VERSION")));
}

/// The variables `.env.example` documents, set or commented out.
fn documented_variables() -> Vec<String> {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join(".env.example");
    let text = std::fs::read_to_string(example).expect(".env.example");
    let names = text.lines().filter_map(|line| {
        let name = line.trim_start_matches(['#', ' ']).split_once('=')?.0;
        let is_name = name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_');
        (is_name && (name.starts_with("PGLIMIT_") || name == "DATABASE_URL")).then(|| name.to_owned())
    });
    names.collect()
}

#[test]
fn serve_help_documents_every_variable_of_env_example_and_hides_secret_values() {
    let names = documented_variables();
    assert!(names.len() >= 18, "{names:?}");
    let secret_url = "postgres://user:hunter2@db.internal/app";
    let envs = [("DATABASE_URL", secret_url), ("PGLIMIT_KEY_SECRET", common::SECRET)];
    let out = output_of(&["serve", "--help"], &envs);
    assert_eq!(out.status.code(), Some(0));
    let help = stdout(&out);
    for name in names.iter().map(String::as_str) {
        let shown = [format!("[env: {name}]"), format!("[env: {name}=")];
        assert!(shown.iter().any(|s| help.contains(s.as_str())), "{name} missing from:\n{help}");
    }
    assert!(!help.contains("hunter2") && !help.contains(common::SECRET), "{help}");
    let secret_flags =
        ["--database-url ", "--key-secret ", "--api-tokens ", "--admin-tokens ", "--metrics-token "];
    for flag in secret_flags {
        let (_, after) = help.split_once(flag).unwrap_or_else(|| panic!("{flag} missing from:\n{help}"));
        let text = after.split("\n      -").next().unwrap_or_default();
        assert!(text.contains("visible to other users in the process list"), "{flag}: {text}");
    }
}

#[test]
fn help_lists_the_subcommands() {
    let out = output_of(&["--help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    for subcommand in ["serve", "check-policies", "migrate", "policies", "healthcheck"] {
        assert!(stdout(&out).contains(subcommand), "{}", stdout(&out));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_exits_0_while_the_service_answers_and_1_once_it_is_gone() {
    let cluster = throwaway_cluster().await;
    let dir = temp_dir("healthcheck");
    let url = cluster.url();
    let envs = [("DATABASE_URL", url.as_str()), ("PGLIMIT_KEY_SECRET", common::SECRET)];
    let service = start(&envs, &dir);
    // The container's HEALTHCHECK runs it with the service's own PGLIMIT_BIND.
    let probe = [("PGLIMIT_BIND", service.addr.as_str())];
    let out = output_of(&["healthcheck"], &probe);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let addr = service.addr.clone();
    service.terminate();
    let out = output_of(&["healthcheck", "--bind", &addr], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with(&format!("pglimit: healthcheck: http://{addr}/healthz")),
        "{}",
        stderr(&out)
    );
}
