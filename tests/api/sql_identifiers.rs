//! The SQL functions of `identifiers.sql` against the Rust they translate,
//! on a real PostgreSQL: normalised values (the unit tests' values and
//! thousands of generated ones), bucket keys, and override patterns. SQL
//! may refuse with 0A000 only the inputs its header names; otherwise it
//! must answer exactly what Rust does, a value or Rust's refusal.

mod values;

use pglimit::algorithm::Algorithm;
use pglimit::limiter::{bucket_key, KeyScope, KeySecret};
use pglimit::policy::{Cidr, IdentifierKind, Pattern};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;

use crate::common::{fresh_database, functions_pool, pg_store};
use values::{addresses, any_text, emails, networks, UNIT_TEST_VALUES};

/// A function evaluating `EXPR` (of `$1`, `$2`, `$3`) once per element of
/// its arrays, catching each error, so that thousands of values take one
/// round trip; static SQL, so that its plan is made once.
const TRY_EACH: &str = "
CREATE FUNCTION NAME(a text[], b text[], c text[])
RETURNS TABLE (value text, state text, message text) LANGUAGE plpgsql AS $$
BEGIN
    FOR k IN 1..coalesce(cardinality(a), 0) LOOP
        BEGIN
            value := (EXPR)::text;
            state := NULL;
            message := NULL;
        EXCEPTION WHEN OTHERS THEN
            value := NULL;
            GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
        END;
        RETURN NEXT;
    END LOOP;
END $$";

/// The functions of `TRY_EACH` the tests call, by name.
const TRIED: [(&str, &str); 3] = [
    ("try_normalise", "pglimit_normalise(a[k], b[k], c[k])"),
    ("try_ip_in", "pglimit_ip_in(a[k], b[k])"),
    ("try_email_at", "pglimit_email_at(a[k], b[k])"),
];

/// SQL's answer for one element: its value, or its SQLSTATE and message.
type Answer = Result<Option<String>, (String, String)>;

/// A database with this build's functions, and `try_each`.
async fn functions() -> PgPool {
    let url = fresh_database().await;
    drop(pg_store(&url).await); // installs the functions
    let pool = functions_pool(&url).await;
    for (name, expr) in TRIED {
        let create = TRY_EACH.replace("NAME", name).replace("EXPR", expr);
        sqlx::query(&create).execute(&pool).await.expect("create a try_ function");
    }
    pool
}

async fn try_each(pool: &PgPool, function: &str, rows: &[[&str; 3]]) -> Vec<Answer> {
    let column = |i: usize| rows.iter().map(|r| r[i].to_owned()).collect::<Vec<_>>();
    let answers: Vec<(Option<String>, Option<String>, Option<String>)> =
        sqlx::query_as(&format!("SELECT * FROM {function}($1, $2, $3)"))
            .bind(column(0))
            .bind(column(1))
            .bind(column(2))
            .fetch_all(pool)
            .await
            .unwrap_or_else(|e| panic!("{function}: {e}"));
    assert_eq!(answers.len(), rows.len());
    answers
        .into_iter()
        .map(|(value, state, message)| match state {
            None => Ok(value),
            Some(state) => Err((state, message.unwrap_or_default())),
        })
        .collect()
}

fn kind_name(kind: IdentifierKind) -> &'static str {
    match kind {
        IdentifierKind::Email => "email",
        IdentifierKind::Ip => "ip",
        IdentifierKind::Text => "text",
        IdentifierKind::TextFolded => "text_folded",
    }
}

/// The inputs `identifiers.sql` says it refuses with 0A000: those that need
/// Unicode folding, or UTS #46 for a punycode label.
fn beyond_sql(kind: IdentifierKind, raw: &str) -> bool {
    let value = raw.trim();
    let punycode = |v: &str| {
        v.to_ascii_lowercase()
            .rsplit_once('@')
            .is_some_and(|(_, d)| d.split('.').any(|l| l.starts_with("xn--")))
    };
    match kind {
        IdentifierKind::TextFolded => !value.is_ascii(),
        IdentifierKind::Email => !value.is_ascii() || punycode(value),
        IdentifierKind::Ip | IdentifierKind::Text => false,
    }
}

