//! When a job's occurrences are: a fixed interval, or a cron expression in an explicit time
//! zone, as instants in milliseconds since the Unix epoch.

use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{Timestamp, Zoned};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// When a job's occurrences are.
///
/// - [`Schedule::every`]: every `period`, at the multiples of `period` since the Unix epoch
///   (every minute: at each whole minute, UTC), so every instance computes the same instants.
/// - [`Schedule::cron`]: a cron expression in a named time zone (never the machine's own).
///
/// ## Cron expressions
///
/// Five fields (`minute hour day-of-month month day-of-week`) or six, with seconds first.
/// Each field is `*`, a number, a range `a-b`, a step `*/n`, `a/n` or `a-b/n`, or a list of
/// those separated by commas; months also as `JAN`–`DEC`, days of the week as `SUN`–`SAT` or
/// `0`–`7` (`0` and `7` are Sunday). `@hourly`, `@daily` (`@midnight`), `@weekly`,
/// `@monthly` and `@yearly` (`@annually`) stand for their usual expressions.
///
/// An expression may restrict the day of the month or the day of the week, not both: cron
/// implementations disagree on what both mean (either one, or both at once), so idem
/// refuses to guess.
///
/// ## Daylight saving
///
/// Occurrences are wall-clock times in the schedule's zone, and each wall-clock time that
/// occurs runs once:
///
/// - **a time the clocks skip** (02:30 on the night the clocks go from 02:00 to 03:00) runs
///   once, shifted forward by the length of the gap (at 03:30), so a daily job still runs
///   that day;
/// - **a time the clocks repeat** (01:30 on the night they go back from 02:00 to 01:00)
///   runs once, at its first instant, for an expression whose hour field names hours; an
///   expression whose hour field is `*` (or a step over every hour) runs in each real hour,
///   the repeated one included.
#[derive(Clone)]
pub struct Schedule(Kind);

#[derive(Clone)]
enum Kind {
    Every(i64),
    Cron(Box<Cron>),
}

#[derive(Clone)]
struct Cron {
    source: String,
    schedule: jiff_cron::Schedule,
    zone: TimeZone,
    /// Whether the hour field names hours (a repeated wall-clock hour then runs once).
    fixed_hours: bool,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Every(period) => write!(f, "Schedule::every({period} ms)"),
            Kind::Cron(cron) => write!(
                f,
                "Schedule::cron({:?}, {:?})",
                cron.source,
                cron.zone.iana_name().unwrap_or("?")
            ),
        }
    }
}

/// Why a schedule or a job was refused, at its definition.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScheduleError {
    /// A period shorter than a millisecond.
    TooShort,
    /// A cron expression that does not parse: which field, and what is wrong with it.
    Cron {
        /// The expression as given.
        expression: String,
        /// The field at fault (`"minute"`, `"day of week"`, …), or `"expression"` for the
        /// whole.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// A time zone name the time zone database does not know.
    Zone(String),
    /// The job's name is not a valid key (empty, longer than 255 bytes, a control
    /// character).
    Name(crate::KeyError),
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleError::TooShort => f.write_str("a schedule's period is at least 1 ms"),
            ScheduleError::Cron {
                expression,
                field,
                problem,
            } => write!(f, "cron expression `{expression}`: the {field} {problem}"),
            ScheduleError::Zone(zone) => write!(
                f,
                "unknown time zone `{zone}`: name one of the IANA database (`Europe/Berlin`, `UTC`)"
            ),
            ScheduleError::Name(e) => write!(f, "invalid job name: {e}"),
        }
    }
}

impl std::error::Error for ScheduleError {}

/// A field of a cron expression: its name and range.
struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const SECOND: Field = Field {
    name: "second",
    min: 0,
    max: 59,
    names: &[],
};
const MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
};
const DAY_OF_MONTH: Field = Field {
    name: "day of month",
    min: 1,
    max: 31,
    names: &[],
};
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ],
};
const DAY_OF_WEEK: Field = Field {
    name: "day of week",
    min: 0,
    max: 7,
    names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
};

