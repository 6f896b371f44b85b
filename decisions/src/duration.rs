//! Durations as users write them on the command line, in the policy file,
//! in onepoold's configuration ([`parse_millis`]) and in the simulator's
//! inputs ([`parse_seconds`]): onepool's one duration parser and writer.

use std::time::Duration;

/// The forms [`parse`] accepts, quoted in every error so the user can fix
/// the value without reading docs.
pub const ACCEPTED_FORMS: &str =
    "seconds (90), a number with a unit (90s, 5m, 2h, 1d), units combined (1h30m), or Slurm's [[DD-]HH:]MM:SS (01:30:00)";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {value:?}: {reason}; accepted forms: {ACCEPTED_FORMS}")]
pub struct DurationError {
    pub value: String,
    pub reason: &'static str,
}

/// The longest duration accepted anywhere (one year): guards against
/// overflow in Slurm's minute- and second-based fields.
pub const MAX: Duration = Duration::from_secs(366 * 24 * 3600);

pub fn parse(s: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError { value: s.to_string(), reason };
    let t = s.trim();
    if t.is_empty() {
        return Err(err("it is empty"));
    }
    let secs = if t.contains(':') { parse_clock(t).map_err(err)? } else { parse_units(t).map_err(err)? };
    let d = Duration::from_secs(secs);
    if d > MAX {
        return Err(err("it is longer than one year"));
    }
    Ok(d)
}

fn parse_units(t: &str) -> Result<u64, &'static str> {
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse().map_err(|_| "the number is too large");
    }
    let mut total: u64 = 0;
    let mut num = String::new();
    let mut last_rank = usize::MAX;
    for c in t.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let (rank, mult) = match c {
            'd' => (3, 86_400),
            'h' => (2, 3_600),
            'm' => (1, 60),
            's' => (0, 1),
            _ => return Err("it contains a character that is neither a digit nor one of the units d, h, m, s"),
        };
        if num.is_empty() {
            return Err("a unit has no number before it");
        }
        if rank >= last_rank {
            return Err("units must go from largest to smallest, each at most once");
        }
        last_rank = rank;
        let n: u64 = num.parse().map_err(|_| "the number is too large")?;
        total = n.checked_mul(mult).and_then(|v| total.checked_add(v)).ok_or("the number is too large")?;
        num.clear();
    }
    if !num.is_empty() {
        return Err("the last number has no unit");
    }
    Ok(total)
}

fn parse_clock(t: &str) -> Result<u64, &'static str> {
    const BAD: &str = "not a valid [[DD-]HH:]MM:SS time";
    let (days, clock) = match t.split_once('-') {
        Some((d, rest)) if !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()) => {
            (d.parse::<u64>().map_err(|_| "the number of days is too large")?, rest)
        }
        Some(_) => return Err(BAD),
        None => (0, t),
    };
    let parts: Vec<&str> = clock.split(':').collect();
    let nums: Vec<u64> = parts
        .iter()
        .map(|p| {
            (!p.is_empty() && p.len() <= 2 && p.bytes().all(|b| b.is_ascii_digit())).then(|| p.parse().ok()).flatten()
        })
        .collect::<Option<_>>()
        .ok_or(BAD)?;
    let (h, m, s) = match nums.as_slice() {
        [m, s] => (0, *m, *s),
        [h, m, s] => (*h, *m, *s),
        _ => return Err(BAD),
    };
    if m >= 60 || s >= 60 || (days > 0 && h >= 24) {
        return Err(BAD);
    }
    // Checked: a 20-digit day count must be refused, not wrap or panic.
    days.checked_mul(86_400)
        .and_then(|d| d.checked_add(h * 3_600 + m * 60 + s))
        .ok_or("the number of days is too large")
}

/// [`parse`]'s forms plus whole milliseconds (`250ms`), for the timeouts
/// under a second that onepoold's configuration and control API take.
/// Milliseconds are not bounded by [`MAX`].
pub fn parse_millis(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if let Some(ms) = t.strip_suffix("ms") {
        return ms
            .trim()
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("invalid duration {s:?}: expected whole milliseconds before \"ms\" (250ms)"));
    }
    parse(t).map_err(|e| format!("{e}, or milliseconds (250ms)"))
}

/// Seconds, as the simulator counts time: a plain number of seconds,
/// fractions allowed (`1.5`), or any form [`parse`] accepts. `None` when
/// it is neither, or negative.
pub fn parse_seconds(s: &str) -> Option<f64> {
    let s = s.trim();
    if let Ok(v) = s.parse::<f64>() {
        return (v.is_finite() && v >= 0.0).then_some(v);
    }
    parse(s).ok().map(|d| d.as_secs_f64())
}