/// What is wrong with SQL's answer to `raw`, if anything.
fn mismatch(kind: IdentifierKind, name: &str, raw: &str, sql: &Answer) -> Option<String> {
    let rust = kind.normalise(raw).map_err(|reason| format!("identifier {name:?} {reason}"));
    let refused_as_rust = |state: &str, message: &str| {
        state == "22023" && rust.as_ref().err().map(|m| m.as_str()) == Some(message)
    };
    let fine = match sql {
        Ok(Some(value)) => rust.as_ref() == Ok(value),
        Err((state, _)) if state == "0A000" => beyond_sql(kind, raw),
        Err((state, message)) => refused_as_rust(state, message),
        Ok(None) => false,
    };
    (!fine).then(|| format!("{} {name} {raw:?}: Rust {rust:?}, SQL {sql:?}", kind_name(kind)))
}

/// Normalises every `(kind, name, raw)` in SQL; asserts each matches Rust,
/// and returns how many SQL normalised.
async fn assert_normalised_alike(pool: &PgPool, cases: &[(IdentifierKind, &str, String)]) -> usize {
    let rows: Vec<[&str; 3]> = cases.iter().map(|(k, n, r)| [kind_name(*k), *n, r.as_str()]).collect();
    let answers = try_each(pool, "try_normalise", &rows).await;
    let problems: Vec<String> =
        cases.iter().zip(&answers).filter_map(|((k, n, r), sql)| mismatch(*k, n, r, sql)).collect();
    assert!(problems.is_empty(), "{} of {} differ:\n{}", problems.len(), cases.len(), problems.join("\n"));
    answers.iter().filter(|a| matches!(a, Ok(Some(_)))).count()
}

const KINDS: [IdentifierKind; 4] =
    [IdentifierKind::Email, IdentifierKind::Ip, IdentifierKind::Text, IdentifierKind::TextFolded];

#[tokio::test]
async fn sql_normalises_the_unit_tests_values_as_rust_does_or_refuses_what_it_cannot() {
    let pool = functions().await;
    let names = ["email", "user-name_2", "we\"ird\\name"];
    let cases: Vec<_> = UNIT_TEST_VALUES
        .iter()
        .flat_map(|raw| KINDS.iter().map(move |&kind| (kind, raw)))
        .zip(names.iter().cycle())
        .map(|((kind, raw), name)| (kind, *name, raw.to_string()))
        .collect();
    let normalised = assert_normalised_alike(&pool, &cases).await;
    assert!(normalised > cases.len() / 4, "only {normalised} of {} normalised", cases.len());
}

#[tokio::test]
async fn sql_normalises_thousands_of_generated_values_as_rust_does_or_refuses_what_it_cannot() {
    let pool = functions().await;
    let mut rng = StdRng::seed_from_u64(49);
    let mut cases = Vec::new();
    for _ in 0..1500 {
        let raw = any_text(&mut rng);
        cases.extend(KINDS.iter().map(|&kind| (kind, "v", raw.clone())));
    }
    cases.extend(addresses(&mut rng, 2000).into_iter().map(|raw| (IdentifierKind::Ip, "ip", raw)));
    cases.extend(emails(&mut rng, 2000).into_iter().map(|raw| (IdentifierKind::Email, "email", raw)));
    let normalised = assert_normalised_alike(&pool, &cases).await;
    assert!(normalised > cases.len() / 3, "only {normalised} of {} normalised", cases.len());
}

#[tokio::test]
async fn sql_derives_the_same_keys_as_bucket_key_in_all_three_scopes() {
    let pool = functions().await;
    let mut rng = StdRng::seed_from_u64(4949);
    for _ in 0..300 {
        let bytes: Vec<u8> = (0..rng.gen_range(32..=100)).map(|_| rng.gen()).collect();
        let secret = KeySecret::new(&bytes).expect("long enough");
        let (inner, outer) = secret.pads();
        let (policy, bucket, value) = (any_text(&mut rng), any_text(&mut rng), any_text(&mut rng));
        let algorithm = Algorithm::ALL[rng.gen_range(0..Algorithm::ALL.len())];
        let vals: Vec<String> = (0..rng.gen_range(0..4)).map(|_| any_text(&mut rng)).collect();
        let refs: Vec<&str> = vals.iter().map(String::as_str).collect();
        let (p, b, v) = (policy.as_str(), bucket.as_str(), value.as_str());
        let expected = [
            KeyScope::Policy { policy: p, bucket: b, algorithm, values: &refs },
            KeyScope::AdHoc { key: p, algorithm },
            KeyScope::OverrideValue { policy: p, identifier: b, value: v },
        ]
        .map(|scope| bucket_key(&secret, &scope).to_vec());
        let keys: (Vec<u8>, Vec<u8>, Vec<u8>) = sqlx::query_as(
            "SELECT pglimit_policy_key($1, $2, $3, $4, $5, $6), pglimit_adhoc_key($1, $2, $3, $5),
                    pglimit_override_value_key($1, $2, $3, $4, $7)",
        )
        .bind(&inner[..])
        .bind(&outer[..])
        .bind(p)
        .bind(b)
        .bind(algorithm.name())
        .bind(&vals)
        .bind(v)
        .fetch_one(&pool)
        .await
        .expect("keys");
        assert_eq!([keys.0, keys.1, keys.2], expected, "{p:?} {b:?} {algorithm:?} {vals:?} {v:?}");
    }
}

