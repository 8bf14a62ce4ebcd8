//! How numbers read in every text sink and on screen: durations, bytes, counted nouns.
//! One formatter each, so the live view and `summary` say the same thing the same way.

/// A frontend kind as Kubernetes spells the Service type or field.
pub fn frontend_kind_text(kind: crate::model::record::FrontendKind) -> &'static str {
    use crate::model::record::FrontendKind;
    match kind {
        FrontendKind::ClusterIp => "ClusterIP",
        FrontendKind::NodePort => "NodePort",
        FrontendKind::ExternalIp => "externalIP",
        FrontendKind::LoadBalancer => "LoadBalancer",
    }
}

/// How many digits a duration keeps: a report has room, a table column on screen less.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Digits {
    /// `812.3ms`, `4.09s`.
    Report,
    /// `812ms`, `4.1s`.
    Compact,
}

/// A duration in the unit a person reads fastest: 812.3ms, 4.09s, 12m05s, 1h02m.
pub fn duration(ms: f64, digits: Digits) -> String {
    let compact = digits == Digits::Compact;
    if ms < 1000.0 {
        if compact {
            format!("{ms:.0}ms")
        } else {
            format!("{ms:.1}ms")
        }
    } else if ms < 60_000.0 {
        if compact {
            format!("{:.1}s", ms / 1000.0)
        } else {
            format!("{:.2}s", ms / 1000.0)
        }
    } else if ms < 3_600_000.0 {
        let s = (ms / 1000.0).round() as u64;
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        let m = (ms / 60_000.0).round() as u64;
        format!("{}h{:02}m", m / 60, m % 60)
    }
}

/// A short time such as a connect time: below a millisecond in microseconds (`287µs`),
/// otherwise as [`duration`] says it.
pub fn latency(ms: f64, digits: Digits) -> String {
    let micros = ms * 1000.0;
    if micros < 999.5 {
        format!("{micros:.0}µs")
    } else {
        duration(ms, digits)
    }
}

/// Bytes in binary units: 930 B, 2.7 KiB, 1.2 MiB.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `1 connection`, `3 connections`.
pub fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_both_digit_styles() {
        let report: Vec<String> = [22.44, 4087.655, 65_400.0, 3_780_000.0]
            .map(|ms| duration(ms, Digits::Report))
            .to_vec();
        assert_eq!(report, ["22.4ms", "4.09s", "1m05s", "1h03m"]);
        let compact: Vec<String> = [22.44, 4087.655, 65_400.0, 3_780_000.0]
            .map(|ms| duration(ms, Digits::Compact))
            .to_vec();
        assert_eq!(compact, ["22ms", "4.1s", "1m05s", "1h03m"]);
    }

    #[test]
    fn latencies_below_a_millisecond_are_in_microseconds() {
        let texts = [0.0, 0.2874, 0.9994, 0.9996, 12.5].map(|ms| latency(ms, Digits::Report));
        assert_eq!(texts, ["0µs", "287µs", "999µs", "1.0ms", "12.5ms"]);
        assert_eq!(latency(12.4, Digits::Compact), "12ms");
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(10234), "10,234");
        assert_eq!(thousands(1234567), "1,234,567");
    }
}
