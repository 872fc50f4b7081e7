//! The timestamp and duration getters (`getHours()`, `getDate('+01:00')`,
//! …) as CEL defines them: a timestamp's fields in UTC, or in the time zone
//! given (`UTC` or an offset `[+-]HH:MM`). The `cel` crate 0.13 ignores the
//! time zone and reads the fields in the timestamp's own offset, so
//! `getHours()` of `19:03+01:00` was 19, not 18. A time zone name xfn has no
//! database for (`America/New_York`) is an error, never a guess.
use cel::extractors::{Arguments, This};
use cel::{Context, ExecutionError, FunctionContext, Value};
use chrono::{DateTime, Datelike, FixedOffset, Timelike};

/// Each getter: its name, a timestamp's field, a duration's total (none
/// for the fields a duration does not have).
macro_rules! getters {
    ($(($name:literal, $fn:ident, $at:expr, $total:expr)),* $(,)?) => {
        $(
            fn $fn(
                ftx: &FunctionContext,
                this: This<Value>,
                args: Arguments,
            ) -> Result<Value, ExecutionError> {
                either(ftx, this, args, $at, $total)
            }
        )*

        /// Registers the getters in `context`, over the crate's.
        pub(super) fn register(context: &mut Context) {
            $(context.add_function($name, $fn);)*
        }
    };
}

type Total = Option<fn(&chrono::Duration) -> i64>;

getters!(
    ("getFullYear", full_year, |d| i64::from(d.year()), None),
    ("getMonth", month, |d| i64::from(d.month0()), None),
    (
        "getDayOfYear",
        day_of_year,
        |d| i64::from(d.ordinal0()),
        None
    ),
    ("getDayOfMonth", day_of_month, |d| i64::from(d.day0()), None),
    ("getDate", date, |d| i64::from(d.day()), None),
    (
        "getDayOfWeek",
        day_of_week,
        |d| i64::from(d.weekday().num_days_from_sunday()),
        None
    ),
    (
        "getHours",
        hours,
        |d| i64::from(d.hour()),
        Some(|d| d.num_hours())
    ),
    (
        "getMinutes",
        minutes,
        |d| i64::from(d.minute()),
        Some(|d| d.num_minutes())
    ),
    (
        "getSeconds",
        seconds,
        |d| i64::from(d.second()),
        Some(|d| d.num_seconds())
    ),
    (
        "getMilliseconds",
        milliseconds,
        |d| i64::from(d.timestamp_subsec_millis()),
        Some(|d| d.num_milliseconds())
    ),
);

/// A timestamp's field (`at`) or a duration's total (`total`).
fn either(
    ftx: &FunctionContext,
    This(this): This<Value>,
    Arguments(args): Arguments,
    at: fn(&DateTime<FixedOffset>) -> i64,
    total: Total,
) -> Result<Value, ExecutionError> {
    match (this, args.first()) {
        (Value::Timestamp(t), None) => Ok(Value::Int(at(&t.with_timezone(&utc())))),
        (Value::Timestamp(t), Some(Value::String(zone))) => {
            let offset = zone_offset(zone).ok_or_else(|| {
                ftx.error(format!(
                    "time zone {zone:?} is not known to xfn (it takes UTC and offsets as +01:00)"
                ))
            })?;
            Ok(Value::Int(at(&t.with_timezone(&offset))))
        }
        (Value::Duration(d), None) => match total {
            Some(total) => Ok(Value::Int(total(&d))),
            None => Err(ftx.error("no such overload for a duration")),
        },
        (other, _) => Err(ftx.error(format!("no such overload for {other:?}"))),
    }
}

fn utc() -> FixedOffset {
    FixedOffset::east_opt(0).unwrap_or_else(|| unreachable!("0 is a valid offset"))
}

/// `UTC`, or an offset `[+-]HH:MM` (`HH:MM` is east, as cel-go reads it).
fn zone_offset(zone: &str) -> Option<FixedOffset> {
    if zone == "UTC" {
        return Some(utc());
    }
    let (sign, rest) = match zone.as_bytes().first()? {
        b'-' => (-1, &zone[1..]),
        b'+' => (1, &zone[1..]),
        _ => (1, zone),
    };
    let (hours, minutes) = rest.split_once(':')?;
    let (hours, minutes): (i32, i32) = (hours.parse().ok()?, minutes.parse().ok()?);
    if !(0..24).contains(&hours) || !(0..60).contains(&minutes) {
        return None;
    }
    FixedOffset::east_opt(sign * (hours * 3600 + minutes * 60))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rule: &str) -> Value {
        let mut context = Context::default();
        register(&mut context);
        cel::Program::compile(rule)
            .unwrap()
            .execute(&context)
            .unwrap_or_else(|e| panic!("{rule}: {e}"))
    }

    #[test]
    fn timestamp_fields_are_read_in_utc_or_the_zone_given() {
        // 19:03 at +01:00 is 18:03 UTC (Kubernetes' date-time table).
        let t = "timestamp('2011-08-18T19:03:37.010+01:00')";
        for (rule, want) in [
            (format!("{t}.getHours()"), 18),
            (format!("{t}.getHours('UTC')"), 18),
            (format!("{t}.getHours('01:00')"), 19),
            (format!("{t}.getHours('-02:30')"), 15),
            (format!("{t}.getMinutes('-02:30')"), 33),
            (format!("{t}.getMilliseconds()"), 10),
            (format!("{t}.getMonth()"), 7),
            (
                "timestamp('2011-01-01T00:30:00+01:00').getFullYear()".to_string(),
                2010,
            ),
            ("duration('1h2m3s4ms').getMinutes()".to_string(), 62),
        ] {
            assert_eq!(run(&rule), Value::Int(want), "{rule}");
        }
    }

    #[test]
    fn a_time_zone_name_without_a_database_is_an_error() {
        let mut context = Context::default();
        register(&mut context);
        let rule = "timestamp('2011-08-18T19:03:37Z').getHours('America/New_York') == 15";
        let result = cel::Program::compile(rule).unwrap().execute(&context);
        assert!(result.is_err(), "{result:?}");
    }
}
