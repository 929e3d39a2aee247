//! Window lengths as people write them: `500ms`, `60s`, `15m`, `1h`, `1d`.

use std::time::Duration;

/// Shortest window accepted: shorter ones reset faster than a round trip.
pub const MIN_WINDOW: Duration = Duration::from_millis(100);
/// Longest window accepted: a year.
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// Parses `<digits><unit>` with unit one of ms, s, m, h, d, within
/// [`MIN_WINDOW`]..=[`MAX_WINDOW`]. The error says what was wrong.
pub fn parse_window(text: &str) -> Result<Duration, String> {
    parse_duration(text, "a window")
}

/// [`parse_window`] for a bucket's `block_for`: the same syntax and range,
/// with errors that say "a block" so they read right beside that field.
pub fn parse_block_for(text: &str) -> Result<Duration, String> {
    parse_duration(text, "a block")
}

/// The longest `max_wait` however long requests may take: a caller that
/// would wait longer wants a queue, not a rate limit.
pub const MAX_WAIT_CEILING: Duration = Duration::from_secs(60);

/// A check's `max_wait`: the same syntax, from 0 to `most`.
pub fn parse_max_wait(text: &str, most: Duration) -> Result<Duration, String> {
    let wait = parse_amount(text)?;
    if wait > most {
        return Err(format!("{text:?} is out of range: max_wait must be at most {}", format_window(most)));
    }
    Ok(wait)
}

/// A span in the same syntax, from `least` to `most`, both written as a
/// duration in the error (a setting's, as `PGLIMIT_AUDIT_RETENTION`).
pub fn parse_span(text: &str, least: Duration, most: Duration) -> Result<Duration, String> {
    let span = parse_amount(text.trim())?;
    if !(least..=most).contains(&span) {
        let (least, most) = (format_window(least), format_window(most));
        return Err(format!("{text:?} is out of range: expected from {least} to {most}"));
    }
    Ok(span)
}

fn parse_duration(text: &str, what: &str) -> Result<Duration, String> {
    let window = parse_amount(text)?;
    if !(MIN_WINDOW..=MAX_WINDOW).contains(&window) {
        return Err(format!("{text:?} is out of range: {what} must be between 100ms and 366d"));
    }
    Ok(window)
}

fn parse_amount(text: &str) -> Result<Duration, String> {
    let digits_end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "{text:?} is not a duration: write a whole number and a unit (ms, s, m, h, d), e.g. \"60s\""
            ))
        }
    };
    let number: u64 = number.parse().map_err(|_| {
        format!("{text:?} is not a duration: it needs a whole number before the unit, e.g. \"60s\"")
    })?;
    Ok(Duration::from_millis(number.saturating_mul(unit_ms)))
}

/// The shortest way to write `window` in the same syntax.
pub fn format_window(window: Duration) -> String {
    let ms = window.as_millis();
    [(86_400_000, "d"), (3_600_000, "h"), (60_000, "m"), (1_000, "s")]
        .iter()
        .find(|(unit, _)| ms.is_multiple_of(*unit))
        .map(|(unit, name)| format!("{}{name}", ms / unit))
        .unwrap_or_else(|| format!("{ms}ms"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_parses() {
        assert_eq!(parse_window("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_window("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_window("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_window("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_window("1d"), Ok(Duration::from_secs(86_400)));
    }

    #[test]
    fn malformed_or_out_of_range_windows_are_refused() {
        for bad in ["", "1", "s", "1.5s", "-1s", "1 s", "1w", "99ms", "367d", "99999999999999999999d"] {
            assert!(parse_window(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn windows_format_in_their_largest_whole_unit() {
        assert_eq!(format_window(Duration::from_secs(900)), "15m");
        assert_eq!(format_window(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_window(Duration::from_secs(86_400)), "1d");
    }
}
