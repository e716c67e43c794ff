//! The metrics endpoint's bytes, without I/O: the HTTP request parser and
//! the Prometheus text renderer (format version 0.0.4).
//!
//! Owns: what a request to `--metrics` may look like ([`parse_request`]:
//! one `GET` request head of `/metrics`, `/keys?top=N&by=waiting|age` or
//! `/keys/<percent-encoded key>`, bounded in size, strictly checked,
//! decided as soon as the bytes allow), the responses ([`response`],
//! [`json_response`]), and the names, help texts and types of every
//! metric ([`render`]). The contention view's JSON is keys_json.rs's.
//!
//! Run by the metrics thread (metrics.rs); pure functions, unit-tested here.
//!
//! Never does: I/O, allocation proportional to the input, or trusting a
//! byte of the request.

use std::fmt::Write as _;

use crate::protocol::{ANSWER_KINDS, AnswerKind, KNOWN_REASONS, Key, OPS};
use crate::server::core::contention::{By, MAX_TOP};
use crate::server::core::counters::{BUCKETS_US, LatencySnapshot, REASONS, Snapshot};

/// The longest request head taken (request line and headers).
pub const MAX_REQUEST_BYTES: usize = 8192;
/// The most header lines taken.
pub const MAX_HEADERS: usize = 64;
/// The longest method and request target taken.
const MAX_METHOD: usize = 16;
const MAX_TARGET: usize = 2048;
/// The Prometheus path.
pub const PATH: &[u8] = b"/metrics";
/// The contention view's list (`/keys?top=N&by=waiting|age`).
pub const KEYS_PATH: &[u8] = b"/keys";
/// The contention view of one key (`/keys/<percent-encoded key>`).
pub const KEY_PREFIX: &[u8] = b"/keys/";
/// Keys `/keys` lists when `top` is not given.
pub const DEFAULT_TOP: usize = 20;

/// How a request is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    BadRequest,
    NotFound,
    MethodNotAllowed,
    /// The head is over [`MAX_REQUEST_BYTES`] or [`MAX_HEADERS`].
    TooLarge,
    /// No snapshot of the figures could be had in time.
    Unavailable,
}

impl Status {
    fn line(self) -> &'static str {
        match self {
            Status::Ok => "200 OK",
            Status::BadRequest => "400 Bad Request",
            Status::NotFound => "404 Not Found",
            Status::MethodNotAllowed => "405 Method Not Allowed",
            Status::TooLarge => "431 Request Header Fields Too Large",
            Status::Unavailable => "503 Service Unavailable",
        }
    }
}

/// What a valid request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /metrics` (any query).
    Metrics,
    /// `GET /keys?top=N&by=waiting|age` (both optional).
    Keys { top: usize, by: By },
    /// `GET /keys/<key>`.
    Key(Key),
}

/// What the bytes read so far amount to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Nothing wrong yet, but the head is not complete.
    Incomplete,
    /// A complete, valid request.
    Get(Route),
    /// Answer this status and close.
    Reject(Status),
}

/// Parse the bytes of a connection so far. Decides as early as it can: a
/// bad request line is refused before its headers arrive.
pub fn parse_request(buf: &[u8]) -> Parsed {
    let mut lines = buf.split_inclusive(|&b| b == b'\n');
    let Some(first) = lines.next() else {
        return Parsed::Incomplete;
    };
    let Some(first) = complete_line(first) else {
        return incomplete(buf);
    };
    let (http11, route) = match request_line(first) {
        Ok(line) => line,
        Err(status) => return Parsed::Reject(status),
    };
    let mut hosts = 0;
    for (n, line) in lines.enumerate() {
        let Some(line) = complete_line(line) else {
            return incomplete(buf);
        };
        if line.is_empty() {
            if http11 && hosts != 1 {
                return Parsed::Reject(Status::BadRequest);
            }
            return Parsed::Get(route);
        }
        if n >= MAX_HEADERS {
            return Parsed::Reject(Status::TooLarge);
        }
        match header(line) {
            Ok(Header::Host) => hosts += 1,
            Ok(Header::Other) => {}
            Err(status) => return Parsed::Reject(status),
        }
    }
    incomplete(buf)
}

