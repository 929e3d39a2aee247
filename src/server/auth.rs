//! Bearer-token authentication for `/check`, and for the admin routes,
//! where the token also says who acted ([`Actor`]).

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::config::AdminToken;
use crate::error::Error;

/// Who presented an admin token: its configured name, or its fingerprint
/// (`token:` and 8 hex digits), never the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor(pub Arc<str>);

impl Actor {
    /// Whoever calls admin routes left open (a loopback bind without tokens).
    pub fn anonymous() -> Self {
        Self(Arc::from("anonymous"))
    }
}

/// The accepted tokens, kept only as SHA-256 digests, each with who it
/// stands for. Comparing digests in constant time leaks neither a token's
/// bytes nor its length.
#[derive(Clone, Default)]
pub struct Auth {
    digests: Vec<[u8; 32]>,
    /// Beside `digests`, one each: empty for API tokens.
    names: Vec<Arc<str>>,
}

impl Auth {
    pub fn new<'a>(tokens: impl IntoIterator<Item = &'a str>) -> Self {
        Self { digests: tokens.into_iter().map(digest).collect(), names: Vec::new() }
    }

    /// The admin tokens, each known by its name.
    pub fn admin(tokens: &[AdminToken]) -> Self {
        Self {
            digests: tokens.iter().map(|t| digest(&t.secret)).collect(),
            names: tokens.iter().map(|t| Arc::from(t.name.as_str())).collect(),
        }
    }

    /// Who the request's admin token stands for; [`Actor::anonymous`] when
    /// no token is configured.
    pub fn identify(&self, headers: &HeaderMap) -> Result<Actor, Error> {
        if self.is_open() {
            return Ok(Actor::anonymous());
        }
        let index = self.matched(headers.get(header::AUTHORIZATION))?;
        let name = self.names.get(index).cloned().ok_or(Error::Internal)?;
        Ok(Actor(name))
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
        self.matched(authorization).map(|_| ())
    }

    /// The index of the token presented, found by comparing every digest
    /// and selecting the match's index without a branch on it, so that
    /// timing does not reveal which token matched.
    fn matched(&self, authorization: Option<&HeaderValue>) -> Result<usize, Error> {
        let presented = authorization
            .ok_or(Error::Unauthorized("missing Authorization: Bearer <token> header"))?
            .to_str()
            .ok()
            // The auth scheme is case-insensitive (RFC 9110, section 11.1).
            .and_then(|v| v.split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")))
            .map(|(_, token)| token)
            .ok_or(Error::Unauthorized("the Authorization header must be \"Bearer <token>\""))?;
        let presented = digest(presented.trim());
        let (mut found, mut index) = (subtle::Choice::from(0), 0u64);
        for (i, d) in self.digests.iter().enumerate() {
            let same = d.ct_eq(&presented);
            index = u64::conditional_select(&index, &(i as u64), same);
            found |= same;
        }
        if bool::from(found) {
            Ok(usize::try_from(index).unwrap_or(usize::MAX))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::fingerprint;

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {token}")).unwrap());
        headers
    }

    fn token(name: &str, secret: &str) -> AdminToken {
        AdminToken { name: name.into(), secret: secret.into() }
    }

    #[test]
    fn an_admin_token_says_who_acted_and_any_other_is_refused() {
        let unnamed = fingerprint("s3");
        let auth = Auth::admin(&[token("alice", "s1"), token("bob", "s2"), token(&unnamed, "s3")]);
        assert_eq!(auth.identify(&bearer("s2")).expect("bob's").0.as_ref(), "bob");
        assert_eq!(auth.identify(&bearer("s1")).expect("alice's").0.as_ref(), "alice");
        assert_eq!(auth.identify(&bearer("s3")).expect("a fingerprint").0.as_ref(), unnamed);
        assert!(auth.identify(&bearer("alice:s1")).is_err(), "the secret alone is the bearer token");
        assert!(auth.identify(&HeaderMap::new()).is_err());
        assert_eq!(Auth::default().identify(&HeaderMap::new()).expect("open"), Actor::anonymous());
    }
}
