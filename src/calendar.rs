//! The Gregorian calendar's one rule both date readers need: how many
//! days a month has. YAML 1.1's timestamps (`compose::print::yaml11`) and
//! the `date`/`date-time` formats (`schema::format`) each refuse a day the
//! month lacks (Feb 30, Feb 29 of a common year), as Go's time parsing
//! does; one rule, so the two cannot drift.

/// The days of `month` (1–12) of `year`; `None` for no such month.
pub(crate) fn days_in_month(year: u32, month: u32) -> Option<u32> {
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => Some(31),
        4 | 6 | 9 | 11 => Some(30),
        2 if leap => Some(29),
        2 => Some(28),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn february_has_29_days_in_leap_years_only_and_month_13_none() {
        assert_eq!(days_in_month(2024, 2), Some(29));
        assert_eq!(days_in_month(2023, 2), Some(28));
        assert_eq!(days_in_month(1900, 2), Some(28));
        assert_eq!(days_in_month(2000, 2), Some(29));
        assert_eq!(days_in_month(2023, 4), Some(30));
        assert_eq!(days_in_month(2023, 12), Some(31));
        assert_eq!(days_in_month(2023, 13), None);
        assert_eq!(days_in_month(2023, 0), None);
    }
}