/// A head not complete yet: still acceptable so far?
fn incomplete(buf: &[u8]) -> Parsed {
    if buf.len() >= MAX_REQUEST_BYTES {
        return Parsed::Reject(Status::TooLarge);
    }
    // The unfinished last line may hold no byte a head never has.
    let tail_start = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let tail = &buf[tail_start..];
    let bad = tail
        .iter()
        .enumerate()
        .any(|(i, &b)| forbidden(b) || (b == b'\r' && i + 1 < tail.len()));
    if bad {
        Parsed::Reject(Status::BadRequest)
    } else {
        Parsed::Incomplete
    }
}

/// A byte no request head may hold (controls but tab, CR and LF; DEL).
fn forbidden(b: u8) -> bool {
    (b < 0x20 && b != b'\t' && b != b'\r' && b != b'\n') || b == 0x7f
}

/// `line` without its LF (or CRLF), if it has one. A CR elsewhere is left
/// in, for the checks to refuse.
fn complete_line(line: &[u8]) -> Option<&[u8]> {
    let line = line.strip_suffix(b"\n")?;
    Some(line.strip_suffix(b"\r").unwrap_or(line))
}

/// A token character (RFC 9110 `tchar`).
fn tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// `METHOD SP TARGET SP HTTP/1.x`: whether it is HTTP/1.1 and what it
/// asks for, or the status.
fn request_line(line: &[u8]) -> Result<(bool, Route), Status> {
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Status::BadRequest);
    };
    let method_ok =
        !method.is_empty() && method.len() <= MAX_METHOD && method.iter().all(|&b| tchar(b));
    let target_ok = target.first() == Some(&b'/')
        && target.len() <= MAX_TARGET
        && target.iter().all(|&b| (0x21..0x7f).contains(&b));
    let http11 = match version {
        b"HTTP/1.1" => true,
        b"HTTP/1.0" => false,
        _ => return Err(Status::BadRequest),
    };
    if !method_ok || !target_ok {
        return Err(Status::BadRequest);
    }
    if method != b"GET" {
        return Err(Status::MethodNotAllowed);
    }
    Ok((http11, route(target)?))
}

/// What a request target asks for.
fn route(target: &[u8]) -> Result<Route, Status> {
    let (path, query) = match target.iter().position(|&b| b == b'?') {
        Some(at) => (&target[..at], Some(&target[at + 1..])),
        None => (target, None),
    };
    if path == PATH {
        return Ok(Route::Metrics);
    }
    if path == KEYS_PATH {
        return keys_query(query.unwrap_or(b""));
    }
    let Some(encoded) = path.strip_prefix(KEY_PREFIX) else {
        return Err(Status::NotFound);
    };
    if query.is_some() {
        return Err(Status::BadRequest);
    }
    let bytes = percent_decode(encoded).ok_or(Status::BadRequest)?;
    Key::new(&bytes)
        .map(Route::Key)
        .map_err(|_| Status::BadRequest)
}

/// `top=N&by=waiting|age`, each at most once, in any order, both optional;
/// nothing else. N is 1 to [`MAX_TOP`], in at most four digits.
fn keys_query(query: &[u8]) -> Result<Route, Status> {
    let (mut top, mut by) = (None, None);
    if !query.is_empty() {
        for pair in query.split(|&b| b == b'&') {
            let (name, value) = match pair.iter().position(|&b| b == b'=') {
                Some(at) => (&pair[..at], &pair[at + 1..]),
                None => return Err(Status::BadRequest),
            };
            match name {
                b"top" if top.is_none() => {
                    let digits = !value.is_empty()
                        && value.len() <= 4
                        && value.iter().all(u8::is_ascii_digit);
                    let n = value
                        .iter()
                        .fold(0usize, |n, &d| n * 10 + usize::from(d - b'0'));
                    if !digits || !(1..=MAX_TOP).contains(&n) {
                        return Err(Status::BadRequest);
                    }
                    top = Some(n);
                }
                b"by" if by.is_none() => {
                    by = Some(match value {
                        b"waiting" => By::Waiting,
                        b"age" => By::Age,
                        _ => return Err(Status::BadRequest),
                    });
                }
                _ => return Err(Status::BadRequest),
            }
        }
    }
    Ok(Route::Keys {
        top: top.unwrap_or(DEFAULT_TOP),
        by: by.unwrap_or(By::Waiting),
    })
}

