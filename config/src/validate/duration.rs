//! Go duration strings (`90s`, `1m30s`, `1.5h`), as MetalLB's `metav1.Duration` fields hold them.

use std::time::Duration;

/// A text that is not a Go duration: malformed, negative, with an unknown unit, or too long for
/// a [`Duration`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a duration such as 90s, 1m30s or 500ms")]
pub struct DurationError {
    /// The text as given.
    pub text: String,
}

/// Parses a Go duration string. Negative durations are refused.
pub fn parse_go_duration(text: &str) -> Result<Duration, DurationError> {
    let bad = || DurationError {
        text: text.to_string(),
    };
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() || text.starts_with('-') {
        return Err(bad());
    }
    let mut total = 0f64;
    let mut rest = text.trim_start_matches('+');
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if number_len == 0 {
            return Err(bad());
        }
        let value: f64 = rest[..number_len].parse().map_err(|_| bad())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total += value * seconds;
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse_go_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_go_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn refuses_what_go_refuses() {
        for bad in ["", "90", "s", "-1s", "1x", "1.2.3s", "1 s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_error_names_the_text() {
        assert_eq!(
            parse_go_duration("1x").map_err(|e| e.to_string()),
            Err("\"1x\" is not a duration such as 90s, 1m30s or 500ms".to_string())
        );
    }
}
