//! Durations written as Go writes them (`30s`, `1m30s`, `500ms`, `1.5h`):
//! Crossplane's flags and Compositions use that form, so xfn's CLI and its
//! composition core parse it one way.
use std::time::Duration;

/// Parses a Go duration: `30s`, `1m`, `1m30s`, `1.5h`, `500ms`.
pub(crate) fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration; use e.g. 30s, 1m, 1m30s, 500ms");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    if rest == "0" {
        return Ok(Duration::ZERO); // as Go's time.ParseDuration
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..number_end].parse().map_err(|_| bad())?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * seconds;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse_go_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_go_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "5", "s", "1x", "-1s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }
}
