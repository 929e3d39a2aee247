//! Envoy's rate limit service (gRPC) of the real binary on a real
//! PostgreSQL, asked by a client generated from the same protos Envoy uses.

mod common;
#[path = "grpc/limits.rs"]
mod limits;

use std::path::Path;
use std::time::Duration;

use common::process::{
    restart_cluster, run_to_exit, start, stop_cluster, temp_dir, throwaway_cluster, wait_for_address, Running,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use pglimit::pg_cluster::StopMode;
use serde_json::json;
use tonic::transport::Channel;

/// The built-in login policy: email_ip 5 a minute, ip 20 a minute, email 50 per 15 minutes.
async fn service(extra: &[(&str, &str)], dir: &Path) -> (Running, String) {
    service_on(&common::fresh_database().await, extra, dir)
}

/// The service on the database at `url`; returns it and its gRPC address.
fn service_on(url: &str, extra: &[(&str, &str)], dir: &Path) -> (Running, String) {
    let mut envs = vec![
        ("DATABASE_URL", url),
        ("PGLIMIT_KEY_SECRET", common::SECRET),
        ("PGLIMIT_GRPC_BIND", "127.0.0.1:0"),
    ];
    envs.extend_from_slice(extra);
    let running = start(&envs, dir);
    let grpc = wait_for_address(&running.log, "listening for gRPC (Envoy's rate limit service)");
    (running, grpc)
}

async fn client(addr: &str) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}")).await.expect("connect to the gRPC service")
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    let entries = entries.iter().map(|(k, v)| Entry { key: k.to_string(), value: v.to_string() }).collect();
    RateLimitDescriptor { entries, ..Default::default() }
}

/// What Envoy sends for a login: one descriptor per bucket of the policy.
fn login(email: &str, ip: &str) -> RateLimitRequest {
    let descriptors = vec![
        descriptor(&[("email", email), ("ip", ip)]),
        descriptor(&[("ip", ip)]),
        descriptor(&[("email", email)]),
    ];
    RateLimitRequest { domain: "login".into(), descriptors, hits_addend: 0 }
}

/// The API token of the services that require one.
const TOKEN: &str = "envoy-token";

/// `request` with the token as Envoy sends it, in `initial_metadata`.
fn with_token<T>(request: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(request);
    let bearer = format!("Bearer {TOKEN}").parse().expect("metadata");
    request.metadata_mut().insert("authorization", bearer);
    request
}

async fn ask(client: &mut RateLimitServiceClient<Channel>, request: RateLimitRequest) -> RateLimitResponse {
    client.should_rate_limit(request).await.expect("an answer").into_inner()
}

fn figures(status: &DescriptorStatus) -> (Code, u32, Unit, u32) {
    let limit = status.current_limit.clone().expect("current_limit");
    (status.code(), limit.requests_per_unit, limit.unit(), status.limit_remaining)
}

