//! Hearing of actions taken through any instance (resets, blocks,
//! unblocks), so that the denials this one remembers are forgotten at once.
//!
//! Every action notifies channel [`CHANNEL`] with `<generation> <hex key>,...`
//! in its own transaction; a task here LISTENs on a connection of its own.
//! A released lease notifies `released <hex key>,...` (`sql/leases.sql`):
//! no generation, but its keys' denials are forgotten all the same.
//! Notifications sent while it is not listening are lost, so every
//! (re)connection counts as "everything is stale" and "any slot may have
//! been freed" (waiters recheck), and the heartbeat reads
//! the actions generation every 2 s: one it has not heard of means a
//! notification went missing, which also counts as everything.
//!
//! A change to the API overrides notifies `<generation> overrides`: it makes
//! no key stale, but wakes [`Notifications::overrides_may_have_changed`], as does
//! anything that may have hidden one (a reconnection, a missed generation).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::{broadcast, watch};

use crate::storage::{Freed, Key, Stale};

pub const CHANNEL: &str = "pglimit_actions";

/// What a released lease's notification starts with, in place of a generation.
const RELEASED: &str = "released";
/// Releases heard and not yet taken by the waiters before the oldest is dropped.
const RELEASES_KEPT: usize = 1024;

/// More keys than this in one action are announced as everything (a
/// notification's payload is at most 8000 bytes): `pglimit_announce`
/// (`sql/actions.sql`) writes the payload, this module reads it.
#[cfg(test)]
const MAX_KEYS_NAMED: usize = 100;

/// The payload's second word for a change to the API overrides.
const OVERRIDES: &str = "overrides";

/// How long to wait before listening again after the connection failed.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// What this instance has heard and not yet passed on.
#[derive(Default)]
pub(super) struct Notifications {
    pending: AtomicBool,
    stale: Mutex<Option<Stale>>,
    /// The highest actions generation heard of.
    generation: AtomicU64,
    /// Woken when the API overrides may have changed (holds one wake-up
    /// while nobody waits, so none is lost between two loads).
    overrides: tokio::sync::Notify,
    releases: Releases,
}

/// The slots released leases freed, for waiters to take them.
struct Releases(broadcast::Sender<Freed>);

impl Default for Releases {
    fn default() -> Self {
        Self(broadcast::channel(RELEASES_KEPT).0)
    }
}

impl Releases {
    /// Nobody may be subscribed yet (no waiting limiter): nothing to tell.
    fn send(&self, freed: Freed) {
        let _ = self.0.send(freed);
    }
}

impl Notifications {
    fn note(&self, stale: Stale) {
        let mut slot = self.stale.lock().unwrap_or_else(|e| e.into_inner());
        *slot = Some(match slot.take() {
            Some(before) => before.merge(stale),
            None => stale,
        });
        self.pending.store(true, Ordering::Release);
    }

    /// A notification's payload: `<generation> <hex key>,...` or `<generation> *`.
    fn notified(&self, payload: &str) {
        let (generation, keys) = payload.split_once(' ').unwrap_or((payload, "*"));
        if keys == OVERRIDES {
            self.overrides.notify_one();
        } else {
            self.note_keys(keys);
        }
        if generation == RELEASED {
            // After noting them stale: a waiter woken rechecks past any denial remembered.
            keys.split(',').filter_map(parse_key).for_each(|key| self.releases.send(Freed::Slots(key)));
        }
        if let Ok(generation) = generation.parse::<u64>() {
            self.generation.fetch_max(generation, Ordering::AcqRel);
        }
    }

    fn note_keys(&self, keys: &str) {
        let keys = (keys != "*").then(|| keys.split(',').filter_map(parse_key));
        self.note(keys.map_or(Stale::All, Stale::of));
    }

    /// Something may have gone unheard: every denial remembered is stale,
    /// the overrides may have changed, and so may any slot.
    fn missed(&self) {
        self.note(Stale::All);
        self.overrides.notify_one();
        self.releases.send(Freed::Any);
    }

    /// The slots releases free, as heard from now on.
    pub fn releases(&self) -> broadcast::Receiver<Freed> {
        self.releases.0.subscribe()
    }

    /// Completes at the next sign that the API overrides may have changed.
    pub async fn overrides_may_have_changed(&self) {
        self.overrides.notified().await;
    }

    /// The generation as the heartbeat read it: if it is ahead of every
    /// notification heard, one was missed.
    pub fn read(&self, generation: u64) {
        if generation > self.generation.fetch_max(generation, Ordering::AcqRel) {
            self.missed();
        }
    }

