//! What a caller can make the gRPC service hold, and what it answers past
//! the caps. The floods are hand-made gRPC frames sent as raw HTTP/2
//! requests, so that this process builds a 4 MiB message once rather than
//! a decoded copy per call.

use std::convert::Infallible;

use futures_util::future::join_all;
use futures_util::{stream, StreamExt};
use tonic::codegen::{http, Bytes};
use tower::ServiceExt;

use super::*;

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// tonic's default cap on a message, up to which the service used to read
/// and decode a call before looking at its token.
const FOUR_MIB: usize = 4 * 1024 * 1024;

/// What the floods below may add to the service's peak memory. Refused at
/// their heads, the calls leave at most their three connections' HTTP/2
/// flow-control windows of unread bytes (hyper's default, 1 MiB each) and
/// a few KiB per stream: ten times the windows. Read and decoded, any one
/// of the whole messages alone would take 112 MiB, three and a half times
/// this.
const FLOOD_BUDGET_KIB: u64 = 32 * 1024;

/// A 4 MiB `RateLimitRequest` of empty descriptors, as a gRPC frame: each
/// is 2 bytes on the wire and 56 decoded, so 2 Mi of them decode to 112 MiB.
fn four_mib_of_empty_descriptors() -> Bytes {
    let mut frame = Vec::with_capacity(5 + FOUR_MIB);
    frame.push(0); // not compressed
    frame.extend_from_slice(&u32::try_from(FOUR_MIB).expect("4 MiB").to_be_bytes());
    for _ in 0..FOUR_MIB / 2 {
        frame.extend_from_slice(&[0x12, 0x00]); // field 2 (descriptors), 0 bytes long
    }
    Bytes::from(frame)
}

/// A call whose message is never finished: all but its last 2 bytes, then
/// nothing, the stream left open.
fn unfinished(frame: &Bytes) -> axum::body::Body {
    let most = frame.slice(..frame.len() - 2);
    let chunks = stream::once(async move { Ok::<_, Infallible>(most) }).chain(stream::pending());
    axum::body::Body::from_stream(chunks)
}

/// Calls ShouldRateLimit without a token, sending `body`; the answer's code.
async fn without_token(channel: Channel, body: axum::body::Body) -> tonic::Code {
    let request = http::Request::post(PATH)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(body))
        .expect("a request");
    let response = channel.oneshot(request).await.expect("an answer");
    if let Some(status) = tonic::Status::from_header_map(response.headers()) {
        return status.code();
    }
    let body = http_body_util::BodyExt::collect(response.into_body()).await.expect("the answer's body");
    let trailers = body.trailers().expect("an answer ends with its status");
    tonic::Status::from_header_map(trailers).expect("grpc-status").code()
}

async fn connection(addr: &str) -> Channel {
    Channel::from_shared(format!("http://{addr}")).expect("an endpoint").connect().await.expect("connect")
}

/// The process's peak resident memory so far (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("a VmHWM line");
    line.split_whitespace().nth(1).and_then(|kib| kib.parse().ok()).expect("VmHWM in kB")
}

/// Envoy's login check with the token: answered, counted, the `n`th.
async fn envoy_logs_in(envoy: &mut RateLimitServiceClient<Channel>, n: u32) {
    let answer = ask_with_token(envoy, login("erin@example.com", "192.0.2.44")).await;
    assert_eq!(answer.overall_code(), Code::Ok, "call {n}");
    let remaining: Vec<u32> = answer.statuses.iter().map(|s| s.limit_remaining).collect();
    assert_eq!(remaining, [5 - n, 20 - n, 50 - n], "call {n}");
}

async fn ask_with_token(
    envoy: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    envoy.should_rate_limit(with_token(request)).await.expect("an answer").into_inner()
}

