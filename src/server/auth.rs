//! Bearer-token authentication for `/check`.

use std::convert::Infallible;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::Error;

/// The accepted API tokens, kept only as SHA-256 digests. Comparing digests
/// in constant time leaks neither a token's bytes nor its length.
#[derive(Clone, Default)]
pub struct Auth {
    digests: Vec<[u8; 32]>,
}

impl Auth {
    pub fn new<'a>(tokens: impl IntoIterator<Item = &'a str>) -> Self {
        Self { digests: tokens.into_iter().map(digest).collect() }
    }

    /// True when no token is configured and every caller is let in.
    pub fn is_open(&self) -> bool {
        self.digests.is_empty()
    }

    pub fn verify(&self, headers: &HeaderMap) -> Result<(), Error> {
        self.verify_header(headers.get(header::AUTHORIZATION))
    }

    /// As [`Auth::verify`], given the request's (first) `Authorization` header.
    pub fn verify_header(&self, authorization: Option<&HeaderValue>) -> Result<(), Error> {
        if self.is_open() {
            return Ok(());
        }
        let presented = authorization
            .ok_or(Error::Unauthorized("missing Authorization: Bearer <token> header"))?
            .to_str()
            .ok()
            // The auth scheme is case-insensitive (RFC 9110, section 11.1).
            .and_then(|v| v.split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")))
            .map(|(_, token)| token)
            .ok_or(Error::Unauthorized("the Authorization header must be \"Bearer <token>\""))?;
        let presented = digest(presented.trim());
        // Compare against every token, so timing does not reveal which one matched.
        let matched = self.digests.iter().fold(0u8, |acc, d| acc | d.ct_eq(&presented).unwrap_u8());
        if matched == 1 {
            Ok(())
        } else {
            Err(Error::Unauthorized("the bearer token is not valid"))
        }
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A request's `Authorization` header alone, all that [`Auth::verify_header`]
/// reads: the `HeaderMap` extractor copies every header of every request.
pub struct Authorization(Option<HeaderValue>);

impl Authorization {
    pub fn value(&self) -> Option<&HeaderValue> {
        self.0.as_ref()
    }
}

impl<S: Sync> FromRequestParts<S> for Authorization {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(Self(parts.headers.get(header::AUTHORIZATION).cloned()))
    }
}
