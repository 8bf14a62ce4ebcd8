//! The log schema: exact round trips, addresses, times, and reading logs.

use super::*;

const EXAMPLE: &str = r#"{"type":"conn","proto":"tcp","client":"10.244.1.9:45364","client_pod":null,"original_dst":"10.96.35.226:80","backend":"10.244.1.13:3000","backend_pod":null,"service":null,"frontend":null,"endpoint_in_rules":null,"netns":4026532301,"start":"2026-08-06T13:46:36.412345Z","end":"2026-08-06T13:46:40.500000Z","duration_ms":4087.655,"requests":30,"bytes_to_backend":2790,"bytes_from_backend":5400,"close":"fin","connect_ms":null,"start_seen":true}"#;

#[test]
fn conn_line_round_trips_byte_for_byte() {
    let line: LogLine = serde_json::from_str(EXAMPLE).unwrap();
    assert_eq!(serde_json::to_string(&line).unwrap(), EXAMPLE);
}

#[test]
fn lines_without_pods_or_frontend_still_read() {
    let old = EXAMPLE
        .replace(r#""client_pod":null,"#, "")
        .replace(r#""backend_pod":null,"#, "")
        .replace(r#""frontend":null,"#, "");
    assert_ne!(old, EXAMPLE);
    let old: LogLine = serde_json::from_str(&old).unwrap();
    let new: LogLine = serde_json::from_str(EXAMPLE).unwrap();
    assert_eq!(old, new);
}

#[test]
fn pods_and_frontend_round_trip() {
    let line = EXAMPLE
        .replace(r#""client_pod":null"#, r#""client_pod":"shop/client""#)
        .replace(
            r#""backend_pod":null"#,
            r#""backend_pod":"shop/checkout-b""#,
        )
        .replace(r#""frontend":null"#, r#""frontend":"node_port""#);
    let LogLine::Conn(conn) = serde_json::from_str(&line).unwrap() else {
        panic!("not a conn line");
    };
    assert_eq!(conn.client_pod.as_deref(), Some("shop/client"));
    assert_eq!(conn.backend_pod.as_deref(), Some("shop/checkout-b"));
    assert_eq!(conn.frontend, Some(FrontendKind::NodePort));
    for kind in [
        FrontendKind::ClusterIp,
        FrontendKind::NodePort,
        FrontendKind::ExternalIp,
        FrontendKind::LoadBalancer,
    ] {
        assert_eq!(
            serde_json::to_string(&kind).unwrap(),
            format!("\"{}\"", kind.as_str())
        );
    }
    assert_eq!(serde_json::to_string(&LogLine::Conn(conn)).unwrap(), line);
}

#[test]
fn endpoint_pods_are_written_only_when_known() {
    let mut endpoint = EndpointShare {
        addr: "10.244.1.12:8080".parse().unwrap(),
        expected_share: 0.5,
        pod: None,
    };
    let unnamed = r#"{"addr":"10.244.1.12:8080","expected_share":0.5}"#;
    assert_eq!(serde_json::to_string(&endpoint).unwrap(), unnamed);
    endpoint.pod = Some("shop/checkout-a".to_owned());
    let named = r#"{"addr":"10.244.1.12:8080","expected_share":0.5,"pod":"shop/checkout-a"}"#;
    assert_eq!(serde_json::to_string(&endpoint).unwrap(), named);
    let back: EndpointShare = serde_json::from_str(named).unwrap();
    assert_eq!(back, endpoint);
}

#[test]
fn summary_names_the_namespaces_that_lost_connections() {
    let line = r#"{"type":"summary","connections":5,"dnat_events":8,"lost_connections":3,"lost_by_netns":{"4026532301":3},"lost_events":9,"read_errors":0,"started":"2026-08-06T13:46:30.000000Z","ended":"2026-08-06T13:47:30.000000Z"}"#;
    let parsed: LogLine = serde_json::from_str(line).unwrap();
    let LogLine::Summary(summary) = &parsed else {
        panic!("{parsed:?}")
    };
    assert_eq!(summary.lost_by_netns.get("4026532301"), Some(&3));
    assert_eq!(serde_json::to_string(&parsed).unwrap(), line);
    // Nothing lost: no map; a log from before the field existed reads as 0 lost.
    let old = line.replace(
        r#""lost_connections":3,"lost_by_netns":{"4026532301":3},"#,
        "",
    );
    let LogLine::Summary(summary) = serde_json::from_str(&old).unwrap() else {
        panic!("{old}")
    };
    assert_eq!(
        (summary.lost_connections, summary.lost_by_netns.len()),
        (0, 0)
    );
}

/// The log's own time formatting writes what chrono's RFC 3339 does.
#[test]
fn times_are_written_as_chrono_writes_them() {
    let times = [
        "2026-08-06T13:46:36.412345Z",
        "1970-01-01T00:00:00Z",
        "0001-02-03T04:05:06.000007891Z",
        "9999-12-31T23:59:59.999999999Z",
        "+10000-01-01T00:00:00Z",
        "-0001-01-01T00:00:00Z",
    ];
    for text in times {
        let time: DateTime<Utc> = text.parse().unwrap();
        let chrono = time.to_rfc3339_opts(SecondsFormat::Micros, true);
        assert_eq!(format_time(&time), chrono);
        let line = serde_json::to_string(&SummaryRecord {
            blind_spots: Vec::new(),
            started: time,
            ended: time,
            ..Default::default()
        })
        .unwrap();
        assert!(
            line.ends_with(&format!(r#""started":"{chrono}","ended":"{chrono}"}}"#)),
            "{line}"
        );
    }
    let leap = chrono::NaiveDate::from_ymd_opt(2016, 12, 31)
        .unwrap()
        .and_hms_nano_opt(23, 59, 59, 1_500_000_000)
        .unwrap()
        .and_utc();
    assert_eq!(
        format_time(&leap),
        leap.to_rfc3339_opts(SecondsFormat::Micros, true)
    );
}

#[test]
fn ipv6_endpoints_are_bracketed() {
    let addr: SocketAddr = "[fd00::1]:80".parse().unwrap();
    assert_eq!(serde_json::to_string(&addr).unwrap(), "\"[fd00::1]:80\"");
}

#[test]
fn parse_errors_name_the_line() {
    let text = format!("{EXAMPLE}\n{{\"type\":\"conn\"\n");
    let err = Recording::parse("x.jsonl", &text).unwrap_err();
    assert!(err.to_string().starts_with("x.jsonl:2: "), "{err}");
}

#[test]
fn a_cut_last_line_is_read_up_to_it() {
    let whole = format!("{EXAMPLE}\n{EXAMPLE}\n");
    // Cut inside the third line, and inside a multi-byte character.
    let cut = format!("{whole}{}", &EXAMPLE[..40]);
    let recording = Recording::parse("x.jsonl", &cut).unwrap();
    assert_eq!((recording.conns.len(), recording.cut), (2, Some(3)));
    assert_eq!(
        recording.cut_warning("x.jsonl").unwrap(),
        "x.jsonl:3: the log was cut at line 3 (observer did not exit cleanly): read up to the line before it; counts are incomplete"
    );
    let mut bytes = whole.clone().into_bytes();
    bytes.extend_from_slice(&"{\"service\":\"é".as_bytes()[..13]);
    let recording = Recording::parse_bytes("x.jsonl", &bytes).unwrap();
    assert_eq!((recording.conns.len(), recording.cut), (2, Some(3)));
    // A complete log is not cut; a bad line with its newline is corruption.
    assert_eq!(Recording::parse("x.jsonl", &whole).unwrap().cut, None);
    let err = Recording::parse("x.jsonl", &format!("{whole}{{\"type\"\n")).unwrap_err();
    assert!(err.to_string().starts_with("x.jsonl:3: "), "{err}");
    // Only a cut line: nothing to read, but not an error.
    let recording = Recording::parse("x.jsonl", &EXAMPLE[..40]).unwrap();
    assert_eq!((recording.conns.len(), recording.cut), (0, Some(1)));
}

#[test]
fn empty_file_is_an_error() {
    let err = Recording::parse("e.jsonl", "\n").unwrap_err();
    assert!(matches!(err, ReadError::Empty { .. }));
}
