//! A bucket's window as a policy file or an ad hoc check writes it: a
//! duration (`60s`) or a calendar window (`1 calendar month`) in a
//! `timezone`. One rule for both forms, so they refuse the same things.

use std::time::Duration;

use chrono_tz::Tz;

use super::duration::parse_window;
use crate::algorithm::{parse_zone, Algorithm, Calendar, CalendarUnit};

/// What is wrong, and with which field: `window` or `timezone`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowMistake {
    pub field: &'static str,
    pub message: String,
}

/// A window, and its calendar if it is a calendar window (its `Duration`
/// is then the unit's nominal length). `timezone` (default UTC) goes only
/// with a calendar window, and a calendar window only with `fixed_window`.
pub fn parse_window_in(
    window: &str,
    timezone: Option<&str>,
    algorithm: Algorithm,
) -> Result<(Duration, Option<Calendar>), WindowMistake> {
    let mistake = |field, message| WindowMistake { field, message };
    let Some(unit) = CalendarUnit::parse(window) else {
        if timezone.is_some() {
            let message = format!(
                "timezone goes only with a calendar window ({}); {window:?} is not one",
                calendar_spellings()
            );
            return Err(mistake("timezone", message));
        }
        return parse_window(window).map(|w| (w, None)).map_err(|e| mistake("window", with_hint(window, e)));
    };
    if algorithm != Algorithm::FixedWindow {
        let message = format!(
            "{window:?} is a calendar window, which only the fixed_window algorithm takes (not {})",
            algorithm.name()
        );
        return Err(mistake("window", message));
    }
    let zone = timezone.map_or(Ok(Tz::UTC), parse_zone).map_err(|e| mistake("timezone", e))?;
    Ok((unit.nominal(), Some(Calendar { unit, zone })))
}

fn calendar_spellings() -> String {
    crate::algorithm::CALENDAR_SPELLINGS.map(|s| format!("{s:?}")).join(", ")
}

/// A window that looks meant as a calendar one is told the spellings.
fn with_hint(window: &str, error: String) -> String {
    if window.contains("calendar") {
        format!("{error}; a calendar window is written {}", calendar_spellings())
    } else {
        error
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calendar_window_takes_a_zone_and_defaults_to_utc() {
        let (window, calendar) =
            parse_window_in("1 calendar month", None, Algorithm::FixedWindow).expect("valid");
        assert_eq!(window, Duration::from_secs(31 * 86_400));
        assert_eq!(calendar, Some(Calendar { unit: CalendarUnit::Month, zone: Tz::UTC }));
        let berlin = parse_window_in("1 calendar day", Some("Europe/Berlin"), Algorithm::FixedWindow);
        assert_eq!(berlin.expect("valid").1.map(|c| c.zone), Some(Tz::Europe__Berlin));
    }

    #[test]
    fn a_calendar_window_with_another_algorithm_or_an_unknown_zone_names_its_field() {
        let sliding = parse_window_in("1 calendar week", None, Algorithm::SlidingWindow).unwrap_err();
        assert_eq!(sliding.field, "window");
        assert!(sliding.message.contains("sliding_window"), "{}", sliding.message);
        let zone =
            parse_window_in("1 calendar day", Some("Mars/Olympus"), Algorithm::FixedWindow).unwrap_err();
        assert_eq!(zone.field, "timezone");
        let stray = parse_window_in("60s", Some("UTC"), Algorithm::FixedWindow).unwrap_err();
        assert_eq!(stray.field, "timezone");
        let typo = parse_window_in("1 calendar year", None, Algorithm::FixedWindow).unwrap_err();
        assert!(typo.message.contains("\"1 calendar month\""), "{}", typo.message);
    }

    #[test]
    fn an_abbreviation_or_a_fixed_offset_is_refused_as_a_calendar_zone_naming_timezone() {
        for zone in ["CET", "EET", "MET", "WET", "UTC+5", "Etc/GMT-1", "US/Eastern"] {
            let refused = parse_window_in("1 calendar day", Some(zone), Algorithm::FixedWindow).unwrap_err();
            assert_eq!(refused.field, "timezone", "{zone}");
            assert!(refused.message.contains(&format!("timezone {zone:?}")), "{}", refused.message);
        }
    }
}
