//! Cron schedules as CronJobs use them: five fields (minute, hour, day of
//! month, month, day of week) with `*`, `?`, lists, ranges, steps and
//! month/day names, or the macros `@yearly`, `@annually`, `@monthly`,
//! `@weekly`, `@daily`, `@midnight`, `@hourly`. When both day fields are
//! restricted a day matching either runs (as cron does). Times are
//! evaluated in a time zone loaded from the system's zoneinfo files.

use k8s_openapi::jiff::civil::{Date, DateTime};
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::Timestamp;

/// A parsed schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u32,
    days: u32,
    months: u16,
    weekdays: u8,
    day_star: bool,
    weekday_star: bool,
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const DAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

fn value(s: &str, names: &[&str], first: u32) -> Result<u32, String> {
    if let Ok(v) = s.parse::<u32>() {
        return Ok(v);
    }
    let l = s.to_ascii_lowercase();
    names
        .iter()
        .position(|n| *n == l)
        .map(|i| i as u32 + first)
        .ok_or_else(|| format!("failed to parse int from {s}"))
}

/// The bits of one field (bit n set: value n allowed).
fn field(s: &str, min: u32, max: u32, names: &[&str], names_first: u32) -> Result<u64, String> {
    let mut bits = 0u64;
    if s.is_empty() {
        return Err("empty field".into());
    }
    for part in s.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, st)) => {
                let st: u32 = st
                    .parse()
                    .map_err(|_| format!("failed to parse int from {st}"))?;
                if st == 0 {
                    return Err(format!("step of range should be a positive number: {part}"));
                }
                (r, Some(st))
            }
            None => (part, None),
        };
        let (lo, hi) = if range == "*" || range == "?" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a, names, names_first)?, value(b, names, names_first)?)
        } else {
            let v = value(range, names, names_first)?;
            // `5/15` means from 5 to the end, every 15.
            (v, if step.is_some() { max } else { v })
        };
        if lo < min || hi > max || lo > hi {
            return Err(format!("value out of range ({min}-{max}): {part}"));
        }
        let step = step.unwrap_or(1);
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok(bits)
}

impl Schedule {
    pub fn parse(spec: &str) -> Result<Schedule, String> {
        let spec = spec.trim();
        let expanded = match spec {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            s if s.starts_with('@') => return Err(format!("unrecognized descriptor: {s}")),
            s => s,
        };
        let f: Vec<&str> = expanded.split_whitespace().collect();
        if f.len() != 5 {
            return Err(format!(
                "expected exactly 5 fields, found {}: {spec}",
                f.len()
            ));
        }
        let mut weekdays = field(f[4], 0, 7, &DAYS, 0)?;
        if weekdays & (1 << 7) != 0 {
            weekdays |= 1; // 7 is Sunday too
        }
        Ok(Schedule {
            minutes: field(f[0], 0, 59, &[], 0)?,
            hours: field(f[1], 0, 23, &[], 0)? as u32,
            days: field(f[2], 1, 31, &[], 0)? as u32,
            months: field(f[3], 1, 12, &MONTHS, 1)? as u16,
            weekdays: (weekdays & 0x7f) as u8,
            day_star: f[2].starts_with('*') || f[2].starts_with('?'),
            weekday_star: f[4].starts_with('*') || f[4].starts_with('?'),
        })
    }