/// `%XX` (hex, either case) as the byte XX, every other byte as itself;
/// None for a `%` not followed by two hex digits.
pub fn percent_decode(encoded: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(encoded.len());
    let mut i = 0;
    while i < encoded.len() {
        if encoded[i] == b'%' {
            let hex = encoded.get(i + 1..i + 3)?;
            let digit = |b: u8| (b as char).to_digit(16);
            out.push((digit(hex[0])? * 16 + digit(hex[1])?) as u8);
            i += 3;
        } else {
            out.push(encoded[i]);
            i += 1;
        }
    }
    Some(out)
}

enum Header {
    Host,
    Other,
}

/// `name: value`. No folded lines; no request body.
fn header(line: &[u8]) -> Result<Header, Status> {
    let colon = line
        .iter()
        .position(|&b| b == b':')
        .ok_or(Status::BadRequest)?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    if name.is_empty() || !name.iter().all(|&b| tchar(b)) {
        return Err(Status::BadRequest);
    }
    if !value
        .iter()
        .all(|&b| b == b'\t' || b == b' ' || (0x21..0x7f).contains(&b) || b >= 0x80)
    {
        return Err(Status::BadRequest);
    }
    let value = value.trim_ascii();
    if name.eq_ignore_ascii_case(b"host") {
        return Ok(Header::Host);
    }
    if name.eq_ignore_ascii_case(b"transfer-encoding")
        || (name.eq_ignore_ascii_case(b"content-length") && value != b"0")
    {
        return Err(Status::BadRequest);
    }
    Ok(Header::Other)
}

/// A whole response: status line, headers, `body`; the connection closes
/// after it.
pub fn response(status: Status, body: &str) -> Vec<u8> {
    let content_type = match status {
        Status::Ok => "text/plain; version=0.0.4; charset=utf-8",
        _ => "text/plain; charset=utf-8",
    };
    let allow = match status {
        Status::MethodNotAllowed => "Allow: GET\r\n",
        _ => "",
    };
    let mut out = format!(
        "HTTP/1.1 {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        status.line(),
        body.len()
    );
    out.push_str(body);
    out.into_bytes()
}

/// A whole JSON response (`application/json`): status line, headers,
/// `body`; the connection closes after it.
pub fn json_response(status: Status, body: &str) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        status.line(),
        body.len()
    );
    out.push_str(body);
    out.into_bytes()
}

/// The short body of an error response.
pub fn error_body(status: Status) -> String {
    format!("{}\n", status.line())
}

/// Every metric, in the text format. `io_refusals` and `conns` are read by
/// the metrics thread itself (the I/O loops' counters); the rest is the
/// lock owner's snapshot.
pub fn render(snap: &Snapshot, io_refusals: &[u64; REASONS], conns: u64) -> String {
    let mut out = String::with_capacity(8192);
    render_state(&mut out, snap, conns);
    render_cluster(&mut out, snap);
    render_counts(&mut out, snap, io_refusals);
    render_latencies(&mut out, snap);
    out
}

/// What the node holds and serves now: its role, keys, holders, waiters,
/// connections and watches.
fn render_state(o: &mut String, snap: &Snapshot, conns: u64) {
    family(
        o,
        "baton_role",
        "gauge",
        "1 for the role this node has now: active (serving, or handing the role over) or standby.",
    );
    sample(o, "baton_role", &[("role", "active")], snap.active as u64);
    sample(o, "baton_role", &[("role", "standby")], !snap.active as u64);
    gauge(
        o,
        "baton_handing_off",
        "1 while this node hands the active role over to another.",
        snap.handing_off as u64,
    );
    gauge(o, "baton_held_keys", "Keys held now.", snap.held);
    gauge(
        o,
        "baton_holders",
        "Grants held now (every holder of a semaphore counts).",
        snap.holders,
    );
    gauge(
        o,
        "baton_waiting_requests",
        "Acquires waiting in line now.",
        snap.waiting,
    );
    gauge(o, "baton_connections", "Open client connections.", conns);
    gauge(
        o,
        "baton_watches",
        "Watched (connection, key) pairs now (W).",
        snap.watches,
    );
    counter(
        o,
        "baton_watch_lines_total",
        "W lines written: answers to W and changes of watched keys.",
        snap.watch_lines,
    );
    counter(
        o,
        "baton_watch_lines_skipped_total",
        "Change lines a slow watcher never got: a newer state replaced them before they were written.",
        snap.watch_lines_skipped,
    );
}

