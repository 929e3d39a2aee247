//! Behind a proxy, in the report of `bench/run`: the `bench` policy checked
//! through forward-auth (`GET /auth/bench`) and Envoy's gRPC protocol
//! (`ShouldRateLimit`) on the instance that served `/check`'s policy form
//! just before, in the same run, set against it.

use crate::numbers::{ms, thousands};
use crate::record::{find, Record};

/// pglimit's scenarios behind a proxy; each has the policy form's twin.
pub const SCENARIOS: [&str; 2] = ["allow-auth", "allow-grpc"];

pub const INTRO: &str =
    "Behind a proxy: the policy form's `bench` policy and identifiers through forward-auth \
(`GET /auth/bench`, identifiers in headers) and Envoy's gRPC rate limit service (`ShouldRateLimit`, one \
descriptor per bucket), against `POST /check` on the same instance in this run (see *Behind a proxy* below).";

pub const HOW_TO_READ: &str = "\
- *Behind a proxy*: pglimit's requests/s and p99 in the policy form (`POST /check`, JSON body), then through \
forward-auth (`allow-auth`: `GET /auth/bench` with `X-User-Email: u<N>@example.com` and `X-Forwarded-For: \
198.51.100.<M>`, read by the policy's `[forward_auth]` table with `trusted_hops = 1`, no body) and through Envoy's \
rate limit service (`allow-grpc`: `ShouldRateLimit` on `PGLIMIT_GRPC_BIND`, domain `bench`, descriptors \
`[{email}]` and `[{ip}]`, from `bench/grpc_load.rs`: one HTTP/2 connection per client, one call in flight on \
each, as wrk's connections), at the same client count, measured one after the other on one instance; \
*× /check*: their requests/s over the policy form's. The same check, the same statement: what differs is \
reading the request and writing the answer. For gRPC, answers other than `OK` count as wrong statuses and \
failed calls as socket errors; its probe is the policy form on the same instance, since a gRPC answer does \
not say which store decided. The gRPC rows have no *× HTTP ceiling* (the ceiling speaks HTTP/1.1 and JSON).";

/// A client count at which pglimit's policy form was measured without one
/// of the proxy scenarios.
pub fn missing(records: &[Record]) -> Vec<String> {
    let pglimit = |scenario: &'static str| {
        records.iter().filter(move |r| r.system == "pglimit" && r.scenario == scenario)
    };
    let mut missing = Vec::new();
    for policy in pglimit("allow-policy") {
        for scenario in SCENARIOS {
            if !pglimit(scenario).any(|r| r.concurrency == policy.concurrency) {
                missing.push(format!("pglimit {scenario} c={}", policy.concurrency));
            }
        }
    }
    missing
}

/// One row per client count at which pglimit's policy form was measured:
/// its requests/s and p99, then forward-auth's and gRPC's, each with its
/// requests/s over the policy form's. None when neither proxy scenario ran.
pub fn against_check(records: &[Record]) -> Option<String> {
    if !records.iter().any(|r| r.system == "pglimit" && SCENARIOS.contains(&r.scenario.as_str())) {
        return None;
    }
    let mut rows = vec![
        "| clients | `/check` requests/s | `/check` p99 ms | forward-auth requests/s | forward-auth p99 ms \
         | forward-auth × /check | gRPC requests/s | gRPC p99 ms | gRPC × /check |"
            .to_string(),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|".to_string(),
    ];
    // In the main table's order: by client count.
    for check in records.iter().filter(|r| r.system == "pglimit" && r.scenario == "allow-policy") {
        let mut row = format!("| {} | {} | {} |", check.concurrency, thousands(check.rps), ms(check.p99_us));
        for scenario in SCENARIOS {
            let (rps, p99, times) = match find(records, "pglimit", scenario, check.concurrency) {
                Some(r) => (thousands(r.rps), ms(r.p99_us), r.times(Some(check))),
                None => (String::new(), String::new(), String::new()),
            };
            row.push_str(&format!(" {rps} | {p99} | {times} |"));
        }
        rows.push(row);
    }
    Some(rows.join("\n"))
}