impl Schedule {
    /// Every `period`, at the multiples of `period` since the Unix epoch. At least 1 ms.
    pub fn every(period: Duration) -> Result<Schedule, ScheduleError> {
        let period = crate::inbox::millis(period);
        if period < 1 {
            return Err(ScheduleError::TooShort);
        }
        Ok(Schedule(Kind::Every(period)))
    }

    /// A cron expression (see the [type](Schedule)'s docs) in the IANA time zone `zone`
    /// (`"UTC"`, `"Europe/Berlin"`). Refused with the field at fault and why.
    ///
    /// ```
    /// use idem::schedule::Schedule;
    /// let nightly = Schedule::cron("30 2 * * *", "Europe/Berlin")?;
    /// let error = Schedule::cron("61 2 * * *", "UTC").unwrap_err();
    /// assert_eq!(
    ///     error.to_string(),
    ///     "cron expression `61 2 * * *`: the minute field (1st) has `61`: minutes are 0 to 59"
    /// );
    /// # let _ = nightly;
    /// # Ok::<(), idem::schedule::ScheduleError>(())
    /// ```
    pub fn cron(expression: &str, zone: &str) -> Result<Schedule, ScheduleError> {
        let zone_found = TimeZone::get(zone).map_err(|_| ScheduleError::Zone(zone.to_owned()))?;
        let refuse = |field: &'static str, problem: String| ScheduleError::Cron {
            expression: expression.to_owned(),
            field,
            problem,
        };
        let expanded = match expression.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other if other.starts_with('@') => {
                return Err(refuse(
                    "expression",
                    format!(
                        "`{other}` is not one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly"
                    ),
                ));
            }
            other => other,
        };
        let parts: Vec<&str> = expanded.split_whitespace().collect();
        let (fields, parts): (&[Field], Vec<&str>) = match parts.len() {
            5 => (&[MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK], parts),
            6 => (
                &[SECOND, MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK],
                parts,
            ),
            n => {
                return Err(refuse(
                    "expression",
                    format!(
                        "has {n} fields: a cron expression has 5 (minute hour day-of-month month day-of-week) or 6 (second first)"
                    ),
                ));
            }
        };
        for (position, (field, part)) in fields.iter().zip(&parts).enumerate() {
            check_field(field, part).map_err(|problem| {
                refuse(
                    field.name,
                    format!("field ({}) has `{part}`: {problem}", ordinal(position + 1)),
                )
            })?;
        }
        let n = parts.len();
        let (day_of_month, day_of_week) = (parts[n - 3], parts[n - 1]);
        if !unrestricted(day_of_month) && !unrestricted(day_of_week) {
            return Err(refuse(
                "day of week",
                "field is restricted as well as the day of month: restrict one of them and \
                 leave the other `*` (cron implementations disagree on what both mean)"
                    .to_owned(),
            ));
        }
        let second = if n == 6 { parts[0] } else { "0" };
        let hour = parts[n - 4];
        let translated = format!(
            "{second} {} {hour} {day_of_month} {} {} *",
            parts[n - 5],
            parts[n - 2],
            day_of_week_names(day_of_week),
        );
        let schedule = jiff_cron::Schedule::from_str(&translated)
            .map_err(|e| refuse("expression", format!("is refused: {e}")))?;
        Ok(Schedule(Kind::Cron(Box::new(Cron {
            source: expression.to_owned(),
            schedule,
            zone: zone_found,
            fixed_hours: !hour.starts_with('*'),
        }))))
    }

    /// The first occurrence at or after `millis`; `None` past the last one a cron
    /// expression has (or past the year 9999).
    pub(crate) fn at_or_after(&self, millis: i64) -> Option<i64> {
        match &self.0 {
            Kind::Every(period) => {
                let k = millis.div_euclid(*period) + i64::from(millis.rem_euclid(*period) != 0);
                k.checked_mul(*period)
            }
            Kind::Cron(cron) => {
                let Cron {
                    schedule,
                    zone,
                    fixed_hours,
                    ..
                } = &**cron;
                // Occurrences are whole seconds: start a whole second before the first whole
                // second at or after `millis`, so that one at `millis` itself is found (the
                // cron crate's iteration goes wrong from an instant with a fraction).
                let second = millis.div_euclid(1000) + i64::from(millis.rem_euclid(1000) != 0);
                let from = Timestamp::from_second(second.checked_sub(1)?).ok()?;
                let after = Zoned::new(from, zone.clone());
                for found in schedule.after(after).take(64) {
                    let at = found.timestamp().as_millisecond();
                    if at < millis {
                        continue;
                    }
                    if *fixed_hours && let Some(first) = first_instant(&found) {
                        // A repeated wall-clock time runs once, at its first instant.
                        if first < at {
                            if first >= millis {
                                return Some(first);
                            }
                            continue;
                        }
                    }
                    return Some(at);
                }
                None
            }
        }
    }

    /// How many occurrences are in `[from, to)`, counted up to `cap`.
    pub(crate) fn count_between(&self, from: i64, to: i64, cap: u64) -> u64 {
        if let Kind::Every(period) = &self.0 {
            let Some(first) = self.at_or_after(from) else {
                return 0;
            };
            if first >= to {
                return 0;
            }
            let n = (to - 1 - first) / period + 1;
            return u64::try_from(n).unwrap_or(0).min(cap);
        }
        let mut count = 0;
        let mut at = from;
        while count < cap {
            match self.at_or_after(at) {
                Some(next) if next < to => {
                    count += 1;
                    at = next + 1;
                }
                _ => break,
            }
        }
        count
    }

    /// The last occurrence at or before `millis`, at or after `from`; `None` if there is none.
    pub(crate) fn latest_between(&self, from: i64, millis: i64) -> Option<i64> {
        if let Kind::Every(period) = &self.0 {
            let latest = millis.div_euclid(*period).checked_mul(*period)?;
            return (latest >= from).then_some(latest);
        }
        let mut latest = None;
        let mut at = from;
        // Bounded: a job that missed more than this many occurrences of a cron schedule
        // starts from the last of them found.
        for _ in 0..100_000 {
            match self.at_or_after(at) {
                Some(next) if next <= millis => {
                    latest = Some(next);
                    at = next + 1;
                }
                _ => break,
            }
        }
        latest
    }
}

