//! The gRPC load generator of `bench/run`: Envoy's
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` asked by
//! CLIENTS callers for SECONDS, each on an HTTP/2 connection of its own with
//! one call in flight at a time (as each of wrk's connections has one
//! request in flight), so that its figures compare with wrk's at the same
//! client count. No ghz or other gRPC bench tool is packaged in the
//! registries these machines reach, hence this example.
//!
//! `cargo run --release --example grpc-load -- ADDR CLIENTS SECONDS [THREADS]`
//!
//! Each call is what Envoy sends for the `bench` policy of
//! bench/policies.toml, one descriptor per bucket: domain `bench`,
//! descriptors `[{email}]` and `[{ip}]` with `u<N>@example.com` and
//! `198.51.100.<M>`, N random of 1..BENCH_KEYS (default 10,000) and
//! M = 1 + (N - 1) % 254: the identifiers of check.lua's policy mode.
//! BENCH_POLICY names another domain.
//!
//! With `BENCH_GRPC_SHAPE=key` each call carries one descriptor of one entry,
//! `[{key}]`, with check.lua's ad hoc keys by its BENCH_MODE: `k<N>` (random,
//! the default), `hot`, or `deny<N>`, N random of 1..BENCH_KEYS: the shape
//! bench/limitador sends to pglimit (a policy with one bucket on `key`) and
//! to limitador (`descriptors[0].key`) alike.
//!
//! At the end it prints one line, `WRKJSON {...}`, with the fields of
//! check.lua's but `bytes`: `status_errors` counts answers other than OK, `read_errors`
//! calls that failed with a gRPC error, `connect_errors` callers that could
//! not connect. Exits 1 when no call was answered at all.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use rand::{Rng, SeedableRng};
use tonic::transport::Endpoint;

/// What one caller saw: the latency of every answered call (µs), and its errors.
#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    not_ok: u64,
    failed: u64,
    connect_failed: u64,
}

fn descriptor(key: &str, value: String) -> RateLimitDescriptor {
    RateLimitDescriptor { entries: vec![Entry { key: key.into(), value }], ..Default::default() }
}

/// What each call carries: the `bench` policy's two descriptors, or (BENCH_GRPC_SHAPE=key)
/// one descriptor `[{key}]` named as check.lua's BENCH_MODE names its ad hoc keys.
#[derive(Clone, Copy)]
enum Shape {
    Policy,
    Random,
    Hot,
    Deny,
}

impl Shape {
    fn from_env() -> Result<Shape, String> {
        let var = |name| std::env::var(name).unwrap_or_default();
        match (var("BENCH_GRPC_SHAPE").as_str(), var("BENCH_MODE").as_str()) {
            ("" | "policy", _) => Ok(Shape::Policy),
            ("key", "" | "random") => Ok(Shape::Random),
            ("key", "hot") => Ok(Shape::Hot),
            ("key", "deny") => Ok(Shape::Deny),
            ("key", mode) => Err(format!("BENCH_MODE={mode}: the key shape sends random, hot or deny keys")),
            (shape, _) => Err(format!("BENCH_GRPC_SHAPE={shape}: policy or key")),
        }
    }
}

/// Envoy's request for key number `n` (1-based).
fn request(domain: &str, shape: Shape, n: u32) -> RateLimitRequest {
    let descriptors = match shape {
        Shape::Policy => vec![
            descriptor("email", format!("u{n}@example.com")),
            descriptor("ip", format!("198.51.100.{}", 1 + (n - 1) % 254)),
        ],
        Shape::Random => vec![descriptor("key", format!("k{n}"))],
        Shape::Hot => vec![descriptor("key", "hot".to_string())],
        Shape::Deny => vec![descriptor("key", format!("deny{n}"))],
    };
    RateLimitRequest { domain: domain.to_string(), descriptors, hits_addend: 0 }
}

/// One caller: connects, then calls back to back until `deadline`.
async fn caller(endpoint: Endpoint, domain: String, shape: Shape, keys: u32, deadline: Instant) -> Tally {
    let mut tally = Tally::default();
    let channel = match endpoint.connect().await {
        Ok(channel) => channel,
        Err(e) => {
            eprintln!("grpc-load: cannot connect: {e}");
            tally.connect_failed = 1;
            return tally;
        }
    };
    let mut client = RateLimitServiceClient::new(channel);
    let mut rng = rand::rngs::StdRng::from_entropy();
    while Instant::now() < deadline {
        let call = request(&domain, shape, rng.gen_range(1..=keys));
        let started = Instant::now();
        match client.should_rate_limit(call).await {
            Ok(answer) => {
                let answer = answer.into_inner();
                tally.latencies_us.push(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
                if answer.overall_code() != Code::Ok {
                    tally.not_ok += 1;
                }
            }
            Err(status) => {
                if tally.failed == 0 {
                    eprintln!("grpc-load: a call failed: {status}");
                }
                tally.failed += 1;
            }
        }
    }
    tally
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().clamp(1.0, sorted.len() as f64) as usize;
    sorted[rank - 1]
}

fn usage() -> ExitCode {
    eprintln!("usage: cargo run --release --example grpc-load -- ADDR CLIENTS SECONDS [THREADS]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (addr, clients, seconds, threads) = match args.as_slice() {
        [addr, clients, seconds, rest @ ..] if rest.len() <= 1 => {
            let threads = rest.first().map_or(Ok(2), |t| t.parse::<usize>());
            match (clients.parse::<usize>(), seconds.parse::<f64>(), threads) {
                (Ok(c), Ok(s), Ok(t)) if c > 0 && s > 0.0 && t > 0 => (addr.clone(), c, s, t),
                _ => return usage(),
            }
        }
        _ => return usage(),
    };
    let keys = std::env::var("BENCH_KEYS").ok().and_then(|k| k.parse::<u32>().ok()).unwrap_or(10_000).max(1);
    let domain = std::env::var("BENCH_POLICY").unwrap_or_else(|_| "bench".to_string());
    let shape = match Shape::from_env() {
        Ok(shape) => shape,
        Err(e) => {
            eprintln!("grpc-load: {e}");
            return usage();
        }
    };
    let endpoint = match Endpoint::from_shared(format!("http://{addr}")) {
        Ok(endpoint) => endpoint.tcp_nodelay(true),
        Err(e) => {
            eprintln!("grpc-load: {addr}: {e}");
            return usage();
        }
    };
    // As many runtime threads as wrk's, so the generator takes a like share of the machine.
    let runtime =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build() {
            Ok(runtime) => runtime,
            Err(e) => {
                eprintln!("grpc-load: cannot start a runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
    let (tallies, elapsed) = runtime.block_on(async move {
        let started = Instant::now();
        let deadline = started + Duration::from_secs_f64(seconds);
        let tasks: Vec<_> = (0..clients)
            .map(|_| tokio::spawn(caller(endpoint.clone(), domain.clone(), shape, keys, deadline)))
            .collect();
        let mut tallies = Vec::with_capacity(clients);
        for task in tasks {
            // A caller that panicked counts as one that never connected.
            tallies.push(task.await.unwrap_or_else(|_| Tally { connect_failed: 1, ..Tally::default() }));
        }
        (tallies, started.elapsed())
    });
    let mut latencies: Vec<u64> = tallies.iter().flat_map(|t| t.latencies_us.iter().copied()).collect();
    latencies.sort_unstable();
    let sum = |f: fn(&Tally) -> u64| tallies.iter().map(f).sum::<u64>();
    let requests = latencies.len() as u64;
    let mean = if requests > 0 { latencies.iter().sum::<u64>() as f64 / requests as f64 } else { 0.0 };
    println!(
        "WRKJSON {{\"requests\":{requests},\"duration_us\":{},\"connect_errors\":{},\
         \"read_errors\":{},\"write_errors\":0,\"status_errors\":{},\"timeouts\":0,\"lat_mean_us\":{mean:.1},\
         \"lat_p50_us\":{},\"lat_p90_us\":{},\"lat_p99_us\":{},\"lat_max_us\":{}}}",
        elapsed.as_micros(),
        sum(|t| t.connect_failed),
        sum(|t| t.failed),
        sum(|t| t.not_ok),
        percentile(&latencies, 50.0),
        percentile(&latencies, 90.0),
        percentile(&latencies, 99.0),
        latencies.last().copied().unwrap_or(0),
    );
    if requests == 0 {
        eprintln!("grpc-load: no call was answered");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