/// Tokens and replication: the last token and the ceiling, a standby's
/// lag, the active's synced standbys.
fn render_cluster(o: &mut String, snap: &Snapshot) {
    gauge(
        o,
        "baton_last_token",
        "The largest fencing token this node knows of.",
        snap.last_token,
    );
    gauge(
        o,
        "baton_token_ceiling",
        "No token above this has been issued (the replicated ceiling, or the largest token known).",
        snap.ceiling,
    );
    family(
        o,
        "baton_replication_lag_seconds",
        "gauge",
        "On a standby, time since it last heard from its active; 0 on an active.",
    );
    seconds_sample(
        o,
        "baton_replication_lag_seconds",
        &[],
        snap.lag_ms.saturating_mul(1000),
    );
    gauge(
        o,
        "baton_standbys",
        "Live standbys that hold this node's full state (0 on a standby).",
        snap.standbys,
    );
}

/// The counters: requests by op, answers by kind, refusals by reason,
/// grants, hand-offs, expiries, timeouts, role changes.
fn render_counts(o: &mut String, snap: &Snapshot, io_refusals: &[u64; REASONS]) {
    family(
        o,
        "baton_requests_total",
        "counter",
        "Requests, by op (refused ones included).",
    );
    for spec in OPS {
        let n = snap.requests[spec.op.index()];
        sample(o, "baton_requests_total", &[("op", spec.label)], n);
    }
    family(
        o,
        "baton_answers_total",
        "counter",
        "Answers sent, by kind (the I/O loops' own errors included).",
    );
    let io_errors: u64 = io_refusals.iter().fold(0u64, |a, &b| a.saturating_add(b));
    for spec in ANSWER_KINDS {
        let mut n = snap.answers[spec.kind.index()];
        if spec.kind == AnswerKind::Error {
            n = n.saturating_add(io_errors);
        }
        sample(o, "baton_answers_total", &[("kind", spec.label)], n);
    }
    family(
        o,
        "baton_refusals_total",
        "counter",
        "Error answers (E), by reason.",
    );
    for (i, reason) in KNOWN_REASONS.iter().enumerate() {
        let n = snap.refusals[i].saturating_add(io_refusals[i]);
        sample(o, "baton_refusals_total", &[("reason", reason.as_str())], n);
    }
    counter(
        o,
        "baton_grants_total",
        "Grants made, at once or to a waiter.",
        snap.grants,
    );
    counter(
        o,
        "baton_handoffs_total",
        "Grants to the next waiter after a release or a lease expiry.",
        snap.handoffs,
    );
    counter(
        o,
        "baton_lease_expiries_total",
        "Leases that ran out (on a standby: mirrored leases).",
        snap.expiries,
    );
    counter(
        o,
        "baton_wait_timeouts_total",
        "Acquires whose wait ran out (T).",
        snap.timeouts,
    );
    counter(
        o,
        "baton_role_changes_total",
        "Changes between active and standby.",
        snap.role_changes,
    );
}

/// The latency histograms: grant wait, hand-off, expiry lateness.
fn render_latencies(o: &mut String, snap: &Snapshot) {
    histogram(
        o,
        "baton_grant_wait_seconds",
        "Acquire request to grant (millisecond resolution).",
        &snap.grant_wait,
    );
    histogram(
        o,
        "baton_handoff_seconds",
        "Release read, or lease deadline, to the next holder's grant leaving the lock owner.",
        &snap.handoff,
    );
    histogram(
        o,
        "baton_expiry_lateness_seconds",
        "Lease deadline to the lease being reclaimed (millisecond resolution).",
        &snap.expiry_lateness,
    );
}

fn family(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}");
    let _ = writeln!(o, "# TYPE {name} {kind}");
}

fn gauge(o: &mut String, name: &str, help: &str, value: u64) {
    family(o, name, "gauge", help);
    sample(o, name, &[], value);
}

fn counter(o: &mut String, name: &str, help: &str, value: u64) {
    family(o, name, "counter", help);
    sample(o, name, &[], value);
}

fn labels(o: &mut String, labels: &[(&str, &str)]) {
    if labels.is_empty() {
        return;
    }
    o.push('{');
    for (i, (name, value)) in labels.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        // Label values here are fixed names: no quote, backslash or newline.
        let _ = write!(o, "{name}=\"{value}\"");
    }
    o.push('}');
}

fn sample(o: &mut String, name: &str, l: &[(&str, &str)], value: u64) {
    o.push_str(name);
    labels(o, l);
    let _ = writeln!(o, " {value}");
}

