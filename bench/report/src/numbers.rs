//! Numbers as the report reads and prints them. Fractions use Rust's own
//! formatting (`{:.2}`); whole counts and rates get thousands separators.

/// A number of one of bench/run's files or of its meta: NaN when the text
/// is not one (blank included), so that a missing figure shows as missing.
pub fn number(text: &str) -> f64 {
    text.trim().parse().unwrap_or(f64::NAN)
}

/// Not a positive number (NaN included).
pub fn not_positive(x: f64) -> bool {
    x.is_nan() || x <= 0.0
}

/// Rounded to a whole number, half away from zero; never "-0" (a CPU share
/// a hair below zero is none).
pub fn whole(x: f64) -> String {
    format!("{}", x.round() + 0.0)
}

/// Rounded to a whole number, with thousands separators: 12,345. Blank when
/// not a number, so that a missing figure leaves its cell empty.
pub fn thousands(x: f64) -> String {
    if !x.is_finite() {
        return String::new();
    }
    let text = whole(x);
    let (sign, digits) = text.strip_prefix('-').map_or(("", text.as_str()), |d| ("-", d));
    let mut out = sign.to_string();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Microseconds as milliseconds, two decimals; blank when not a number.
pub fn ms(us: f64) -> String {
    if us.is_finite() {
        format!("{:.2}", us / 1000.0)
    } else {
        String::new()
    }
}

/// KiB as MiB, one decimal; "unknown" when not a positive number.
pub fn mib(kib: Option<&String>) -> String {
    let kib = kib.map_or(f64::NAN, |k| number(k));
    if kib > 0.0 {
        format!("{:.1} MiB", kib / 1024.0)
    } else {
        "unknown".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits_in_threes_after_rounding() {
        assert_eq!(thousands(0.4), "0");
        assert_eq!(thousands(-0.4), "0");
        assert_eq!(thousands(2.5), "3");
        assert_eq!(thousands(999.6), "1,000");
        assert_eq!(thousands(1234567.0), "1,234,567");
        assert_eq!(thousands(-12345.0), "-12,345");
        assert_eq!(thousands(f64::NAN), "");
    }

    #[test]
    fn a_blank_or_unreadable_number_is_missing() {
        assert!(number("").is_nan());
        assert!(number("12 s").is_nan());
        assert_eq!(number(" 42\n"), 42.0);
    }

    #[test]
    fn milliseconds_and_mebibytes_have_fixed_decimals() {
        assert_eq!(ms(1234.0), "1.23");
        assert_eq!(ms(f64::NAN), "");
        assert_eq!(mib(Some(&"20480".to_string())), "20.0 MiB");
        assert_eq!(mib(Some(&"0".to_string())), "unknown");
        assert_eq!(mib(None), "unknown");
    }
}