async fn refused(envoy: &mut RateLimitServiceClient<Channel>, request: RateLimitRequest) -> tonic::Status {
    envoy.should_rate_limit(with_token(request)).await.expect_err("refused")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_without_a_token_are_refused_unread_so_memory_stays_bounded_and_envoy_is_served() {
    let dir = temp_dir("grpc-flood");
    let (service, addr) = service(&[("PGLIMIT_API_TOKENS", TOKEN)], &dir).await;
    let mut envoy = client(&addr).await;
    envoy_logs_in(&mut envoy, 1).await;
    // One refusal (of an empty message) before, so that the baseline has run its code.
    let refused = without_token(connection(&addr).await, axum::body::Body::from(vec![0; 5])).await;
    assert_eq!(refused, tonic::Code::Unauthenticated);
    let baseline = peak_rss_kib(service.child.id());

    // 16 whole 4 MiB messages on one connection, and 2 × 128 streams
    // (the most a connection may open) of unfinished ones, held open.
    let frame = four_mib_of_empty_descriptors();
    let whole = connection(&addr).await;
    let mut calls: Vec<_> =
        (0..16).map(|_| tokio::spawn(without_token(whole.clone(), frame.clone().into()))).collect();
    for _ in 0..2 {
        let held = connection(&addr).await;
        calls.extend((0..128).map(|_| tokio::spawn(without_token(held.clone(), unfinished(&frame)))));
    }
    envoy_logs_in(&mut envoy, 2).await;
    let codes = join_all(calls).await;
    envoy_logs_in(&mut envoy, 3).await;

    let grown = peak_rss_kib(service.child.id()).saturating_sub(baseline);
    assert!(grown <= FLOOD_BUDGET_KIB, "peak memory grew by {grown} KiB (budget {FLOOD_BUDGET_KIB})");
    for (n, code) in codes.into_iter().enumerate() {
        assert_eq!(code.expect("a call"), tonic::Code::Unauthenticated, "call {n}: refused, not held");
    }
    service.terminate();
}

/// Requests whose error repeats `name`: as the domain, as an entry key the
/// policy does not know, and as one given two values.
fn mistakes_naming(name: &str) -> [(RateLimitRequest, tonic::Code); 3] {
    let mut unknown = login("frank@example.com", "192.0.2.45");
    unknown.domain = name.to_owned();
    let mut stranger = login("frank@example.com", "192.0.2.45");
    stranger.descriptors.push(descriptor(&[(name, "v")]));
    let mut twice = login("frank@example.com", "192.0.2.45");
    twice.descriptors = vec![descriptor(&[(name, "a")]), descriptor(&[(name, "b")])];
    [
        (unknown, tonic::Code::NotFound),
        (stranger, tonic::Code::InvalidArgument),
        (twice, tonic::Code::InvalidArgument),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_caps_are_refused_naming_the_cap_and_errors_repeat_only_the_start_of_long_names() {
    let dir = temp_dir("grpc-caps");
    let (service, addr) = service(&[("PGLIMIT_API_TOKENS", TOKEN)], &dir).await;
    let mut envoy = client(&addr).await;
    let frank = descriptor(&[("email", "frank@example.com"), ("ip", "192.0.2.45")]);
    let mut most = login("frank@example.com", "192.0.2.45");
    most.descriptors = vec![frank.clone(); 32];
    assert_eq!(ask_with_token(&mut envoy, most.clone()).await.statuses.len(), 32, "32 descriptors are fine");

    most.descriptors.push(frank);
    let error = refused(&mut envoy, most).await;
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    assert_eq!(error.message(), "descriptors: 33 given, at most 32 are accepted");

    let keys: Vec<String> = (0..33).map(|i| format!("k{i}")).collect();
    let entries: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();
    let mut wide = login("frank@example.com", "192.0.2.45");
    wide.descriptors = vec![descriptor(&entries)];
    let error = refused(&mut envoy, wide).await;
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    assert_eq!(error.message(), "descriptors[0].entries: 33 given, at most 32 are accepted");

    let big = login(&"f".repeat(70_000), "192.0.2.45");
    let error = refused(&mut envoy, big).await;
    assert_eq!(error.code(), tonic::Code::OutOfRange, "{error:?}");
    assert!(error.message().contains("65536"), "names the limit: {}", error.message());

    let long = "x".repeat(20_000);
    let shown = format!("\"{}…\"", "x".repeat(64));
    for (request, code) in mistakes_naming(&long) {
        let error = refused(&mut envoy, request).await;
        assert_eq!(error.code(), code, "{}", error.message());
        assert!(error.message().contains(&shown) && error.message().len() < 200, "{}", error.message());
    }
    service.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_with_a_concurrency_bucket_is_refused_naming_the_bucket_as_envoy_cannot_release() {
    let dir = temp_dir("grpc-leases");
    let policies = common::policy_file(
        r#"
        [policies.export]
        identifiers = { account = "text" }
        [[policies.export.buckets]]
        name = "in_flight"
        on = ["account"]
        limit = 2
        algorithm = "concurrency"
        lease = "30s"
    "#,
    );
    let (service, addr) =
        service(&[("PGLIMIT_POLICIES", policies.to_str().expect("UTF-8 path"))], &dir).await;
    let mut envoy = client(&addr).await;
    let export = RateLimitRequest {
        domain: "export".into(),
        descriptors: vec![descriptor(&[("account", "acct_42")])],
        hits_addend: 0,
    };
    for call in 1..=3 {
        let error = envoy.should_rate_limit(export.clone()).await.expect_err("refused, taking no slot");
        assert_eq!(error.code(), tonic::Code::FailedPrecondition, "call {call}: {error:?}");
        assert!(
            error.message().contains("\"in_flight\"") && error.message().contains("/release"),
            "{error:?}"
        );
    }
    let check = json!({ "policy": "export", "identifiers": { "account": "acct_42" } });
    let (status, answer) = service.check(check).await;
    assert_eq!((status, &answer["remaining"]), (200, &json!(1)), "the refused calls took no slot: {answer}");
    service.terminate();
}
