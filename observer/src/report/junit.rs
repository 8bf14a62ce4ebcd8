//! `check -o junit`: the verdicts as JUnit XML, the test report CI systems ingest (Jenkins,
//! GitLab, GitHub Actions' test reporters): one `<testsuite>` per subject (`recording`,
//! then each Service), one `<testcase>` per condition checked on it, with a `<failure>`
//! carrying the violation's text when it does not hold. It follows the JUnit schema that
//! Jenkins' xUnit plugin validates against (`observer/tests/data/junit/junit-10.xsd`).

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use crate::model::record::format_time;
use crate::report::check::Verdict;

/// Escapes text for an attribute or element: the five XML entities, and characters XML 1.0
/// does not allow (control characters other than tab, newline and carriage return) as `?`.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// The report of `file`'s verdicts, checked at `time`.
pub fn render_junit(file: &str, verdicts: &[Verdict], time: DateTime<Utc>) -> String {
    let mut subjects: Vec<&str> = Vec::new();
    for verdict in verdicts {
        if !subjects.contains(&verdict.subject.as_str()) {
            subjects.push(&verdict.subject);
        }
    }
    let failures = verdicts.iter().filter(|v| v.violation.is_some()).count();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"observer check {}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\">",
        escape(file),
        verdicts.len()
    );
    for subject in subjects {
        let cases: Vec<&Verdict> = verdicts.iter().filter(|v| v.subject == subject).collect();
        let failed = cases.iter().filter(|v| v.violation.is_some()).count();
        let _ = writeln!(
            out,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failed}\" errors=\"0\" skipped=\"0\" timestamp=\"{}\" file=\"{}\">",
            escape(subject),
            cases.len(),
            format_time(&time),
            escape(file)
        );
        for case in cases {
            let name = match &case.limit {
                serde_json::Value::Null => case.condition.to_owned(),
                limit => format!("{} {limit}", case.condition),
            };
            let head = format!(
                "    <testcase name=\"{}\" classname=\"{}\"",
                escape(&name),
                escape(subject)
            );
            match &case.violation {
                None => {
                    let _ = writeln!(out, "{head}/>");
                }
                Some(text) => {
                    let _ = writeln!(
                        out,
                        "{head}>\n      <failure type=\"{}\" message=\"{}\">{}</failure>\n    </testcase>",
                        case.condition,
                        escape(text),
                        escape(&format!("{subject}: {text}"))
                    );
                }
            }
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::record::Recording;
    use crate::report::check::{Conditions, judge_recording};

    #[test]
    fn one_case_per_condition_and_subject_with_the_violation_as_failure() {
        let path = format!(
            "{}/tests/data/logs/keepalive.jsonl",
            env!("CARGO_MANIFEST_DIR")
        );
        let recording = Recording::read(std::path::Path::new(&path)).unwrap();
        let conditions = Conditions {
            max_skew: Some(1.5),
            min_backends: Some(1),
            ..Conditions::default()
        };
        let (_, verdicts) = judge_recording(&recording, &conditions);
        let time = DateTime::parse_from_rfc3339("2026-08-06T14:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let xml = render_junit("a&b.jsonl", &verdicts, time);
        let lines: Vec<&str> = xml.lines().collect();
        assert_eq!(
            lines[1],
            r#"<testsuites name="observer check a&amp;b.jsonl" tests="5" failures="1" errors="0">"#
        );
        assert_eq!(
            lines[2],
            r#"  <testsuite name="recording" tests="3" failures="0" errors="0" skipped="0" timestamp="2026-08-06T14:00:00.000000Z" file="a&amp;b.jsonl">"#
        );
        assert_eq!(
            lines[3],
            r#"    <testcase name="complete_log" classname="recording"/>"#
        );
        assert_eq!(
            lines[4],
            r#"    <testcase name="max_lost 0" classname="recording"/>"#
        );
        assert_eq!(
            lines[8],
            r#"    <testcase name="min_backends 1" classname="shop/checkout:http"/>"#
        );
        assert_eq!(
            lines[9],
            r#"    <testcase name="max_skew 1.5" classname="shop/checkout:http">"#
        );
        assert!(
            lines[10].starts_with(r#"      <failure type="max_skew" message="skew 3.00 &gt; --max-skew 1.5 (10.244.1.12:8080 got 100% of requests, expected 33%): pinning: "#),
            "{xml}"
        );
        assert_eq!(lines.last(), Some(&"</testsuites>"));
    }

    #[test]
    fn text_is_escaped_and_characters_xml_forbids_are_replaced() {
        assert_eq!(
            escape("a<b>&\"c'\u{1}\td\u{fffe}"),
            "a&lt;b&gt;&amp;&quot;c&apos;?\td?"
        );
    }
}
