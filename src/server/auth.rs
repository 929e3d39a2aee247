//! Bearer-token authentication for `/check`.

use axum::http::{header, HeaderMap};
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
        if self.is_open() {
            return Ok(());
        }
        let presented = headers
            .get(header::AUTHORIZATION)
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
