//! The lab's logs across labs: `up` starts each lab with fresh logs and keeps the previous lab's,
//! a bounded number of them, so the evidence of whatever ended a lab survives the next one.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// How many earlier labs' logs `up` keeps in `<lab dir>/logs.old/`.
pub const KEPT_LOGS: usize = 5;

/// Moves the logs of the previous lab (if any) to `logs.old/<UTC time>/` and removes the oldest
/// beyond [`KEPT_LOGS`]; returns where they went.
pub fn archive(dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    let logs = dir.join("logs");
    let has_logs = std::fs::read_dir(&logs).is_ok_and(|mut d| d.next().is_some());
    if !has_logs {
        let _ = std::fs::remove_dir_all(&logs);
        return Ok(None);
    }
    let old = dir.join("logs.old");
    std::fs::create_dir_all(&old)?;
    let mut target = old.join(utc_stamp(std::time::SystemTime::now()));
    let mut n = 1;
    while target.exists() {
        n += 1;
        target = old.join(format!("{}-{n}", utc_stamp(std::time::SystemTime::now())));
    }
    std::fs::rename(&logs, &target)
        .with_context(|| format!("moving {} to {}", logs.display(), target.display()))?;
    let mut kept: Vec<PathBuf> = std::fs::read_dir(&old)?
        .flatten()
        .map(|e| e.path())
        .collect();
    // The names sort by time.
    kept.sort();
    while kept.len() > KEPT_LOGS {
        let oldest = kept.remove(0);
        let _ = std::fs::remove_dir_all(&oldest);
    }
    Ok(Some(target))
}

/// `20261201T071503Z` for a time (UTC, from the civil calendar; no time zone database needed).
fn utc_stamp(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::utc_stamp;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn stamps_are_utc_calendar_times() {
        assert_eq!(utc_stamp(UNIX_EPOCH), "19700101T000000Z");
        // 2026-12-01 07:15:03 UTC, and the day after a leap day.
        assert_eq!(
            utc_stamp(UNIX_EPOCH + Duration::from_secs(1_796_109_303)),
            "20261201T071503Z"
        );
        assert_eq!(
            utc_stamp(UNIX_EPOCH + Duration::from_secs(951_868_800)),
            "20000301T000000Z"
        );
    }
}
