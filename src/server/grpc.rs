//! Envoy's rate limit service, `envoy.service.ratelimit.v3.RateLimitService`,
//! on `PGLIMIT_GRPC_BIND`: the same checks as `/check`, through the same
//! path (shadow, blocks, overrides, metrics, fallback), over gRPC.

use std::future::Future;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use super::check::decide;
use super::envoy::{self, Asked};
use super::AppState;
use crate::limiter::{CheckError, Invalid};

/// Serves the rate limit service on `listener` until `shutdown` completes,
/// then lets calls in flight finish.
pub async fn serve_grpc(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let timeout = state.request_timeout;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .timeout(timeout)
        .add_service(RateLimitServiceServer::new(Envoy { state }))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(std::io::Error::other)
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
        let (metadata, _, request) = request.into_parts();
        // API tokens as on /check: Envoy sends one as `initial_metadata`.
        (self.state.auth.verify(&metadata.into_headers()))
            .map_err(|e| Status::unauthenticated(e.to_string()))?;
        let Asked { check, descriptors } = envoy::read(request)?;
        let policy = self.state.limiter.policies().get(check.policy_label()).cloned();
        match decide(&self.state, &check).await {
            Ok(decision) => Ok(Response::new(envoy::respond(&decision, policy.as_deref(), &descriptors))),
            Err(CheckError::StoreUnavailable) => Ok(Response::new(envoy::fail_closed(descriptors.len()))),
            Err(CheckError::Invalid(invalid)) => Err(status_of(invalid)),
        }
    }
}

/// The domain names the policy, so an unknown one is NOT_FOUND; anything
/// else wrong with the values is INVALID_ARGUMENT, naming the entry.
fn status_of(invalid: Invalid) -> Status {
    match invalid {
        Invalid::UnknownPolicy(name) => {
            Status::not_found(format!("no policy named {name:?} is configured (the request's domain)"))
        }
        Invalid::UnexpectedIdentifier { .. }
        | Invalid::MissingIdentifier { .. }
        | Invalid::BadIdentifier { .. } => Status::invalid_argument(format!("descriptor entry: {invalid}")),
        Invalid::CostRange | Invalid::CostOverLimit { .. } => {
            Status::invalid_argument(format!("hits_addend: {invalid}"))
        }
        other => Status::invalid_argument(other.to_string()),
    }
}