/// A sample in seconds, from microseconds, written exactly.
fn seconds_sample(o: &mut String, name: &str, l: &[(&str, &str)], us: u64) {
    o.push_str(name);
    labels(o, l);
    let _ = writeln!(o, " {}.{:06}", us / 1_000_000, us % 1_000_000);
}

fn histogram(o: &mut String, name: &str, help: &str, h: &LatencySnapshot) {
    family(o, name, "histogram", help);
    let bucket = format!("{name}_bucket");
    for (count, (_, le)) in h.le.iter().zip(BUCKETS_US) {
        sample(o, &bucket, &[("le", le)], *count);
    }
    sample(o, &bucket, &[("le", "+Inf")], h.count);
    seconds_sample(o, &format!("{name}_sum"), &[], h.sum_us);
    sample(o, &format!("{name}_count"), &[], h.count);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Parsed {
        parse_request(s.as_bytes())
    }

    const OK: &str = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";

    #[test]
    fn a_plain_get_of_metrics_is_taken_with_crlf_or_lf() {
        assert_eq!(p(OK), Parsed::Get(Route::Metrics));
        assert_eq!(
            p("GET /metrics HTTP/1.0\r\n\r\n"),
            Parsed::Get(Route::Metrics)
        );
        assert_eq!(p("GET /metrics HTTP/1.0\n\n"), Parsed::Get(Route::Metrics));
        assert_eq!(
            p(
                "GET /metrics?x=1 HTTP/1.1\r\nHost: a:1\r\nAccept: */*\r\nUser-Agent: Prometheus/2\r\n\r\n"
            ),
            Parsed::Get(Route::Metrics)
        );
        assert_eq!(
            p("GET /metrics HTTP/1.1\r\nhost:x\r\nContent-Length: 0\r\n\r\n"),
            Parsed::Get(Route::Metrics)
        );
        // What follows the head is not looked at (the connection closes).
        assert_eq!(
            p("GET /metrics HTTP/1.0\r\n\r\nGARBAGE"),
            Parsed::Get(Route::Metrics)
        );
    }

    #[test]
    fn every_prefix_of_a_good_request_is_incomplete() {
        for n in 0..OK.len() {
            assert_eq!(
                p(&OK[..n]),
                Parsed::Incomplete,
                "prefix {n}: {:?}",
                &OK[..n]
            );
        }
    }

    #[test]
    fn malformed_request_lines_are_400_as_soon_as_the_line_ends() {
        for bad in [
            "garbage\r\n",
            "\r\n",
            "GET\r\n",
            "GET /metrics\r\n",
            "GET  /metrics HTTP/1.1\r\n",
            "GET /metrics HTTP/1.1 x\r\n",
            "GET /metrics HTTP/2.0\r\n",
            "GET /metrics http/1.1\r\n",
            "GET metrics HTTP/1.1\r\n",
            "GET /met\x01rics HTTP/1.1\r\n",
            "GET /metrics\tHTTP/1.1\r\n",
            "G(T /metrics HTTP/1.1\r\n",
            "GETGETGETGETGETGETGET /metrics HTTP/1.1\r\n",
            "GET /metrics HTTP/1.1\r\r\n",
            "GET /me\rtrics HTTP/1.1\r\n",
        ] {
            assert_eq!(p(bad), Parsed::Reject(Status::BadRequest), "{bad:?}");
        }
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(MAX_TARGET));
        assert_eq!(p(&long), Parsed::Reject(Status::BadRequest));
    }

    #[test]
    fn other_methods_are_405_and_other_paths_404() {
        for m in ["POST", "HEAD", "PUT", "DELETE", "get", "OPTIONS"] {
            let req = format!("{m} /metrics HTTP/1.1\r\n");
            assert_eq!(p(&req), Parsed::Reject(Status::MethodNotAllowed), "{m}");
        }
        for path in [
            "/",
            "/metrics/",
            "/metricsx",
            "/Metrics",
            "/metrics#x",
            "/other?/metrics",
        ] {
            let req = format!("GET {path} HTTP/1.1\r\n");
            assert_eq!(p(&req), Parsed::Reject(Status::NotFound), "{path}");
        }
    }

    fn get(target: &str) -> Parsed {
        p(&format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n"))
    }

    fn keys(top: usize, by: By) -> Parsed {
        Parsed::Get(Route::Keys { top, by })
    }

    #[test]
    fn the_keys_list_takes_top_and_by_in_any_order_with_defaults() {
        assert_eq!(get("/keys"), keys(DEFAULT_TOP, By::Waiting));
        assert_eq!(get("/keys?"), keys(DEFAULT_TOP, By::Waiting));
        assert_eq!(get("/keys?top=5"), keys(5, By::Waiting));
        assert_eq!(get("/keys?by=age"), keys(DEFAULT_TOP, By::Age));
        assert_eq!(get("/keys?by=age&top=1000"), keys(1000, By::Age));
        assert_eq!(get("/keys?top=0001&by=waiting"), keys(1, By::Waiting));
        for bad in [
            "/keys?top=0",
            "/keys?top=1001",
            "/keys?top=99999",
            "/keys?top=",
            "/keys?top=-1",
            "/keys?top=+5",
            "/keys?top=5x",
            "/keys?top=junk",
            "/keys?top=5&top=6",
            "/keys?by=",
            "/keys?by=size",
            "/keys?by=AGE",
            "/keys?by=age&by=age",
            "/keys?top",
            "/keys?top=5&",
            "/keys?&top=5",
            "/keys?other=1",
            "/keys?top=5;by=age",
        ] {
            assert_eq!(get(bad), Parsed::Reject(Status::BadRequest), "{bad}");
        }
        for missing in ["/key", "/keysx", "/Keys", "/keys#x"] {
            assert_eq!(get(missing), Parsed::Reject(Status::NotFound), "{missing}");
        }
    }

    #[test]
    fn a_key_is_percent_decoded_and_checked_as_the_lock_port_checks_it() {
        let key = |s: &[u8]| Parsed::Get(Route::Key(Key::new(s).expect("key")));
        assert_eq!(get("/keys/jobs"), key(b"jobs"));
        assert_eq!(get("/keys/a/b"), key(b"a/b"));
        assert_eq!(get("/keys/%61%2f%3F"), key(b"a/?"));
        assert_eq!(get("/keys/caf%C3%A9"), key("caf\u{e9}".as_bytes()));
        assert_eq!(get("/keys/%fe%21%FF"), key(b"\xfe!\xff"));
        let longest = "k".repeat(crate::protocol::MAX_KEY);
        assert_eq!(get(&format!("/keys/{longest}")), key(longest.as_bytes()));
        for bad in [
            "/keys/",
            "/keys/%",
            "/keys/%4",
            "/keys/%G1",
            "/keys/%%41",
            "/keys/a%20b",
            "/keys/%00",
            "/keys/%0a",
            "/keys/%7f",
            "/keys/%7F%41",
            "/keys/k?x=1",
            "/keys/k?",
        ] {
            assert_eq!(get(bad), Parsed::Reject(Status::BadRequest), "{bad}");
        }
        let too_long = "k".repeat(crate::protocol::MAX_KEY + 1);
        assert_eq!(
            get(&format!("/keys/{too_long}")),
            Parsed::Reject(Status::BadRequest)
        );
        // Other methods are 405 on every path.
        assert_eq!(
            p("DELETE /keys/k HTTP/1.1\r\n"),
            Parsed::Reject(Status::MethodNotAllowed)
        );
        assert_eq!(
            p("POST /keys?top=5 HTTP/1.1\r\n"),
            Parsed::Reject(Status::MethodNotAllowed)
        );
    }

    #[test]
    fn malformed_headers_are_400() {
        for bad in [
            "GET /metrics HTTP/1.1\r\nHost x\r\n\r\n",
            "GET /metrics HTTP/1.1\r\n: x\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nHo st: x\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nHost: x\x00y\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nHost: x\ry\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
            "GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            // HTTP/1.1 needs exactly one Host.
            "GET /metrics HTTP/1.1\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        ] {
            assert_eq!(p(bad), Parsed::Reject(Status::BadRequest), "{bad:?}");
        }
        // A forbidden byte is refused before its line ends.
        assert_eq!(
            p("GET /metrics HTTP/1.1\r\nX: \x00"),
            Parsed::Reject(Status::BadRequest)
        );
        assert_eq!(p("GET /me\x07"), Parsed::Reject(Status::BadRequest));
    }

    #[test]
    fn a_head_too_long_or_with_too_many_headers_is_431() {
        let long = format!(
            "GET /metrics HTTP/1.1\r\nX: {}",
            "a".repeat(MAX_REQUEST_BYTES)
        );
        assert_eq!(p(&long), Parsed::Reject(Status::TooLarge));
        let no_newline = "a".repeat(MAX_REQUEST_BYTES);
        assert_eq!(p(&no_newline), Parsed::Reject(Status::TooLarge));
        let many = format!(
            "GET /metrics HTTP/1.1\r\n{}\r\n",
            "X: y\r\n".repeat(MAX_HEADERS + 1)
        );
        assert_eq!(p(&many), Parsed::Reject(Status::TooLarge));
    }

    #[test]
    fn random_heads_never_panic_and_a_decision_never_changes_as_bytes_come() {
        // Pieces of good and bad heads, glued at random (xorshift, fixed seed).
        const PIECES: [&[u8]; 16] = [
            b"GET",
            b" ",
            b"/metrics",
            b" HTTP/1.1",
            b"\r\n",
            b"\n",
            b"Host: x",
            b":",
            b"\r",
            b"\x00",
            b"\xff",
            b"POST",
            b"/",
            b"a",
            b"\t",
            b"HTTP/1.0",
        ];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let mut head = Vec::new();
            let n = next() % 12;
            for _ in 0..n {
                head.extend_from_slice(PIECES[(next() % 16) as usize]);
            }
            let whole = parse_request(&head);
            for cut in 0..head.len() {
                match parse_request(&head[..cut]) {
                    Parsed::Incomplete => {}
                    decided => assert_eq!(decided, whole, "{:?} then {:?}", &head[..cut], head),
                }
            }
        }
    }

    #[test]
    fn responses_have_a_length_and_close() {
        let r = String::from_utf8(response(Status::MethodNotAllowed, "no\n")).expect("utf8");
        assert!(r.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{r}");
        assert!(r.contains("\r\nAllow: GET\r\n"));
        assert!(r.contains("\r\nContent-Length: 3\r\n"));
        assert!(r.contains("\r\nConnection: close\r\n"));
        assert!(r.ends_with("\r\n\r\nno\n"));
        let ok = String::from_utf8(response(Status::Ok, "")).expect("utf8");
        assert!(ok.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
    }

    #[test]
    fn the_rendering_is_well_formed_text_format() {
        let mut snap = Snapshot {
            active: true,
            held: 3,
            holders: 5,
            lag_ms: 1_234,
            ..Snapshot::default()
        };
        snap.grant_wait.le = [1; BUCKETS_US.len()];
        snap.grant_wait.count = 2;
        snap.grant_wait.sum_us = 1_500_000;
        snap.refusals[0] = 4;
        let mut io = [0; REASONS];
        io[0] = 1;
        let text = render(&snap, &io, 7);
        let mut seen_types = std::collections::HashSet::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                current = rest.split(' ').next().expect("name").to_string();
                assert!(current.starts_with("baton_"), "{line}");
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut f = rest.split(' ');
                assert_eq!(f.next(), Some(current.as_str()), "TYPE after its HELP");
                assert!(matches!(f.next(), Some("gauge" | "counter" | "histogram")));
                assert!(
                    seen_types.insert(current.clone()),
                    "one TYPE per family: {line}"
                );
                continue;
            }
            let (name, value) = line.rsplit_once(' ').expect("name value");
            let bare = name.split('{').next().expect("name");
            assert!(bare.starts_with(&current), "{line} belongs to {current}");
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
        assert!(text.contains("baton_role{role=\"active\"} 1\n"));
        assert!(text.contains("baton_role{role=\"standby\"} 0\n"));
        assert!(text.contains("baton_held_keys 3\n"));
        assert!(text.contains("baton_holders 5\n"));
        assert!(text.contains("baton_connections 7\n"));
        assert!(text.contains("baton_replication_lag_seconds 1.234000\n"));
        assert!(text.contains("baton_refusals_total{reason=\"bad-key\"} 5\n"));
        assert!(text.contains("baton_answers_total{kind=\"error\"} 1\n"));
        assert!(text.contains("baton_grant_wait_seconds_bucket{le=\"0.0001\"} 1\n"));
        assert!(text.contains("baton_grant_wait_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(text.contains("baton_grant_wait_seconds_sum 1.500000\n"));
        assert!(text.contains("baton_grant_wait_seconds_count 2\n"));
        assert!(text.ends_with('\n'));
    }
}
