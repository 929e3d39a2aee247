//! Writing the compiled policies and the key secret
//! (`pglimit_policies`, `pglimit_key_secret`) in one transaction, so that a
//! check from SQL never sees one file's policies with another's absent.

use std::time::Duration;

use sqlx::postgres::PgConnection;
use sqlx::Connection;

use super::session::{Reach, Session};
use super::{Citus, PgStore};
use crate::storage::{CompiledPolicies, PolicyStore, StoreError};

const FORGET: &str = "DELETE FROM pglimit_policies WHERE NOT name = ANY ($1::text[])";

const WRITE: &str = "
INSERT INTO pglimit_policies (name, definition, source)
SELECT * FROM unnest($1::text[], $2::jsonb[], array_fill($3::text, ARRAY[cardinality($1::text[])]))
ON CONFLICT (name) DO UPDATE SET definition = EXCLUDED.definition, source = EXCLUDED.source, pushed_at = now()
WHERE (pglimit_policies.definition, pglimit_policies.source) IS DISTINCT FROM (EXCLUDED.definition, EXCLUDED.source)";

/// Each privilege asked apart: a list is true when any one is held.
const MAY_WRITE_SECRET: &str = "SELECT bool_and(has_table_privilege('pglimit_key_secret', p))
    FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS p";

const FORGET_SECRET: &str = "DELETE FROM pglimit_key_secret";

const SECRET: &str = "
INSERT INTO pglimit_key_secret (id, inner_pad, outer_pad, fingerprint) VALUES (1, $1, $2, $3)
ON CONFLICT (id) DO UPDATE SET inner_pad = EXCLUDED.inner_pad, outer_pad = EXCLUDED.outer_pad,
    fingerprint = EXCLUDED.fingerprint, written_at = now()
WHERE pglimit_key_secret.fingerprint <> EXCLUDED.fingerprint";

impl PolicyStore for PgStore {
    async fn publish(&self, compiled: &CompiledPolicies) -> Result<(), StoreError> {
        let compiled = compiled.clone();
        self.actions
            .transaction(&self.session, move |tx, keep| {
                Box::pin(async move { write(tx, keep, &compiled).await })
            })
            .await
    }
}

/// Writes `compiled` in the caller's transaction; a row that is already
/// as compiled is left alone, so that instances starting together do not
/// rewrite each other's rows.
pub(super) async fn write(
    tx: &mut PgConnection,
    keep: bool,
    compiled: &CompiledPolicies,
) -> Result<(), sqlx::Error> {
    let names: Vec<&str> = compiled.policies.iter().map(|(name, _)| name.as_str()).collect();
    let definitions: Vec<&serde_json::Value> = compiled.policies.iter().map(|(_, d)| d).collect();
    sqlx::query(FORGET).persistent(keep).bind(&names).execute(&mut *tx).await?;
    let write = sqlx::query(WRITE).persistent(keep).bind(&names).bind(&definitions).bind(&compiled.source);
    write.execute(&mut *tx).await?;
    write_secret(tx, keep, compiled.pads.as_ref()).await
}

/// Writes the secret's pads, or removes them (`None`). A role that may not
/// (the secret is its owner's; `sql/` reads it as the owner) only warns:
/// the owner can write it with `pglimit policies push`.
async fn write_secret(
    tx: &mut PgConnection,
    keep: bool,
    pads: Option<&([u8; 64], [u8; 64])>,
) -> Result<(), sqlx::Error> {
    let (may,): (bool,) = sqlx::query_as(MAY_WRITE_SECRET).persistent(keep).fetch_one(&mut *tx).await?;
    match (pads, may) {
        (Some((inner, outer)), true) => {
            let fingerprint = CompiledPolicies::fingerprint(&(*inner, *outer));
            let secret = sqlx::query(SECRET).persistent(keep).bind(&inner[..]).bind(&outer[..]).bind(fingerprint);
            secret.execute(&mut *tx).await?;
        }
        (None, true) => {
            sqlx::query(FORGET_SECRET).persistent(keep).execute(&mut *tx).await?;
        }
        (Some(_), false) => tracing::warn!(
            "PGLIMIT_SQL=on, but this role may not write pglimit_key_secret: grant it SELECT, INSERT, UPDATE, \
             DELETE on that table, or run `pglimit policies push` as the owner"
        ),
        (None, false) => {}
    }
    Ok(())
}

/// `pglimit policies push`: brings the database's schema up to date (as
/// `pglimit migrate` does) and writes `compiled`, then disconnects.
pub async fn push(
    url: &str,
    reach: Reach,
    unlogged: bool,
    citus: Citus,
    compiled: &CompiledPolicies,
) -> Result<(), sqlx::Error> {
    let session = Session::new(url, Duration::from_secs(30), reach)?;
    session.prepare(unlogged, citus).await?;
    let mut conn = session.open().await?;
    let mut tx = session.begin(&mut conn).await?;
    write(&mut tx, false, compiled).await?;
    tx.commit().await?;
    conn.close().await
}