#[tokio::test]
async fn sql_matches_networks_as_rusts_patterns_do_and_refuses_the_networks_rust_refuses() {
    let pool = functions().await;
    let mut rng = StdRng::seed_from_u64(4950);
    let (nets, values) = (networks(&mut rng, 600), addresses(&mut rng, 600));
    let normalised: Vec<String> =
        values.iter().filter_map(|v| IdentifierKind::Ip.normalise(v).ok()).chain(values.clone()).collect();
    let mut rows: Vec<[String; 2]> = Vec::new();
    for net in &nets {
        // The network's own address lies in it, which random ones seldom do.
        let own = net.split('/').next().and_then(|a| IdentifierKind::Ip.normalise(a).ok());
        let others = (0..7).map(|_| normalised[rng.gen_range(0..normalised.len())].clone());
        rows.extend(own.into_iter().chain(others).map(|value| [value, net.clone()]));
    }
    let refs: Vec<[&str; 3]> = rows.iter().map(|[v, n]| [v.as_str(), n.as_str(), ""]).collect();
    let answers = try_each(&pool, "try_ip_in", &refs).await;
    let mut matched = 0;
    for ([value, net], sql) in rows.iter().zip(&answers) {
        let rust = match Cidr::parse(net) {
            Ok(_) => match Pattern::parse(IdentifierKind::Ip, net) {
                Ok(pattern) => Ok(Some(pattern.matches(value).to_string())),
                Err(e) => panic!("{net:?} is a CIDR but not a pattern: {e}"),
            },
            Err(reason) => Err(("22023".to_string(), reason)),
        };
        assert_eq!(sql, &rust, "{value:?} in {net:?}");
        matched += usize::from(rust == Ok(Some("true".into())));
    }
    assert!(matched > rows.len() / 20, "only {matched} of {} matched", rows.len());
}

#[tokio::test]
async fn sql_matches_email_domains_as_rusts_patterns_do() {
    let pool = functions().await;
    let mut rng = StdRng::seed_from_u64(4951);
    let values: Vec<String> = emails(&mut rng, 800)
        .iter()
        .map(|e| IdentifierKind::Email.normalise(e).unwrap_or_else(|_| e.clone()))
        .collect();
    let mut rows = Vec::new();
    for value in &values {
        let domain =
            values[rng.gen_range(0..values.len())].rsplit_once('@').map_or("example.com", |(_, d)| d);
        let Ok(pattern) = Pattern::parse(IdentifierKind::Email, &format!("*@{domain}")) else { continue };
        let Pattern::EmailDomain(held) = &pattern else { panic!("{pattern:?} is not a domain") };
        for v in [value.as_str(), &format!("x@{held}")] {
            rows.push(([v.to_owned(), held.clone()], pattern.matches(v)));
        }
    }
    let refs: Vec<[&str; 3]> = rows.iter().map(|([v, d], _)| [v.as_str(), d.as_str(), ""]).collect();
    let answers = try_each(&pool, "try_email_at", &refs).await;
    for (([value, domain], rust), sql) in rows.iter().zip(&answers) {
        assert_eq!(sql, &Ok(Some(rust.to_string())), "{value:?} at {domain:?}");
    }
    assert!(rows.iter().filter(|(_, m)| !m).count() > rows.len() / 4, "too few mismatches");
}
