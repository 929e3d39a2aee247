//! Calendar windows of the fixed-window algorithm: a window that starts at
//! local midnight, on Monday (ISO week) or on the 1st, in an IANA time
//! zone. Written once more in SQL (`pglimit_calendar_end` in
//! `storage/postgres/sql/algorithms.sql`); the replay checks that both
//! name the same instants, daylight-saving days included.

use chrono::{DateTime, Datelike, Days, Months, NaiveDate, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;

/// The three calendar windows, as a policy file and a request write them.
pub const SPELLINGS: [&str; 3] = ["1 calendar day", "1 calendar week", "1 calendar month"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    Day,
    Week,
    Month,
}

/// A calendar window: its unit and the zone whose midnights it starts at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Calendar {
    pub unit: CalendarUnit,
    pub zone: Tz,
}

const DAY_MS: u64 = 86_400_000;

impl CalendarUnit {
    /// The unit a window spelled as in [`SPELLINGS`] names, if it is one.
    pub fn parse(window: &str) -> Option<Self> {
        let units = [Self::Day, Self::Week, Self::Month];
        SPELLINGS.iter().position(|s| *s == window).map(|i| units[i])
    }

    pub fn spelling(self) -> &'static str {
        SPELLINGS[self as usize]
    }

    /// The length a window of this unit is at most: what travels to SQL as
    /// the window (which tells the unit there), and what the RateLimit
    /// headers give as the policy's window.
    pub fn nominal(self) -> std::time::Duration {
        let days = match self {
            Self::Day => 1,
            Self::Week => 7,
            Self::Month => 31,
        };
        std::time::Duration::from_millis(days * DAY_MS)
    }
}

/// IANA's geographic areas, the first part of every region name
/// (`Europe/Berlin`). Names outside them are abbreviations (`CET`),
/// offsets (`Etc/GMT+5`, `EST5EDT`) or old aliases (`US/Eastern`), which
/// Postgres may read as a fixed offset where the model applies summer time.
const AREAS: [&str; 10] = [
    "Africa",
    "America",
    "Antarctica",
    "Arctic",
    "Asia",
    "Atlantic",
    "Australia",
    "Europe",
    "Indian",
    "Pacific",
];

/// Parses an IANA region name (`Europe/Berlin`) or `UTC`; the error is a
/// sentence for the caller, naming `timezone`.
pub fn parse_zone(name: &str) -> Result<Tz, String> {
    let region = name == "UTC"
        || name.split_once('/').is_some_and(|(area, place)| AREAS.contains(&area) && !place.is_empty());
    match name.parse::<Tz>() {
        Ok(zone) if region => Ok(zone),
        _ => Err(format!(
            "timezone {name:?} is not an IANA region name this service knows: use Area/Location, such \
             as \"Europe/Berlin\", or \"UTC\" (abbreviations such as CET and fixed offsets such as UTC+5 \
             are refused: PostgreSQL reads some of them without summer time)"
        )),
    }
}

impl Calendar {
    /// The start of the first window after the one holding `now_us`, in
    /// µs since the epoch.
    pub fn end_after(self, now_us: i64) -> i64 {
        let now = DateTime::<Utc>::from_timestamp_micros(now_us).unwrap_or_default();
        let today = now.with_timezone(&self.zone).date_naive();
        let next = match self.unit {
            CalendarUnit::Day => today.checked_add_days(Days::new(1)),
            CalendarUnit::Week => {
                let monday = today - Days::new(u64::from(today.weekday().num_days_from_monday()));
                monday.checked_add_days(Days::new(7))
            }
            CalendarUnit::Month => {
                today.with_day(1).and_then(|first| first.checked_add_months(Months::new(1)))
            }
        };
        next.map_or(i64::MAX, |date| self.midnight_us(date))
    }

