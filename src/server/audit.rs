//! `GET /admin/audit`: the audit log, newest first, a page at a time,
//! filtered by `action` and `target`. A page's `next` is a cursor that
//! holds where the page ended and a tag of its filters, so that a cursor
//! from another query is refused rather than silently skipping rows.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::admin::{at, verify};
use super::AppState;
use crate::error::Error;
use crate::storage::{AuditAction, AuditQuery, AuditRow};

/// Most rows one page returns, and the default.
const MAX_PAGE: u32 = 1_000;
const DEFAULT_PAGE: u32 = 100;

/// Every parameter as text, so that each mistake names its own field.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listing {
    action: Option<String>,
    target: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<Listing>, QueryRejection>,
) -> Result<Json<Value>, Error> {
    verify(&state, &headers)?;
    let Query(listing) = query.map_err(|e| Error::field("query", e.body_text()))?;
    let mut page = page_of(&listing)?;
    let limit = page.limit;
    page.limit += 1; // one more tells whether there is a next page
    let mut rows = state.actions.audit(&page).await?;
    let next = (rows.len() > limit as usize).then(|| {
        rows.truncate(limit as usize);
        rows.last().map(|last| cursor(last.id, &page))
    });
    let entries: Vec<Value> = rows.iter().map(entry).collect();
    Ok(Json(json!({ "entries": entries, "next": next.flatten() })))
}

/// The query the parameters ask for; a mistake names its field.
fn page_of(listing: &Listing) -> Result<AuditQuery, Error> {
    let action = match listing.action.as_deref() {
        None => None,
        Some(name) => Some(AuditAction::parse(name).ok_or_else(|| {
            let known: Vec<&str> = AuditAction::ALL.iter().map(|a| a.as_str()).collect();
            Error::field("action", format!("action must be one of {}", known.join(", ")))
        })?),
    };
    let limit = match listing.limit.as_deref() {
        None => DEFAULT_PAGE,
        Some(text) => text.parse().ok().filter(|l| (1..=MAX_PAGE).contains(l)).ok_or_else(|| {
            Error::field("limit", format!("limit must be a whole number from 1 to {MAX_PAGE}"))
        })?,
    };
    // Postgres' text holds no NUL, so no target stored has one: said, not sent.
    if listing.target.as_deref().is_some_and(|t| t.contains('\0')) {
        return Err(Error::field("target", "target cannot contain a NUL character"));
    }
    let mut page = AuditQuery { action, target: listing.target.clone(), before: None, limit };
    if let Some(text) = listing.cursor.as_deref() {
        page.before = Some(before(text, &page)?);
    }
    Ok(page)
}

/// The id a cursor continues from, if it was made for this query's filters.
fn before(text: &str, page: &AuditQuery) -> Result<i64, Error> {
    let malformed =
        || Error::field("cursor", "cursor is not one this service gave: pass a page's next as is");
    let (id, tag) = text.split_once('.').ok_or_else(malformed)?;
    let id: i64 = id.parse().ok().filter(|id| *id > 0).ok_or_else(malformed)?;
    if tag != filters_tag(page) {
        return Err(Error::field(
            "cursor",
            "cursor is from a query with other filters: pass action and target as on the first page",
        ));
    }
    Ok(id)
}

/// The cursor of the page after one that ended at `last`.
fn cursor(last: i64, page: &AuditQuery) -> String {
    format!("{last}.{}", filters_tag(page))
}

/// 16 hex digits that differ between any two sets of filters.
fn filters_tag(page: &AuditQuery) -> String {
    let mut hash = Sha256::new();
    hash.update(page.action.map_or("", |a| a.as_str()).as_bytes());
    // A leading byte tells an absent target from an empty one.
    match &page.target {
        None => hash.update([0u8]),
        Some(target) => {
            hash.update([1u8]);
            hash.update(target.as_bytes());
        }
    }
    hex::encode(&hash.finalize()[..8])
}

fn entry(row: &AuditRow) -> Value {
    json!({
        "id": row.id.to_string(),
        "at": at(&row.at),
        "actor": row.actor,
        "request_id": row.request_id,
        "action": row.action,
        "target": row.target,
        "detail": row.detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(action: Option<AuditAction>, target: Option<&str>) -> AuditQuery {
        AuditQuery { action, target: target.map(str::to_owned), before: None, limit: 10 }
    }

    #[test]
    fn a_cursor_continues_only_the_query_it_was_made_for() {
        let login = page(Some(AuditAction::Block), Some("login/ip"));
        let next = cursor(42, &login);
        assert_eq!(before(&next, &login).expect("the same query"), 42);
        for other in
            [page(None, Some("login/ip")), page(Some(AuditAction::Block), None), page(None, Some(""))]
        {
            assert!(
                matches!(before(&next, &other), Err(Error::InvalidField { field, .. }) if field == "cursor")
            );
        }
        for malformed in ["", "42", "x.y", "-1.abc", "0.00"] {
            assert!(before(malformed, &login).is_err(), "{malformed}");
        }
    }
}