    pub fn take(&self) -> Option<Stale> {
        // Read before writing: asked on every check, the flag is almost
        // always false, and a plain load keeps its cache line shared
        // between the cores instead of bouncing it.
        if !self.pending.load(Ordering::Acquire) || !self.pending.swap(false, Ordering::AcqRel) {
            return None;
        }
        self.stale.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

fn parse_key(hex_key: &str) -> Option<Key> {
    let mut key = [0u8; 32];
    hex::decode_to_slice(hex_key, &mut key).ok().map(|()| key)
}

/// The payload announcing an action on `keys` at `generation`, as
/// `pglimit_announce` writes it.
#[cfg(test)]
fn payload(generation: i64, keys: &[Key]) -> String {
    if keys.len() > MAX_KEYS_NAMED {
        return format!("{generation} *");
    }
    let keys: Vec<String> = keys.iter().map(hex::encode).collect();
    format!("{generation} {}", keys.join(","))
}

/// The payload announcing a change to the API overrides at `generation`.
pub fn overrides_payload(generation: i64) -> String {
    format!("{generation} {OVERRIDES}")
}

/// Listens until `closed` is dropped, reconnecting after failures.
pub(super) fn spawn(options: PgConnectOptions, heard: Arc<Notifications>, mut closed: watch::Receiver<()>) {
    tokio::spawn(async move {
        loop {
            match listen(&options).await {
                Ok((mut listener, plaintext)) => {
                    heard.missed(); // anything sent before this went unheard
                    if hear(&mut listener, plaintext, &heard, &mut closed).await.is_none() {
                        return;
                    }
                }
                Err(e) => tracing::debug!(error = %e, "cannot listen for actions"),
            }
            tokio::select! {
                _ = closed.changed() => return,
                _ = tokio::time::sleep(RETRY_EVERY) => {}
            }
        }
    });
}

/// A listener as `sslmode` asks ([`super::tls::open_preferring`]), and
/// whether it went without TLS.
async fn listen(options: &PgConnectOptions) -> Result<(PgListener, bool), sqlx::Error> {
    super::tls::open_preferring(options, listen_with).await
}

async fn listen_with(options: PgConnectOptions) -> Result<PgListener, sqlx::Error> {
    let pool = PgPoolOptions::new().max_connections(1).connect_lazy_with(options);
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Passes notifications on until the connection fails (`Some`) or the
/// store is gone (`None`). A `plaintext` listener that lost its connection
/// stops too, so that the next one tries TLS again.
async fn hear(
    listener: &mut PgListener,
    plaintext: bool,
    heard: &Notifications,
    closed: &mut watch::Receiver<()>,
) -> Option<()> {
    loop {
        tokio::select! {
            _ = closed.changed() => return None,
            next = listener.try_recv() => match next {
                Ok(Some(notification)) => heard.notified(notification.payload()),
                Ok(None) if plaintext => return Some(()),
                // Lost and already reconnected: what was sent meanwhile is lost.
                Ok(None) => heard.missed(),
                Err(e) => {
                    tracing::debug!(error = %e, "listening for actions failed");
                    return Some(());
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MAX_STALE_KEYS;

    #[test]
    fn a_notification_names_its_keys_and_a_missed_one_makes_everything_stale() {
        let heard = Notifications::default();
        assert_eq!(heard.take(), None);
        heard.notified(&payload(3, &[[1; 32], [2; 32]]));
        assert_eq!(heard.take(), Some(Stale::of([[1; 32], [2; 32]])));
        assert_eq!((heard.take(), heard.generation()), (None, 3));
        heard.read(3);
        assert_eq!(heard.take(), None, "a generation already heard of");
        heard.read(4);
        assert_eq!(heard.take(), Some(Stale::All), "generation 4 was never announced");
    }

    fn keys(range: std::ops::Range<usize>) -> Vec<Key> {
        range.map(crate::storage::stale::test_key).collect()
    }

    #[test]
    fn stale_keys_heard_between_checks_collapse_to_everything_past_the_bound() {
        let heard = Notifications::default();
        let per = MAX_KEYS_NAMED;
        for (i, start) in (0..MAX_STALE_KEYS).step_by(per).enumerate() {
            heard.notified(&payload(i as i64, &keys(start..(start + per).min(MAX_STALE_KEYS))));
        }
        let named = heard.take();
        assert_eq!(named, Some(Stale::of(keys(0..MAX_STALE_KEYS))), "exactly the bound is still named");
        for (i, start) in (0..=MAX_STALE_KEYS).step_by(per).enumerate() {
            heard.notified(&payload(i as i64, &keys(start..start + per)));
        }
        assert_eq!(heard.take(), Some(Stale::All));
    }

    #[test]
    fn the_same_keys_heard_again_and_again_are_held_once() {
        let heard = Notifications::default();
        for generation in 0..10 * MAX_STALE_KEYS as i64 {
            heard.notified(&payload(generation, &[[1; 32], [2; 32]]));
        }
        assert_eq!(heard.take(), Some(Stale::of([[1; 32], [2; 32]])));
    }

    #[tokio::test]
    async fn an_overrides_change_makes_no_key_stale_but_wakes_the_overrides_reload() {
        let heard = Notifications::default();
        heard.notified(&overrides_payload(5));
        assert_eq!((heard.take(), heard.generation()), (None, 5));
        let woken =
            tokio::time::timeout(std::time::Duration::from_secs(5), heard.overrides_may_have_changed());
        assert!(woken.await.is_ok(), "the wake-up is held until someone waits");
        heard.read(6);
        assert_eq!(heard.take(), Some(Stale::All), "a missed generation");
        let woken =
            tokio::time::timeout(std::time::Duration::from_secs(5), heard.overrides_may_have_changed());
        assert!(woken.await.is_ok(), "a missed generation may have been an overrides change");
    }

    #[test]
    fn a_release_frees_its_keys_and_anything_missed_may_have_freed_any_slot() {
        let heard = Notifications::default();
        let mut releases = heard.releases();
        heard.notified(&format!("{RELEASED} {}", hex::encode([4; 32])));
        assert_eq!(releases.try_recv().ok(), Some(Freed::Slots([4; 32])));
        heard.missed();
        assert_eq!(releases.try_recv().ok(), Some(Freed::Any), "a reconnection may have hidden a release");
        heard.read(heard.generation() + 1);
        assert_eq!(releases.try_recv().ok(), Some(Freed::Any), "so may a missed generation");
    }

    #[test]
    fn too_many_keys_are_announced_as_everything() {
        let heard = Notifications::default();
        heard.notified(&payload(1, &vec![[7; 32]; MAX_KEYS_NAMED + 1]));
        assert_eq!(heard.take(), Some(Stale::All));
    }
}