/// Renders a duration the way [`parse_millis`] reads it back: as
/// [`format`] does when it is whole seconds, else in whole milliseconds
/// (`250ms`; anything finer is dropped).
pub fn format_millis(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format(d)
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Renders a duration the way [`parse`] reads it back (e.g. `1h30m`, `45s`).
pub fn format(d: Duration) -> String {
    let mut s = d.as_secs();
    if s == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, len) in [('d', 86_400), ('h', 3_600), ('m', 60), ('s', 1)] {
        if s >= len {
            out.push_str(&format!("{}{unit}", s / len));
            s %= len;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepted_forms() {
        for (s, secs) in [
            ("90", 90),
            ("90s", 90),
            ("5m", 300),
            ("2h", 7200),
            ("1d", 86400),
            ("1h30m", 5400),
            ("1d2h3m4s", 93784),
            ("01:30:00", 5400),
            ("05:00", 300),
            ("1-02:00:00", 93600),
            (" 30s ", 30),
        ] {
            assert_eq!(parse(s).unwrap(), Duration::from_secs(secs), "{s}");
        }
    }

    #[test]
    fn refusals_say_why_and_list_the_forms() {
        for (s, why) in [
            ("", "empty"),
            ("5x", "neither a digit"),
            ("m", "no number"),
            ("5m1h", "largest to smallest"),
            ("5m5m", "largest to smallest"),
            ("1h30", "no unit"),
            ("1:99", "HH:]MM:SS"),
            ("400d", "longer than one year"),
            ("99999999999999999999", "too large"),
        ] {
            let e = parse(s).unwrap_err().to_string();
            assert!(e.contains(why), "{s:?}: {e}");
            assert!(e.contains("accepted forms"), "{e}");
        }
    }

    #[test]
    fn durations_accept_milliseconds() {
        assert_eq!(parse_millis("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_millis("2s").unwrap(), Duration::from_secs(2));
        assert!(parse_millis("xms").is_err());
    }

    #[test]
    fn millisecond_errors_name_both_kinds_of_forms() {
        assert_eq!(
            parse_millis(" x ms").unwrap_err(),
            "invalid duration \" x ms\": expected whole milliseconds before \"ms\" (250ms)"
        );
        let e = parse_millis("5x").unwrap_err();
        assert!(e.starts_with("invalid duration \"5x\": it contains a character"), "{e}");
        assert!(e.ends_with(&format!("accepted forms: {ACCEPTED_FORMS}, or milliseconds (250ms)")), "{e}");
        assert_eq!(parse_millis(" 90 ").unwrap(), Duration::from_secs(90));
    }

    #[test]
    fn seconds_take_fractions_and_every_duration_form() {
        assert_eq!(parse_seconds("90"), Some(90.0));
        assert_eq!(parse_seconds("2h"), Some(7200.0));
        assert_eq!(parse_seconds("-1"), None);
        assert_eq!(parse_seconds(" 1.5 "), Some(1.5));
        assert_eq!(parse_seconds("01:30"), Some(90.0));
        assert_eq!(parse_seconds("inf"), None);
        assert_eq!(parse_seconds("soon"), None);
    }

    #[test]
    fn millisecond_durations_are_written_as_they_are_read() {
        for (d, text) in [
            (Duration::from_millis(250), "250ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(format_millis(d), text);
            assert_eq!(parse_millis(text).unwrap(), d);
        }
    }

    proptest! {
        #[test]
        fn format_millis_round_trips(ms in 0u64..MAX.as_millis() as u64) {
            let d = Duration::from_millis(ms);
            prop_assert_eq!(parse_millis(&format_millis(d)).unwrap(), d);
        }
    }

    proptest! {
        #[test]
        fn format_round_trips(secs in 0u64..MAX.as_secs()) {
            let d = Duration::from_secs(secs);
            prop_assert_eq!(parse(&format(d)).unwrap(), d);
        }

        #[test]
        fn never_panics(s in ".{0,24}") {
            let _ = parse(&s);
        }

        /// Digit-heavy input in every form, where arithmetic could overflow.
        #[test]
        fn huge_numbers_are_refused_not_panics(
            s in "[0-9]{1,25}(-[0-9]{1,25})?(:[0-9]{1,3}){1,2}|([0-9]{1,25}[dhms]){1,4}|[0-9]{1,25}"
        ) {
            if let Ok(d) = parse(&s) {
                prop_assert!(d <= MAX);
            }
        }
    }

    #[test]
    fn overflowing_values_are_refused_with_the_reason() {
        for v in
            ["99999999999999999-00:00:00", "18446744073709551615-23:59:59", "213503982334601d", "99999999999999999999s"]
        {
            let e = parse(v).unwrap_err();
            assert_eq!(e.value, v);
            assert!(e.reason.contains("too large") || e.reason.contains("longer than one year"), "{v}: {e}");
            assert!(e.to_string().contains("accepted forms"), "{e}");
        }
    }
}