    /// Local midnight of `date` as Postgres reads a local time: one that
    /// a clock change skips takes the offset from before the change, one
    /// it repeats the offset from after it (the later instant).
    fn midnight_us(self, date: NaiveDate) -> i64 {
        let local: NaiveDateTime = date.and_hms_opt(0, 0, 0).unwrap_or_default();
        let instant = match self.zone.from_local_datetime(&local) {
            chrono::LocalResult::Single(t) => t.with_timezone(&Utc),
            chrono::LocalResult::Ambiguous(_, later) => later.with_timezone(&Utc),
            chrono::LocalResult::None => {
                // A day earlier is before the change (clock changes are
                // months apart); its offset is the one from before.
                let before = self.zone.offset_from_utc_datetime(&(local - Days::new(1)));
                let offset = chrono::Offset::fix(&before);
                (local - offset).and_utc()
            }
        };
        instant.timestamp_micros()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(unit: CalendarUnit, zone: &str, now: &str) -> String {
        let calendar = Calendar { unit, zone: parse_zone(zone).expect("zone") };
        let now: DateTime<Utc> = now.parse().expect("time");
        let end = DateTime::<Utc>::from_timestamp_micros(calendar.end_after(now.timestamp_micros()));
        end.expect("end").to_rfc3339()
    }

    #[test]
    fn a_calendar_day_ends_at_the_next_local_midnight_whatever_its_length() {
        use CalendarUnit::Day;
        // 2027-03-28 in Berlin is 23 hours long, 2027-10-31 25 hours.
        assert_eq!(end(Day, "Europe/Berlin", "2027-03-27T23:30:00Z"), "2027-03-28T22:00:00+00:00");
        assert_eq!(end(Day, "Europe/Berlin", "2027-10-30T22:30:00Z"), "2027-10-31T23:00:00+00:00");
        assert_eq!(end(Day, "America/New_York", "2027-03-14T12:00:00Z"), "2027-03-15T04:00:00+00:00");
        assert_eq!(end(Day, "UTC", "2027-01-01T00:00:00Z"), "2027-01-02T00:00:00+00:00");
    }

    #[test]
    fn a_calendar_week_ends_on_monday_and_a_month_on_the_first() {
        let berlin = "Europe/Berlin";
        // 2027-03-28 is a Sunday; Monday 29 starts in summer time.
        assert_eq!(end(CalendarUnit::Week, berlin, "2027-03-24T12:00:00Z"), "2027-03-28T22:00:00+00:00");
        assert_eq!(end(CalendarUnit::Month, berlin, "2027-03-31T21:59:59Z"), "2027-03-31T22:00:00+00:00");
        assert_eq!(end(CalendarUnit::Month, berlin, "2027-03-31T22:00:00Z"), "2027-04-30T22:00:00+00:00");
        assert_eq!(end(CalendarUnit::Month, berlin, "2027-12-31T23:00:00Z"), "2028-01-31T23:00:00+00:00");
    }

    #[test]
    fn a_midnight_a_clock_change_skips_is_read_with_the_offset_before_it() {
        // Havana springs forward at midnight: 2027-03-14 00:00 is not a
        // local time there; Postgres reads it as 00:00-05.
        assert_eq!(
            end(CalendarUnit::Day, "America/Havana", "2027-03-13T12:00:00Z"),
            "2027-03-14T05:00:00+00:00"
        );
    }

    #[test]
    fn only_the_three_spellings_are_calendar_windows() {
        assert_eq!(CalendarUnit::parse("1 calendar month"), Some(CalendarUnit::Month));
        assert_eq!(CalendarUnit::Week.spelling(), "1 calendar week");
        assert_eq!(CalendarUnit::parse("1 month"), None);
        assert!(parse_zone("Europe/Nowhere").is_err());
    }

    #[test]
    fn only_region_names_and_utc_are_zones_not_abbreviations_offsets_or_paths() {
        for name in ["UTC", "Europe/Berlin", "America/Argentina/Buenos_Aires", "Australia/Lord_Howe"] {
            assert_eq!(parse_zone(name).map(|z| z.name()), Ok(name));
        }
        // chrono-tz knows each of these; Postgres reads CET, EET, MET and
        // WET as fixed offsets, without the summer time chrono-tz applies.
        let refused =
            ["CET", "EET", "MET", "WET", "EST5EDT", "EST", "GMT", "Etc/GMT+5", "Etc/UTC", "US/Eastern"];
        let tricks =
            ["UTC+5", "+05:00", "../../etc/passwd", "Europe/../UTC", "UTC\0", "posixrules", "Europe/", ""];
        for name in refused.into_iter().chain(tricks) {
            let error = parse_zone(name).expect_err(name);
            assert!(error.starts_with("timezone ") && error.contains("\"Europe/Berlin\""), "{name}: {error}");
        }
    }
}
