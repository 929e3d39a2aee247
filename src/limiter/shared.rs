//! What every limiter service reads: the store, the policies in force (and
//! their metrics), the API overrides in force, and the key secret. Each
//! service holds an `Arc` of one [`Shared`], so that a reload or a new API
//! override is seen by all of them from the next request on.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::denials::Tally;
use super::key::KeySecret;
use super::outcomes::Shape;
use super::overrides::in_force::ApiOverrides;
use crate::policy::Policies;
use crate::storage::Store;
use crate::telemetry::{Minutes, PolicyCounters};

/// The state every service of the limiter holds an `Arc` of; only the
/// policies and the API overrides change, each swapped whole.
pub struct Shared<S> {
    pub(super) store: S,
    /// Swapped whole on reload: a check reads it once, so checks in flight
    /// finish on the policies they started with.
    pub(super) in_force: ArcSwap<PoliciesInForce>,
    /// The counters of ad hoc keys.
    pub(super) adhoc: Arc<PolicyCounters>,
    pub(super) secret: KeySecret,
    /// `PGLIMIT_SHADOW`: every policy, and ad hoc keys, in shadow mode.
    pub(super) shadow_all: bool,
    /// Overrides set through the API, swapped whole on every change.
    pub(super) api_overrides: ArcSwap<ApiOverrides>,
    /// This instance's checks and denials in each recent minute.
    pub(super) minutes: Arc<Minutes>,
    /// Denials counted for the top list (off unless [`Shared::counting_denials`]).
    pub(super) tally: Arc<Tally>,
    /// `PGLIMIT_SQL`: the key secret is written with the policies.
    sql_secret: bool,
}

/// The policies in force, and their metrics, registered with them.
pub(super) struct PoliciesInForce {
    pub policies: Arc<Policies>,
    pub counters: HashMap<String, Arc<PolicyCounters>>,
}

impl PoliciesInForce {
    /// Registers each policy's metrics for the outcomes it can have.
    fn new(policies: Policies, shadow_all: bool) -> Self {
        let counters = policies
            .iter()
            .map(|p| {
                let (buckets, outcomes) =
                    (p.buckets.iter().map(|b| &b.name), Shape::of(p, shadow_all).outcomes());
                (p.name.to_string(), Arc::new(PolicyCounters::new(Some(&p.name), buckets, &outcomes)))
            })
            .collect();
        Self { policies: Arc::new(policies), counters }
    }

    /// The counters of the policy `name`, or, for ad hoc keys, `adhoc`.
    pub fn counters(&self, name: &str, adhoc: &Arc<PolicyCounters>) -> Arc<PolicyCounters> {
        self.counters.get(name).cloned().unwrap_or_else(|| Arc::clone(adhoc))
    }
}

impl<S: Store> Shared<S> {
    /// `shadow_all` (`PGLIMIT_SHADOW`) puts every policy, and ad hoc keys,
    /// in shadow mode. No API override is in force until
    /// [`super::Overrides::watch`] loads them.
    pub fn new(store: S, policies: Policies, secret: KeySecret, shadow_all: bool) -> Self {
        warn_unknown_zones(&policies, |zone| store.knows_zone(zone));
        let outcomes = Shape::ad_hoc(shadow_all).outcomes();
        let adhoc = Arc::new(PolicyCounters::new(None, [&Arc::from("default")], &outcomes));
        let in_force = ArcSwap::from_pointee(PoliciesInForce::new(policies, shadow_all));
        let api_overrides = ArcSwap::default();
        let minutes = Arc::default();
        let tally = Arc::new(Tally::off());
        let sql_secret = false;
        Self { store, in_force, adhoc, secret, shadow_all, api_overrides, minutes, tally, sql_secret }
    }

    /// Counts every denial a caller sees into `tally`, for the top list.
    pub fn counting_denials(self, tally: Arc<Tally>) -> Self {
        Self { tally, ..self }
    }

    /// Writes the key secret with the policies ([`Shared::publish`]), for
    /// the SQL interface (`PGLIMIT_SQL=on`).
    pub fn publishing_secret(self, sql_secret: bool) -> Self {
        Self { sql_secret, ..self }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// The policies in force.
    pub fn policies(&self) -> Arc<Policies> {
        Arc::clone(&self.in_force.load().policies)
    }

    /// Whether `policy`'s denials are only reported, never enforced.
    pub fn is_shadow(&self, policy: &crate::policy::Policy) -> bool {
        self.shadow_all || policy.mode == crate::policy::Mode::Shadow
    }

    /// This instance's checks and denials in each recent minute.
    pub fn minutes(&self) -> &Arc<Minutes> {
        &self.minutes
    }

    /// Puts `policies` in force for every check that starts from now on.
    pub fn replace_policies(&self, policies: Policies) {
        warn_unknown_zones(&policies, |zone| self.store.knows_zone(zone));
        self.in_force.store(Arc::new(PoliciesInForce::new(policies, self.shadow_all)));
    }
}

impl<S: Store + crate::storage::PolicyStore> Shared<S> {
    /// Writes the policies in force, compiled, for the SQL functions
    /// (docs/sql.md); a failure is logged, and the SQL functions keep the
    /// policies written last.
    pub async fn publish(&self) {
        let (policies, secret) = (self.policies(), &self.secret);
        let compiled = super::compiled::compile(&policies, secret, self.shadow_all, self.sql_secret);
        match self.store.publish(&compiled).await {
            Ok(()) => tracing::debug!(policies = compiled.source, "policies written for the SQL functions"),
            Err(error) => tracing::warn!(
                %error,
                "the policies could not be written for the SQL functions (pglimit.check); they keep the last written"
            ),
        }
    }
}

/// Warns of each calendar zone in `policies` the store cannot decide: their
/// checks are refused until the server knows it.
fn warn_unknown_zones(policies: &Policies, knows: impl Fn(&str) -> bool) {
    for policy in policies.iter() {
        let zones = policy.buckets.iter().filter_map(|b| Some((&b.name, b.calendar?.zone.name())));
        for (bucket, zone) in zones.filter(|(_, zone)| !knows(zone)) {
            tracing::warn!(policy = %policy.name, %bucket, zone, "the PostgreSQL server does not know this \
                bucket's timezone (its pg_timezone_names lacks it): its checks are refused with a 400 until \
                the server's tzdata is updated");
        }
    }
}