/// The first instant of `found`'s wall-clock time, if the zone repeats that time.
fn first_instant(found: &Zoned) -> Option<i64> {
    let ambiguous = found.time_zone().to_ambiguous_zoned(found.datetime());
    match ambiguous.offset() {
        AmbiguousOffset::Fold { before, .. } => {
            let first = found.datetime().to_zoned(TimeZone::fixed(before)).ok()?;
            Some(first.timestamp().as_millisecond())
        }
        _ => None,
    }
}

fn ordinal(n: usize) -> String {
    let suffix = match n {
        1 => "st",
        2 => "nd",
        3 => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// Whether a day field lets every day through.
fn unrestricted(part: &str) -> bool {
    part == "*" || part == "?"
}

/// Checks one field's items against its range; the problem, if any.
fn check_field(field: &Field, part: &str) -> Result<(), String> {
    if part == "?" && (field.name == "day of month" || field.name == "day of week") {
        return Ok(());
    }
    for item in part.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(step)),
            None => (item, None),
        };
        if let Some(step) = step {
            match step.parse::<u32>() {
                Ok(step) if step >= 1 && step <= field.max.max(1) => {}
                _ => {
                    return Err(format!(
                        "the step `{step}` is not a number from 1 to {}",
                        field.max.max(1)
                    ));
                }
            }
        }
        if range == "*" {
            continue;
        }
        let (low, high) = match range.split_once('-') {
            Some((low, high)) => (low, Some(high)),
            None => (range, None),
        };
        let low = value(field, low)?;
        if let Some(high) = high {
            let high = value(field, high)?;
            if high < low {
                return Err(format!("the range {low}-{high} runs backwards"));
            }
        }
    }
    Ok(())
}

