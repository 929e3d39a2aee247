//! Envoy's rate limit service, `envoy.service.ratelimit.v3.RateLimitService`,
//! on `PGLIMIT_GRPC_BIND`: the same checks as `/check`, through the same
//! path (shadow, blocks, overrides, metrics, fallback), over gRPC.
//!
//! What a caller can make the service hold is bounded before anything is
//! decoded: the token is checked on the call's metadata, a message is read
//! only up to [`MAX_MESSAGE_BYTES`], and a connection has a bounded number
//! of streams and of calls in progress.

use std::future::Future;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use super::check::decide;
use super::envoy::{self, shown, Asked};
use super::{AppState, Auth};
use crate::limiter::{CheckError, Invalid};
use crate::policy::Policy;

/// Largest message read or written, encoded. Envoy's requests are a few
/// hundred bytes (a domain, a handful of descriptors of a handful of short
/// entries) and the answers as small; decoded, a message can take some 30
/// times its size (an empty descriptor is 2 bytes on the wire, 56 decoded),
/// so this keeps a call to a few MiB, where tonic's default of 4 MiB let
/// one call take over 100 MiB.
const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Streams a connection may have open (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`):
/// a client such as Envoy holds further calls or opens another connection,
/// and a stream beyond it is refused, so a connection holds at most this
/// many request heads (16 KiB each, hyper's default) besides its
/// flow-control window of unread bytes (1 MiB, hyper's default).
const MAX_STREAMS_PER_CONNECTION: u32 = 128;

/// Calls of one connection decoded and decided at once; its other streams
/// wait, undecoded. The benchmarks' busiest runs had 32 calls in flight in
/// all (32 connections of one each), with the service at its ceiling
/// (docs/performance.md); with it, a connection with a token holds at
/// most 32 decoded messages.
const CALLS_PER_CONNECTION: usize = 32;

/// Serves the rate limit service on `listener` until `shutdown` completes,
/// then lets calls in flight finish.
pub async fn serve_grpc(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let timeout = state.request_timeout;
    let authenticate = Authenticate(state.auth.clone());
    let envoy = RateLimitServiceServer::new(Envoy { state })
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .timeout(timeout)
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .concurrency_limit_per_connection(CALLS_PER_CONNECTION)
        .add_service(InterceptedService::new(envoy, authenticate))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(std::io::Error::other)
}

/// API tokens as on /check (Envoy sends one as `initial_metadata`), checked
/// on the call's metadata: tonic runs an interceptor before it reads the
/// message, so a call without a token is answered before its body is read.
#[derive(Clone)]
struct Authenticate(Auth);

impl Interceptor for Authenticate {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        self.0.verify(request.metadata().as_ref()).map_err(|e| Status::unauthenticated(e.to_string()))?;
        Ok(request)
    }
}

struct Envoy {
    state: AppState,
}

#[tonic::async_trait]
impl RateLimitService for Envoy {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let Asked { check, descriptors } = envoy::read(request.into_inner())?;
        let policy = self.state.checks.policies().get(check.policy_label()).cloned();
        if let Some(bucket) = policy.as_deref().and_then(Policy::leasing_bucket) {
            return Err(Status::failed_precondition(format!(
                "bucket {:?} of this policy is a concurrency bucket, and Envoy cannot release a lease: \
                 check it through POST /check and /release",
                &*bucket.name
            )));
        }
        match decide(&self.state, &check, None).await {
            Ok(decision) => Ok(Response::new(envoy::respond(&decision, policy.as_deref(), &descriptors))),
            Err(CheckError::StoreUnavailable) => Ok(Response::new(envoy::fail_closed(descriptors.len()))),
            Err(CheckError::Invalid(invalid)) => Err(status_of(invalid)),
        }
    }
}

/// The domain names the policy, so an unknown one is NOT_FOUND; anything
/// else wrong with the values is INVALID_ARGUMENT, naming the entry. Names
/// the request chose are shortened (see [`shown`]).
fn status_of(invalid: Invalid) -> Status {
    match invalid {
        Invalid::UnknownPolicy(name) => Status::not_found(format!(
            "no policy named {:?} is configured (the request's domain)",
            shown(&name)
        )),
        Invalid::UnexpectedIdentifier { name, policy, expected } => {
            let invalid = Invalid::UnexpectedIdentifier { name: shown(&name).into_owned(), policy, expected };
            Status::invalid_argument(format!("descriptor entry: {invalid}"))
        }
        Invalid::MissingIdentifier { .. } | Invalid::BadIdentifier { .. } => {
            Status::invalid_argument(format!("descriptor entry: {invalid}"))
        }
        Invalid::CostRange | Invalid::CostOverLimit { .. } => {
            Status::invalid_argument(format!("hits_addend: {invalid}"))
        }
        other => Status::invalid_argument(other.to_string()),
    }
}
