//! Calendar windows replayed through one way of deciding in Postgres and
//! through the model (`tests/common/replay.rs` does the comparing), on
//! traces that start just before a local midnight a clock change or a
//! month end makes interesting, and jump ahead by up to a day now and then.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use pglimit::algorithm::{parse_zone, Algorithm, Calendar, CalendarUnit, State};
use pglimit::storage::BucketSpec;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;

use super::replay::{check_step, Path};

/// Where the traces start: a zone and a local midnight in it, as UTC.
const ANCHORS: [(&str, &str); 9] = [
    // The 23-hour day (spring forward) and the Monday after it.
    ("Europe/Berlin", "2027-03-27T23:00:00Z"),
    ("Europe/Berlin", "2027-03-28T22:00:00Z"),
    // The month's end (1 April), and the 25-hour 31 October, then 1 November.
    ("Europe/Berlin", "2027-03-31T22:00:00Z"),
    ("Europe/Berlin", "2027-10-30T22:00:00Z"),
    ("Europe/Berlin", "2027-10-31T23:00:00Z"),
    ("America/New_York", "2027-03-14T05:00:00Z"),
    ("America/New_York", "2027-11-07T04:00:00Z"),
    // A midnight that does not exist (Havana springs forward at 00:00),
    // and one that happens twice (it falls back from 01:00 to 00:00).
    ("America/Havana", "2027-03-14T05:00:00Z"),
    ("America/Havana", "2027-11-07T05:00:00Z"),
];

/// What the checks of a trace hold besides a calendar window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CalendarShape {
    /// One calendar window.
    Alone,
    /// A calendar window, a plain fixed window and a token bucket in one check.
    Mixed,
}

/// Replays 12 rounds of 50 checks through `path`, seeded by `seed`.
pub async fn replay_calendar(path: Path<'_>, rows: &PgPool, shape: CalendarShape, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let units = [CalendarUnit::Day, CalendarUnit::Week, CalendarUnit::Month];
    for round in 0..12 {
        let (zone, anchor) = ANCHORS[(round + seed as usize) % ANCHORS.len()];
        let calendar = Calendar { unit: units[round % 3], zone: parse_zone(zone).expect("zone") };
        let specs = buckets(&mut rng, shape, calendar);
        let mut model: Vec<Option<State>> = vec![None; specs.len()];
        let mut now: DateTime<Utc> = anchor.parse().expect("time");
        now -= TimeDelta::milliseconds(rng.gen_range(0..20_000));
        for step in 0..50 {
            // Mostly seconds apart, across the anchor; now and then up to a
            // day and two hours ahead, across the next boundary or two.
            let step_ms =
                if rng.gen_ratio(1, 8) { rng.gen_range(0..26 * 3_600_000) } else { rng.gen_range(0..2_000) };
            now += TimeDelta::milliseconds(step_ms);
            let most = specs.iter().map(|s| s.limit).min().unwrap_or(1);
            let cost = rng.gen_range(0..3).min(most);
            let at = format!(
                "{shape:?} seed {seed} round {round} ({zone}, {:?}) step {step} at {now}",
                calendar.unit
            );
            check_step(path, rows, &specs, &mut model, cost, now, &at).await;
        }
    }
}

/// The buckets of a round's trace: keys `[r, r, i, random...]`, the same
/// route `r` for every bucket (one worker, in Citus mode).
fn buckets(rng: &mut StdRng, shape: CalendarShape, calendar: Calendar) -> Vec<BucketSpec> {
    let route: u8 = rng.gen();
    let nominal = calendar.unit.nominal();
    let mut specs = vec![spec(rng, [route, 0], Algorithm::FixedWindow, nominal, Some(calendar))];
    if shape == CalendarShape::Mixed {
        let window = Duration::from_millis(rng.gen_range(2..30) * 100);
        specs.push(spec(rng, [route, 1], Algorithm::FixedWindow, window, None));
        specs.push(spec(rng, [route, 2], Algorithm::TokenBucket, window, None));
    }
    specs
}

fn spec(
    rng: &mut StdRng,
    [route, i]: [u8; 2],
    algorithm: Algorithm,
    window: Duration,
    calendar: Option<Calendar>,
) -> BucketSpec {
    let mut key = [route; 32];
    key[2] = i;
    rng.fill(&mut key[3..]);
    BucketSpec {
        name: Arc::from(format!("b{i}")),
        key,
        limit: rng.gen_range(2..7),
        window,
        algorithm,
        lockout: None,
        calendar,
    }
}