/// One value of a field: a number in its range or one of its names.
fn value(field: &Field, text: &str) -> Result<u32, String> {
    let plural = match field.name {
        "day of month" => "days of the month",
        "day of week" => "days of the week",
        "second" => "seconds",
        "minute" => "minutes",
        "hour" => "hours",
        _ => "months",
    };
    if let Ok(n) = text.parse::<u32>() {
        if n < field.min || n > field.max {
            return Err(format!("{plural} are {} to {}", field.min, field.max));
        }
        return Ok(n);
    }
    let upper = text.to_ascii_uppercase();
    match field.names.iter().position(|name| *name == upper) {
        Some(i) => Ok(u32::try_from(i).unwrap_or(0) + field.min),
        None if field.names.is_empty() => Err(format!(
            "{plural} are numbers from {} to {}",
            field.min, field.max
        )),
        None => Err(format!(
            "{plural} are {} to {} or {}",
            field.min,
            field.max,
            field.names.join(", ")
        )),
    }
}

/// The day-of-week field with names for numbers, whose meaning the cron crate numbers
/// differently (its 1 is Sunday; cron's 0 and 7 are).
fn day_of_week_names(part: &str) -> String {
    const NAMES: [&str; 8] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"];
    let name = |text: &str| -> String {
        match text.parse::<usize>() {
            Ok(n) if n < NAMES.len() => NAMES[n].to_owned(),
            _ => text.to_ascii_uppercase(),
        }
    };
    part.split(',')
        .map(|item| {
            let (range, step) = match item.split_once('/') {
                Some((range, step)) => (range, Some(step)),
                None => (item, None),
            };
            let step = step.map(|s| format!("/{s}")).unwrap_or_default();
            match range.split_once('-') {
                // A range ending on Sunday as 7: up to Saturday, and Sunday.
                Some((low, "7")) if step.is_empty() && low != "0" && low != "7" => {
                    format!("{}-SAT,SUN", name(low))
                }
                Some((low, high)) => format!("{}-{}{step}", name(low), name(high)),
                None if range == "*" || range == "?" => format!("{range}{step}"),
                None => format!("{}{step}", name(range)),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instant(text: &str) -> i64 {
        text.parse::<Zoned>().unwrap().timestamp().as_millisecond()
    }

    fn next(schedule: &Schedule, from: i64, n: usize) -> Vec<String> {
        let mut at = from;
        let mut found = Vec::new();
        for _ in 0..n {
            let next = schedule.at_or_after(at).unwrap();
            let zoned = Timestamp::from_millisecond(next)
                .unwrap()
                .to_zoned(TimeZone::get("America/New_York").unwrap());
            found.push(zoned.strftime("%Y-%m-%dT%H:%M%:z").to_string());
            at = next + 1;
        }
        found
    }

    #[test]
    fn intervals_are_multiples_of_the_period_since_the_epoch() {
        let every = Schedule::every(Duration::from_secs(60)).unwrap();
        assert_eq!(every.at_or_after(60_000), Some(60_000));
        assert_eq!(every.at_or_after(60_001), Some(120_000));
        assert_eq!(every.count_between(0, 180_000, 10), 3);
        assert_eq!(every.count_between(1, 180_001, 10), 3);
        assert_eq!(every.latest_between(0, 179_999), Some(120_000));
        assert_eq!(every.latest_between(130_000, 179_999), None);
        assert_eq!(
            Schedule::every(Duration::from_micros(10)).unwrap_err(),
            ScheduleError::TooShort
        );
    }

    #[test]
    fn a_time_the_clocks_skip_runs_once_shifted_by_the_gap() {
        let daily = Schedule::cron("30 2 * * *", "America/New_York").unwrap();
        let from = instant("2026-03-07T00:00-05:00[America/New_York]");
        assert_eq!(
            next(&daily, from, 3),
            [
                "2026-03-07T02:30-05:00",
                "2026-03-08T03:30-04:00",
                "2026-03-09T02:30-04:00"
            ]
        );
    }

    #[test]
    fn a_time_the_clocks_repeat_runs_once_at_its_first_instant() {
        let daily = Schedule::cron("30 1 * * *", "America/New_York").unwrap();
        let from = instant("2026-10-31T00:00-04:00[America/New_York]");
        assert_eq!(
            next(&daily, from, 3),
            [
                "2026-10-31T01:30-04:00",
                "2026-11-01T01:30-04:00",
                "2026-11-02T01:30-05:00"
            ]
        );
        // Named hours: the repeated 01:00 once.
        let named = Schedule::cron("0 0-3 * * *", "America/New_York").unwrap();
        let from = instant("2026-11-01T00:00-04:00[America/New_York]");
        assert_eq!(
            next(&named, from, 4),
            [
                "2026-11-01T00:00-04:00",
                "2026-11-01T01:00-04:00",
                "2026-11-01T02:00-05:00",
                "2026-11-01T03:00-05:00"
            ]
        );
        // Every hour: each real hour, the repeated one too.
        let hourly = Schedule::cron("0 * * * *", "America/New_York").unwrap();
        assert_eq!(
            next(&hourly, from, 4),
            [
                "2026-11-01T00:00-04:00",
                "2026-11-01T01:00-04:00",
                "2026-11-01T01:00-05:00",
                "2026-11-01T02:00-05:00"
            ]
        );
    }

    #[test]
    fn days_of_the_week_are_crons_numbers() {
        // 2026-01-01 is a Thursday; 1 is Monday, 0 and 7 are Sunday.
        let from = instant("2026-01-01T00:00-05:00[America/New_York]");
        let monday = Schedule::cron("0 0 * * 1", "America/New_York").unwrap();
        assert_eq!(next(&monday, from, 1), ["2026-01-05T00:00-05:00"]);
        for sunday in ["0 0 * * 0", "0 0 * * 7", "0 0 * * SUN", "@weekly"] {
            let sunday = Schedule::cron(sunday, "America/New_York").unwrap();
            assert_eq!(next(&sunday, from, 1), ["2026-01-04T00:00-05:00"]);
        }
        let weekend = Schedule::cron("0 0 * * 6-7", "America/New_York").unwrap();
        assert_eq!(
            next(&weekend, from, 2),
            ["2026-01-03T00:00-05:00", "2026-01-04T00:00-05:00"]
        );
    }

    #[test]
    fn an_invalid_expression_names_its_field() {
        let refused = |expression: &str| Schedule::cron(expression, "UTC").unwrap_err().to_string();
        assert_eq!(
            refused("0 24 * * *"),
            "cron expression `0 24 * * *`: the hour field (2nd) has `24`: hours are 0 to 23"
        );
        assert_eq!(
            refused("* * 0 * *"),
            "cron expression `* * 0 * *`: the day of month field (3rd) has `0`: days of the month are 1 to 31"
        );
        assert_eq!(
            refused("* * * FOO *"),
            "cron expression `* * * FOO *`: the month field (4th) has `FOO`: months are 1 to 12 or JAN, FEB, MAR, APR, MAY, JUN, JUL, AUG, SEP, OCT, NOV, DEC"
        );
        assert_eq!(
            refused("*/0 * * * *"),
            "cron expression `*/0 * * * *`: the minute field (1st) has `*/0`: the step `0` is not a number from 1 to 59"
        );
        assert_eq!(
            refused("5-1 * * * *"),
            "cron expression `5-1 * * * *`: the minute field (1st) has `5-1`: the range 5-1 runs backwards"
        );
        assert!(refused("* * * *").contains("has 4 fields"));
        assert!(refused("0 0 1 * MON").contains("restricted as well as the day of month"));
        assert!(refused("@fortnightly").contains("is not one of"));
        assert_eq!(
            Schedule::cron("* * * * *", "Mars/Olympus").unwrap_err(),
            ScheduleError::Zone("Mars/Olympus".into())
        );
    }
}
