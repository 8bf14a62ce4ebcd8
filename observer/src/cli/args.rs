//! Value parsers and choices shared by several subcommands, so that every command says
//! the same thing about the same mistake.

use std::time::Duration;

/// How a listing command prints: aligned tables for people, JSON Lines for programs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    #[default]
    Table,
    /// One JSON object per line.
    Json,
}

/// `-o/--output FORMAT`, shared by the listing commands; each command words the help
/// for what its JSON holds (`mut_arg("format", ...)`).
#[derive(clap::Args, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FormatArg {
    /// `table` for people, `json` for programs.
    #[arg(
        short = 'o',
        long = "output",
        value_name = "FORMAT",
        value_enum,
        default_value_t
    )]
    pub format: OutputFormat,
}

/// `--duration`: 10 ms to a year.
pub fn duration_seconds(text: &str) -> Result<Duration, String> {
    seconds_in(text, 0.01, 365.0 * 86_400.0)
}

/// `--idle-timeout`: 100 ms to a day.
pub fn idle_seconds(text: &str) -> Result<Duration, String> {
    seconds_in(text, 0.1, 86_400.0)
}

/// A positive number of seconds (e.g. `30` or `0.5`), however negative numbers or
/// garbage are written; values outside `min..=max` are refused with the range.
pub fn parse_seconds(text: &str) -> Result<Duration, String> {
    seconds_in(text, f64::MIN_POSITIVE, 1e9)
}

/// A count: a whole number >= 0, however it is written wrong.
pub fn count(text: &str) -> Result<u64, String> {
    text.trim()
        .parse::<u64>()
        .map_err(|_| format!("`{text}` is not a whole number >= 0"))
}

fn seconds_in(text: &str, min: f64, max: f64) -> Result<Duration, String> {
    match text.trim().parse::<f64>() {
        Ok(seconds) if seconds > 0.0 && seconds.is_finite() => {
            if (min..=max).contains(&seconds) {
                Ok(Duration::from_secs_f64(seconds))
            } else {
                Err(format!(
                    "`{text}` seconds is out of range: allowed are {min} to {max}"
                ))
            }
        }
        _ => Err(format!("`{text}` is not a positive number of seconds")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_accept_fractions_and_refuse_the_rest_with_a_reason() {
        assert_eq!(duration_seconds("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(idle_seconds("30"), Ok(Duration::from_secs(30)));
        for bad in ["0", "-5", "-0.5", "abc", "inf", "NaN", ""] {
            let err = duration_seconds(bad).unwrap_err();
            assert!(
                err.contains("is not a positive number of seconds"),
                "{bad}: {err}"
            );
        }
        let err = idle_seconds("1e-9").unwrap_err();
        assert_eq!(
            err,
            "`1e-9` seconds is out of range: allowed are 0.1 to 86400"
        );
        assert!(
            duration_seconds("1e12")
                .unwrap_err()
                .contains("out of range")
        );
    }
}