fn header<'r>(response: &'r RateLimitResponse, name: &str) -> Option<&'r str> {
    response.response_headers_to_add.iter().find(|h| h.key == name).map(|h| h.value.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_requests_are_ok_then_over_limit_with_one_status_per_descriptor() {
    let dir = temp_dir("grpc-figures");
    let (service, addr) = service(&[], &dir).await;
    let mut client = client(&addr).await;
    for n in 1..=5u32 {
        let response = ask(&mut client, login("alice@example.com", "203.0.113.7")).await;
        assert_eq!(response.overall_code(), Code::Ok, "request {n}");
        let statuses: Vec<_> = response.statuses.iter().map(figures).collect();
        assert_eq!(
            statuses,
            [
                (Code::Ok, 5, Unit::Minute, 5 - n),
                (Code::Ok, 20, Unit::Minute, 20 - n),
                (Code::Ok, 3, Unit::Minute, 50 - n) // 50 per 15 minutes, never overstated
            ],
            "request {n}"
        );
        let reset = response.statuses[0].duration_until_reset.expect("duration_until_reset");
        assert!((0..=60).contains(&reset.seconds), "{reset:?}");
        assert_eq!(header(&response, "retry-after"), None);
    }
    let response = ask(&mut client, login("Alice@Example.com", "203.0.113.7")).await;
    assert_eq!(response.overall_code(), Code::OverLimit);
    let statuses: Vec<_> = response.statuses.iter().map(figures).collect();
    assert_eq!(
        statuses,
        [
            (Code::OverLimit, 5, Unit::Minute, 0),
            (Code::Ok, 20, Unit::Minute, 15),
            (Code::Ok, 3, Unit::Minute, 45)
        ]
    );
    let retry: u64 = header(&response, "retry-after").expect("Retry-After").parse().expect("seconds");
    assert!((1..=60).contains(&retry), "Retry-After: {retry}");
    assert_eq!(
        header(&response, "ratelimit-policy"),
        Some(r#""email_ip";q=5;w=60, "ip";q=20;w=60, "email";q=50;w=900"#)
    );
    assert_eq!(header(&response, "cache-control"), None, "Envoy adds these to upstream answers too");
    service.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_denied_by_one_descriptor_consumes_nothing_from_the_others() {
    let dir = temp_dir("grpc-all-or-nothing");
    let (service, addr) = service(&[], &dir).await;
    let mut client = client(&addr).await;
    for _ in 0..5 {
        assert_eq!(
            ask(&mut client, login("alice@example.com", "198.51.100.66")).await.overall_code(),
            Code::Ok
        );
    }
    // envoyproxy/ratelimit #1060: there, each of these would still count
    // against the ip and email descriptors.
    for _ in 0..30 {
        let response = ask(&mut client, login("alice@example.com", "198.51.100.66")).await;
        assert_eq!(response.overall_code(), Code::OverLimit);
    }
    let other_user = ask(&mut client, login("bob@example.com", "198.51.100.66")).await;
    assert_eq!(other_user.overall_code(), Code::Ok, "the IP's bucket was not spent by denials");
    assert_eq!(other_user.statuses[1].limit_remaining, 20 - 5 - 1);
    let other_ip = ask(&mut client, login("alice@example.com", "192.0.2.1")).await;
    assert_eq!(other_ip.overall_code(), Code::Ok, "alice is not locked out from elsewhere");
    assert_eq!(other_ip.statuses[2].limit_remaining, 50 - 5 - 1);
    service.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistakes_are_grpc_errors_naming_what_is_wrong_and_tokens_are_required() {
    let dir = temp_dir("grpc-errors");
    let (service, addr) = service(&[("PGLIMIT_API_TOKENS", TOKEN)], &dir).await;
    let mut client = client(&addr).await;
    let error = client.should_rate_limit(login("a@b.c", "192.0.2.9")).await.expect_err("no token");
    assert_eq!(error.code(), tonic::Code::Unauthenticated, "{error:?}");
    let ok = client.should_rate_limit(with_token(login("a@b.c", "192.0.2.9"))).await.expect("with the token");
    assert_eq!(ok.into_inner().overall_code(), Code::Ok);

    let mut unknown = login("a@b.c", "192.0.2.9");
    unknown.domain = "nope".into();
    let error = client.should_rate_limit(with_token(unknown)).await.expect_err("unknown domain");
    assert_eq!(error.code(), tonic::Code::NotFound);
    assert!(error.message().contains("\"nope\""), "{}", error.message());

    let missing = RateLimitRequest {
        domain: "login".into(),
        descriptors: vec![descriptor(&[("ip", "192.0.2.9")])],
        hits_addend: 1,
    };
    let error = client.should_rate_limit(with_token(missing)).await.expect_err("no email");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    assert!(error.message().contains("\"email\" is required"), "{}", error.message());

    let mut bad = login("not-an-address", "192.0.2.9");
    bad.hits_addend = 2;
    let error = client.should_rate_limit(with_token(bad)).await.expect_err("a bad email");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    assert!(error.message().contains("\"email\""), "{}", error.message());
    service.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_consumes_that_many_and_is_refused_once_it_no_longer_fits() {
    let dir = temp_dir("grpc-hits-addend");
    let (service, addr) = service(&[], &dir).await;
    let mut client = client(&addr).await;
    let twice = || RateLimitRequest { hits_addend: 2, ..login("carol@example.com", "203.0.113.20") };
    for n in 1..=2u32 {
        let response = ask(&mut client, twice()).await;
        assert_eq!(response.overall_code(), Code::Ok, "request {n}");
        let remaining: Vec<u32> = response.statuses.iter().map(|s| s.limit_remaining).collect();
        assert_eq!(remaining, [5 - 2 * n, 20 - 2 * n, 50 - 2 * n], "request {n}: 2 each time");
    }
    // email_ip has 1 left: a cost of 2 no longer fits, and takes nothing.
    let response = ask(&mut client, twice()).await;
    assert_eq!(response.overall_code(), Code::OverLimit);
    let statuses: Vec<_> = response.statuses.iter().map(|s| (s.code(), s.limit_remaining)).collect();
    assert_eq!(statuses, [(Code::OverLimit, 1), (Code::Ok, 16), (Code::Ok, 46)]);
    assert!(header(&response, "retry-after").is_some(), "a denial says when to retry");
    // The one left is still there for a cost of 1.
    let once = ask(&mut client, login("carol@example.com", "203.0.113.20")).await;
    assert_eq!(once.overall_code(), Code::Ok);
    assert_eq!(once.statuses[0].limit_remaining, 0);
    service.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_closed_policy_answers_over_limit_with_retry_after_1_while_postgres_is_away() {
    let dir = temp_dir("grpc-fail-closed");
    let policies = dir.join("policies.toml");
    let toml = r#"
        [policies.payout]
        on_store_error = "deny"
        identifiers = { user = "text" }
        [[policies.payout.buckets]]
        name = "user"
        on = ["user"]
        limit = 5
        window = "1h"
    "#;
    std::fs::write(&policies, toml).expect("policy file");
    // A check waits at most 20 × the DB timeout on Postgres; a call that
    // outlives that (plus the service's own 5 s) has hung, and fails here.
    let db_timeout_ms = 200;
    let patience = Duration::from_millis(20 * db_timeout_ms + 5_000);
    let cluster = throwaway_cluster().await;
    let url = cluster.url();
    let db_timeout = db_timeout_ms.to_string();
    let extra = [
        ("PGLIMIT_POLICIES", policies.to_str().expect("UTF-8 path")),
        ("PGLIMIT_DB_TIMEOUT_MS", &db_timeout),
    ];
    let (service, addr) = service_on(&url, &extra, &dir);
    let channel = Channel::from_shared(format!("http://{addr}")).expect("an endpoint").timeout(patience);
    let mut client = RateLimitServiceClient::new(channel.connect().await.expect("connect"));
    let payout = || {
        let descriptors = vec![descriptor(&[("user", "u1")]), descriptor(&[("user", "u1")])];
        RateLimitRequest { domain: "payout".into(), descriptors, hits_addend: 1 }
    };
    let answer = client.should_rate_limit(payout()).await.expect("an answer").into_inner();
    assert_eq!((answer.overall_code(), answer.statuses[0].limit_remaining), (Code::Ok, 4));

    let cluster = stop_cluster(cluster, StopMode::Fast).await;
    for n in 1..=3 {
        let answer = client.should_rate_limit(payout()).await.expect("an answer, not an error").into_inner();
        assert_eq!(answer.overall_code(), Code::OverLimit, "call {n}: fail closed never admits");
        let codes: Vec<Code> = answer.statuses.iter().map(DescriptorStatus::code).collect();
        assert_eq!(codes, [Code::OverLimit, Code::OverLimit], "call {n}: one status per descriptor");
        assert_eq!(header(&answer, "retry-after"), Some("1"), "call {n}");
    }
    let cluster = restart_cluster(cluster).await;
    let probe = json!({ "policy": "payout", "identifiers": { "user": "probe" } });
    service.wait_for_postgres(&probe).await;
    let answer = client.should_rate_limit(payout()).await.expect("an answer").into_inner();
    assert_eq!(answer.overall_code(), Code::Ok);
    assert_eq!(answer.statuses[0].limit_remaining, 3, "the refusals while it was away took nothing");
    service.terminate();
    drop(cluster);
}

#[test]
fn a_non_loopback_grpc_bind_without_api_tokens_is_refused_at_start_naming_it() {
    let (ok, stderr) = run_to_exit(&[
        ("PGLIMIT_GRPC_BIND", "0.0.0.0:0"),
        ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none"),
        ("PGLIMIT_KEY_SECRET", common::SECRET),
    ]);
    assert!(!ok, "it must not start: {stderr}");
    assert!(stderr.contains("PGLIMIT_GRPC_BIND") && stderr.contains("PGLIMIT_API_TOKENS"), "{stderr}");
    assert!(stderr.contains("0.0.0.0:0"), "the address refused: {stderr}");
}