    fn day_matches(&self, d: Date) -> bool {
        if self.months & (1 << d.month() as u16) == 0 {
            return false;
        }
        let dom = self.days & (1 << d.day() as u32) != 0;
        let dow = self.weekdays & (1 << d.weekday().to_sunday_zero_offset() as u8) != 0;
        if self.day_star || self.weekday_star {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The first scheduled time strictly after `after`, in `tz` (within
    /// five years; None if there is none, e.g. February 30th).
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let local = tz.to_datetime(after);
        let start_day = local.date();
        let mut day = start_day;
        for _ in 0..(366 * 5) {
            if self.day_matches(day) {
                for h in 0..24u32 {
                    if self.hours & (1 << h) == 0 {
                        continue;
                    }
                    for m in 0..60u64 {
                        if self.minutes & (1 << m) == 0 {
                            continue;
                        }
                        let dt = DateTime::new(
                            day.year(),
                            day.month(),
                            day.day(),
                            h as i8,
                            m as i8,
                            0,
                            0,
                        )
                        .ok()?;
                        if day == start_day && (h as i8) < local.hour().saturating_sub(2) {
                            // Well before `after` (2 h of slack for DST).
                            continue;
                        }
                        let amb = tz.to_ambiguous_timestamp(dt);
                        // A time skipped by DST does not run; a repeated
                        // one runs at its first occurrence.
                        let Ok(t) = amb.earlier() else { continue };
                        if t.to_zoned(tz.clone()).datetime() == dt && t > after {
                            return Some(t);
                        }
                    }
                }
            }
            day = day.tomorrow().ok()?;
        }
        None
    }

    /// The latest scheduled time in (`after`, `until`] and how many there
    /// are (counted up to `cap`).
    pub fn between(
        &self,
        after: Timestamp,
        until: Timestamp,
        tz: &TimeZone,
        cap: usize,
    ) -> (Option<Timestamp>, usize) {
        let mut n = 0;
        let mut t = after;
        while n < cap {
            match self.next_after(t, tz) {
                Some(x) if x <= until => {
                    n += 1;
                    t = x;
                }
                _ => return ((n > 0).then_some(t), n),
            }
        }
        // Many missed: look for the latest in growing windows before `until`.
        for w in [3_660i64, 90_000, 2_764_800, 31_708_800, 158_112_000] {
            let from = until
                .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(w))
                .unwrap_or(after)
                .max(t);
            let mut last = None;
            let mut probe = from;
            while let Some(x) = self.next_after(probe, tz) {
                if x > until {
                    break;
                }
                last = Some(x);
                probe = x;
            }
            if last.is_some() {
                return (last, n);
            }
        }
        (Some(t), n)
    }
}

/// A time zone by IANA name from the system's zoneinfo (`$ZONEINFO` or
/// /usr/share/zoneinfo); UTC for None or "UTC"/"Etc/UTC".
pub fn time_zone(name: Option<&str>) -> Result<TimeZone, String> {
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Ok(TimeZone::UTC);
    };
    if name == "UTC" || name == "Etc/UTC" {
        return Ok(TimeZone::UTC);
    }
    let valid = !name.starts_with('/')
        && !name
            .split('/')
            .any(|p| p == ".." || p == "." || p.is_empty())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_+-/".contains(c));
    if !valid {
        return Err(format!("unknown time zone {name}"));
    }
    let dirs = std::env::var("ZONEINFO").ok().into_iter().chain([
        "/usr/share/zoneinfo".to_string(),
        "/usr/lib/zoneinfo".into(),
    ]);
    for d in dirs {
        if let Ok(data) = std::fs::read(std::path::Path::new(&d).join(name)) {
            return TimeZone::tzif(name, &data).map_err(|e| format!("time zone {name}: {e}"));
        }
    }
    Err(format!("unknown time zone {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn every_minute_runs_at_the_next_minute() {
        let s = Schedule::parse("* * * * *").unwrap();
        assert_eq!(
            s.next_after(ts("2026-01-01T10:00:30Z"), &TimeZone::UTC),
            Some(ts("2026-01-01T10:01:00Z"))
        );
        assert_eq!(
            s.next_after(ts("2026-01-01T10:01:00Z"), &TimeZone::UTC),
            Some(ts("2026-01-01T10:02:00Z"))
        );
    }

    #[test]
    fn steps_ranges_lists_and_names_are_understood() {
        let s = Schedule::parse("*/15 9-17 * JAN,mar mon-fri").unwrap();
        // 2026-01-03 is a Saturday: the next run is Monday 09:00.
        assert_eq!(
            s.next_after(ts("2026-01-03T12:00:00Z"), &TimeZone::UTC),
            Some(ts("2026-01-05T09:00:00Z"))
        );
        assert_eq!(
            s.next_after(ts("2026-01-05T09:00:00Z"), &TimeZone::UTC),
            Some(ts("2026-01-05T09:15:00Z"))
        );
        let s = Schedule::parse("5/20 * * * *").unwrap();
        assert_eq!(
            s.next_after(ts("2026-01-01T00:26:00Z"), &TimeZone::UTC),
            Some(ts("2026-01-01T00:45:00Z"))
        );
    }

    #[test]
    fn macros_expand_to_their_schedules() {
        assert_eq!(
            Schedule::parse("@hourly").unwrap(),
            Schedule::parse("0 * * * *").unwrap()
        );
        assert_eq!(
            Schedule::parse("@weekly").unwrap(),
            Schedule::parse("0 0 * * 7").unwrap()
        );
        assert!(Schedule::parse("@fortnightly").is_err());
    }

    #[test]
    fn restricted_day_of_month_and_weekday_match_either() {
        // The 13th, or any Friday.
        let s = Schedule::parse("0 0 13 * 5").unwrap();
        // 2026-02-06 is a Friday.
        assert_eq!(
            s.next_after(ts("2026-02-01T00:00:00Z"), &TimeZone::UTC),
            Some(ts("2026-02-06T00:00:00Z"))
        );
        assert_eq!(
            s.next_after(ts("2026-02-12T00:00:00Z"), &TimeZone::UTC),
            Some(ts("2026-02-13T00:00:00Z"))
        );
    }

    #[test]
    fn malformed_schedules_are_errors_not_panics() {
        for bad in [
            "",
            "* * * *",
            "60 * * * *",
            "* * 0 * *",
            "*/0 * * * *",
            "a b c d e",
            "5-1 * * * *",
        ] {
            assert!(Schedule::parse(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(
            Schedule::parse("0 0 30 2 *")
                .unwrap()
                .next_after(ts("2026-01-01T00:00:00Z"), &TimeZone::UTC),
            None
        );
    }

    #[test]
    fn schedules_follow_their_time_zone() {
        let Ok(tz) = time_zone(Some("America/New_York")) else {
            return; // no zoneinfo on this machine
        };
        let s = Schedule::parse("0 9 * * *").unwrap();
        // 09:00 in New York in January is 14:00 UTC.
        assert_eq!(
            s.next_after(ts("2026-01-10T00:00:00Z"), &tz),
            Some(ts("2026-01-10T14:00:00Z"))
        );
        // In July (DST) it is 13:00 UTC.
        assert_eq!(
            s.next_after(ts("2026-07-10T00:00:00Z"), &tz),
            Some(ts("2026-07-10T13:00:00Z"))
        );
        // 02:30 does not exist on 2026-03-08 in New York.
        let s = Schedule::parse("30 2 * * *").unwrap();
        assert_eq!(
            s.next_after(ts("2026-03-08T00:00:00Z"), &tz),
            Some(ts("2026-03-09T06:30:00Z"))
        );
        assert!(time_zone(Some("../etc/passwd")).is_err());
        assert!(time_zone(Some("Mars/Olympus")).is_err());
    }

    #[test]
    fn missed_times_are_counted_and_the_latest_returned() {
        let s = Schedule::parse("* * * * *").unwrap();
        let (last, n) = s.between(
            ts("2026-01-01T00:00:00Z"),
            ts("2026-01-01T00:10:30Z"),
            &TimeZone::UTC,
            100,
        );
        assert_eq!(last, Some(ts("2026-01-01T00:10:00Z")));
        assert_eq!(n, 10);
        // A year of missed minutes: capped count, still the latest time.
        let (last, n) = s.between(
            ts("2025-01-01T00:00:00Z"),
            ts("2026-01-01T00:10:30Z"),
            &TimeZone::UTC,
            100,
        );
        assert_eq!(last, Some(ts("2026-01-01T00:10:00Z")));
        assert_eq!(n, 100);
        let (none, n) = s.between(
            ts("2026-01-01T00:00:00Z"),
            ts("2026-01-01T00:00:30Z"),
            &TimeZone::UTC,
            100,
        );
        assert_eq!((none, n), (None, 0));
    }
}
