//! `baton top`: who holds, who waits, live. Reads each node's metrics port
//! (`batond --metrics`): `/metrics` for its role, grants, handoffs and
//! expiries per second and the grant-wait p99 (over the last interval),
//! and `/keys` for the contended keys (the active's) with their holders,
//! values, time held, lease left, waiters and oldest wait.
//!
//! Owns: the three outputs — the full-screen view (crossterm: raw mode and
//! the alternate screen, redrawn every `--interval`; keys `q`/Esc/Ctrl+C
//! quit, `w`/`a` sort by waiting / oldest wait), `--once` (one snapshot as
//! a plain table) and `--json` — and the small HTTP GET client they share
//! (std::net; the metrics port is plain HTTP, one request per connection).
//! Rates need two samples: `--once` and `--json` take them one interval
//! apart. The terminal is restored on every way out: quitting, Ctrl+C (a
//! key in raw mode), SIGINT/SIGTERM/SIGHUP (a flag the loop looks at every
//! 100 ms), an error, and a panic (a hook, since release builds abort).
//!
//! Never does: talk to the lock port, or change anything on a node.

use std::io::{self, IsTerminal, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use crossterm::{cursor, queue, style, terminal};
use serde_json::{Value as Json, json};

use crate::EXIT_ERROR;
use crate::args::{TopArgs, TopOutput};

/// How long one node has to accept a connection, and then to answer.
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);
/// The most keys `--once` and `--json` ask for (the endpoint's maximum).
const ALL_KEYS: usize = 1000;
/// The most holders shown per key on the screen and in the table.
const HOLDERS_SHOWN: usize = 5;

/// Set by SIGINT, SIGTERM or SIGHUP: the screen is restored and top exits.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Run `baton top`; the exit code.
pub fn top(args: &TopArgs) -> u8 {
    let mut by_age = args.by_age;
    match args.output {
        TopOutput::Screen => match screen(args, &mut by_age) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("baton: top: {e}");
                EXIT_ERROR
            }
        },
        output => {
            let first = samples(&args.metrics);
            std::thread::sleep(args.interval);
            let view = gather(&args.metrics, &first, by_age, ALL_KEYS);
            if view.nodes.iter().all(|n| n.error.is_some()) {
                for node in &view.nodes {
                    eprintln!(
                        "baton: top: {}: {}",
                        node.addr,
                        node.error.as_deref().unwrap_or("")
                    );
                }
                return EXIT_ERROR;
            }
            let text = match output {
                TopOutput::Json => format!("{}\n", view.to_json()),
                _ => view.lines(usize::MAX, usize::MAX, false).join("\n") + "\n",
            };
            let mut stdout = io::stdout().lock();
            match stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
            {
                Ok(()) => 0,
                Err(_) => EXIT_ERROR,
            }
        }
    }
}

/// The full-screen view, until `q`, Ctrl+C or a signal.
fn screen(args: &TopArgs, by_age: &mut bool) -> io::Result<()> {
    if !io::stdout().is_terminal() {
        return Err(io::Error::other(
            "stdout is not a terminal: use --once (a table) or --json",
        ));
    }
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let _screen = Screen::enter()?;
    let mut last = samples(&args.metrics);
    let mut view: Option<View>;
    loop {
        let (width, height) = terminal::size()?;
        let fresh = gather(&args.metrics, &last, *by_age, usize::from(height).max(10));
        last = fresh.nodes.iter().map(|n| n.sample.clone()).collect();
        draw(&fresh, width, height)?;
        view = Some(fresh);
        let next = Instant::now() + args.interval;
        loop {
            if STOP.load(Ordering::SeqCst) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= next {
                break;
            }
            if !event::poll((next - now).min(Duration::from_millis(100)))? {
                continue;
            }
            match event::read()? {
                Event::Key(key) if key.kind != KeyEventKind::Release => match key.code {
                    KeyCode::Char('q') | KeyCode::Char('Q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                        return Ok(());
                    }
                    KeyCode::Char('w') => {
                        *by_age = false;
                        break;
                    }
                    KeyCode::Char('a') => {
                        *by_age = true;
                        break;
                    }
                    _ => {}
                },
                Event::Resize(width, height) => {
                    if let Some(view) = &view {
                        draw(view, width, height)?;
                    }
                }
                _ => {}
            }
        }
    }
}

/// The terminal in raw mode on the alternate screen, cursor hidden, until
/// dropped (or a panic, whose hook restores it first).
struct Screen;

impl Screen {
    fn enter() -> io::Result<Screen> {
        terminal::enable_raw_mode()?;
        let screen = Screen;
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            hook(info);
        }));
        let mut out = io::stdout();
        queue!(out, terminal::EnterAlternateScreen, cursor::Hide)?;
        out.flush()?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore();
    }
}

fn restore() {
    let mut out = io::stdout();
    let _ = queue!(out, cursor::Show, terminal::LeaveAlternateScreen);
    let _ = out.flush();
    let _ = terminal::disable_raw_mode();
}

fn draw(view: &View, width: u16, height: u16) -> io::Result<()> {
    let mut out = io::stdout().lock();
    queue!(out, terminal::Clear(terminal::ClearType::All))?;
    for (row, line) in view
        .lines(usize::from(width), usize::from(height), true)
        .iter()
        .enumerate()
    {
        queue!(out, cursor::MoveTo(0, row as u16), style::Print(line))?;
    }
    out.flush()
}

/// One read of a node's `/metrics`: the figures top shows.
#[derive(Clone, Debug, Default)]
struct Sample {
    at: Option<Instant>,
    active: bool,
    grants: f64,
    handoffs: f64,
    expiries: f64,
    /// `baton_grant_wait_seconds_bucket`: (le in seconds, count), in order.
    wait: Vec<(f64, f64)>,
}

/// A node as the view shows it.
#[derive(Debug)]
struct NodeRow {
    addr: String,
    sample: Option<Sample>,
    role: Option<String>,
    node: Option<String>,
    error: Option<String>,
    /// Per second over the last interval: grants, handoffs, expiries.
    rates: Option<[f64; 3]>,
    /// The grant-wait p99 over the last interval, as its bucket's bound
    /// in ms (None: no grant in it).
    p99_ms: Option<f64>,
    keys: Option<Json>,
}

/// One refresh: every node, and the active's keys.
#[derive(Debug)]
struct View {
    nodes: Vec<NodeRow>,
    by_age: bool,
}

fn samples(addrs: &[String]) -> Vec<Option<Sample>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = addrs
            .iter()
            .map(|addr| s.spawn(move || fetch_sample(addr).ok()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect()
    })
}

/// Read every node (at once, a thread each), with `prev` (the last samples,
/// in the same order) for the rates.
fn gather(addrs: &[String], prev: &[Option<Sample>], by_age: bool, top: usize) -> View {
    let by = if by_age { "age" } else { "waiting" };
    let target = format!("/keys?top={}&by={by}", top.clamp(1, ALL_KEYS));
    let nodes = std::thread::scope(|s| {
        let handles: Vec<_> = addrs
            .iter()
            .zip(prev.iter().chain(std::iter::repeat(&None)))
            .map(|(addr, prev)| {
                let target = &target;
                s.spawn(move || node_row(addr, prev.as_ref(), target))
            })
            .collect();
        handles
            .into_iter()
            .zip(addrs)
            .map(|(h, addr)| {
                h.join().unwrap_or_else(|_| NodeRow {
                    addr: addr.clone(),
                    sample: None,
                    role: None,
                    node: None,
                    error: Some("failed".into()),
                    rates: None,
                    p99_ms: None,
                    keys: None,
                })
            })
            .collect()
    });
    View { nodes, by_age }
}

fn node_row(addr: &str, prev: Option<&Sample>, target: &str) -> NodeRow {
    let mut row = NodeRow {
        addr: addr.to_string(),
        sample: None,
        role: None,
        node: None,
        error: None,
        rates: None,
        p99_ms: None,
        keys: None,
    };
    match fetch_sample(addr) {
        Ok(sample) => {
            if let (Some(prev), Some(at), Some(before)) = (prev, sample.at, prev.and_then(|p| p.at))
            {
                let secs = at.duration_since(before).as_secs_f64().max(1e-3);
                let rate = |now: f64, then: f64| (now - then).max(0.0) / secs;
                row.rates = Some([
                    rate(sample.grants, prev.grants),
                    rate(sample.handoffs, prev.handoffs),
                    rate(sample.expiries, prev.expiries),
                ]);
                row.p99_ms = p99_ms(&prev.wait, &sample.wait);
            }
            row.role = Some(if sample.active { "active" } else { "standby" }.into());
            row.sample = Some(sample);
        }
        Err(e) => {
            row.error = Some(e);
            return row;
        }
    }
    match http_get(addr, target) {
        Ok((200, body)) => match serde_json::from_str::<Json>(&body) {
            Ok(keys) => {
                row.node = keys["node"].as_str().map(str::to_string);
                if let Some(role) = keys["role"].as_str() {
                    row.role = Some(role.to_string());
                }
                row.keys = Some(keys);
            }
            Err(e) => row.error = Some(format!("/keys: not JSON: {e}")),
        },
        Ok((code, _)) => row.error = Some(format!("/keys: HTTP {code}")),
        Err(e) => row.error = Some(e),
    }
    row
}

/// The bound (in ms) of the bucket the 99th percentile of the grants
/// between two samples falls in; None when there were none.
fn p99_ms(before: &[(f64, f64)], now: &[(f64, f64)]) -> Option<f64> {
    let diff: Vec<(f64, f64)> = now
        .iter()
        .map(|&(le, n)| {
            let then = before
                .iter()
                .find(|(l, _)| *l == le)
                .map_or(0.0, |(_, n)| *n);
            (le, (n - then).max(0.0))
        })
        .collect();
    let total = diff.last()?.1;
    if total <= 0.0 {
        return None;
    }
    diff.iter()
        .find(|(_, n)| *n >= 0.99 * total)
        .map(|(le, _)| le * 1000.0)
}

fn fetch_sample(addr: &str) -> Result<Sample, String> {
    let (code, body) = http_get(addr, "/metrics")?;
    if code != 200 {
        return Err(format!("/metrics: HTTP {code}"));
    }
    let mut sample = Sample {
        at: Some(Instant::now()),
        ..Sample::default()
    };
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        match name {
            "baton_role{role=\"active\"}" => sample.active = value == 1.0,
            "baton_grants_total" => sample.grants = value,
            "baton_handoffs_total" => sample.handoffs = value,
            "baton_lease_expiries_total" => sample.expiries = value,
            _ => {
                if let Some(le) = name
                    .strip_prefix("baton_grant_wait_seconds_bucket{le=\"")
                    .and_then(|rest| rest.strip_suffix("\"}"))
                {
                    let le = if le == "+Inf" {
                        f64::INFINITY
                    } else {
                        le.parse().unwrap_or(f64::INFINITY)
                    };
                    sample.wait.push((le, value));
                }
            }
        }
    }
    Ok(sample)
}

/// `GET target` from the metrics port at `addr`: the status and the body.
fn http_get(addr: &str, target: &str) -> Result<(u16, String), String> {
    let sock = addr
        .to_socket_addrs()
        .map_err(|e| format!("{addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr}: no address"))?;
    let mut stream =
        TcpStream::connect_timeout(&sock, HTTP_TIMEOUT).map_err(|e| format!("unreachable: {e}"))?;
    stream
        .set_read_timeout(Some(HTTP_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(HTTP_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("cannot send: {e}"))?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .map_err(|e| format!("no answer: {e}"))?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| "no HTTP answer".to_string())?;
    let code = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| "not an HTTP answer".to_string())?;
    Ok((code, body.to_string()))
}

/// `850ms`, `4.2s`, `3m07s`, `2h05m`, `3d04h`.
fn span(ms: u64) -> String {
    let s = ms / 1000;
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{}.{}s", s, (ms % 1000) / 100),
        60_000..3_600_000 => format!("{}m{:02}s", s / 60, s % 60),
        3_600_000..86_400_000 => format!("{}h{:02}m", s / 3600, (s / 60) % 60),
        _ => format!("{}d{:02}h", s / 86_400, (s / 3600) % 24),
    }
}

/// At most `width` characters of `text`, padded to `width` when `pad`.
fn cell(text: &str, width: usize) -> String {
    let cut: String = text.chars().take(width).collect();
    format!("{cut:<width$}")
}

impl View {
    /// The active node (the first that says so).
    fn active(&self) -> Option<&NodeRow> {
        self.nodes
            .iter()
            .find(|n| n.role.as_deref() == Some("active") && n.keys.is_some())
    }

    /// The lines of the screen or the table: at most `height`, each cut to
    /// `width` characters; `keys_help` adds the keys' line.
    fn lines(&self, width: usize, height: usize, keys_help: bool) -> Vec<String> {
        let by = if self.by_age {
            "oldest wait"
        } else {
            "waiting"
        };
        let mut lines = vec![if keys_help {
            format!("baton top - contended keys by {by} - q quit, w by waiting, a by oldest wait")
        } else {
            format!("baton top - contended keys by {by}")
        }];
        for n in &self.nodes {
            let mut line = format!(
                "{} {:<8}",
                cell(&n.addr, 21),
                n.role.as_deref().unwrap_or("-")
            );
            if let Some(error) = &n.error {
                line.push_str(&format!(" {error}"));
            } else {
                if let Some(node) = &n.node {
                    line.push_str(&format!(" node {node}"));
                }
                match n.rates {
                    Some([grants, handoffs, expiries]) => line.push_str(&format!(
                        "  grants {grants:.1}/s  handoffs {handoffs:.1}/s  expiries {expiries:.1}/s"
                    )),
                    None => line.push_str("  (rates after the next refresh)"),
                }
                match n.p99_ms {
                    Some(ms) if ms.is_finite() => {
                        line.push_str(&format!("  grant wait p99 <= {ms}ms"))
                    }
                    Some(_) => line.push_str("  grant wait p99 > 3600s"),
                    None => line.push_str("  grant wait p99 -"),
                }
            }
            lines.push(line);
        }
        let Some(active) = self.active() else {
            lines.push("no active node answered: no contended keys to show".into());
            return cut(lines, width, height);
        };
        let keys = active.keys.as_ref().expect("the active's keys");
        let list = keys["keys"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        lines.push(format!(
            "contended keys: {} (on {})",
            keys["contended"],
            active.node.as_deref().unwrap_or(&active.addr)
        ));
        lines.push(String::new());
        lines.push(format!(
            "{} {:>7} {:>8}  {} {:>8} {:>9} {:>4}  TOKEN",
            cell("KEY", 28),
            "WAITING",
            "OLDEST",
            cell("HOLDER VALUE", 26),
            "HELD",
            "LEFT",
            "SLOT"
        ));
        for entry in list {
            let key = entry["key"].as_str().unwrap_or("?");
            let waiting = entry["waiting"].as_u64().unwrap_or(0);
            let oldest = span(entry["oldest_wait_ms"].as_u64().unwrap_or(0));
            let holders = entry["holders"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let mut first = true;
            let mut row = |holder: Option<&Json>| {
                let left = if first {
                    format!("{} {waiting:>7} {oldest:>8}", cell(key, 28))
                } else {
                    " ".repeat(28 + 1 + 7 + 1 + 8)
                };
                first = false;
                let right = match holder {
                    Some(h) => format!(
                        "{} {:>8} {:>9} {:>4}  {}",
                        cell(h["value"].as_str().unwrap_or("-"), 26),
                        span(h["held_ms"].as_u64().unwrap_or(0)),
                        span(h["ms_left"].as_u64().unwrap_or(0)),
                        h["slot"].as_u64().unwrap_or(0),
                        h["token"].as_str().unwrap_or("?")
                    ),
                    None => cell("(no holder)", 26),
                };
                format!("{left}  {right}")
            };
            if holders.is_empty() {
                lines.push(row(None));
            }
            for h in holders.iter().take(HOLDERS_SHOWN) {
                lines.push(row(Some(h)));
            }
            let more = holders.len().saturating_sub(HOLDERS_SHOWN) as u64
                + entry["more_holders"].as_u64().unwrap_or(0);
            if more > 0 {
                lines.push(format!("{}  (+{more} more holders)", " ".repeat(46)));
            }
        }
        if list.is_empty() {
            lines.push("(nothing contended)".into());
        }
        cut(lines, width, height)
    }

    fn to_json(&self) -> Json {
        let nodes: Vec<Json> = self
            .nodes
            .iter()
            .map(|n| {
                let [grants, handoffs, expiries] = match n.rates {
                    Some(r) => r.map(Json::from),
                    None => [Json::Null, Json::Null, Json::Null],
                };
                json!({
                    "metrics": n.addr,
                    "node": n.node,
                    "role": n.role,
                    "error": n.error,
                    "grants_per_s": grants,
                    "handoffs_per_s": handoffs,
                    "expiries_per_s": expiries,
                    "grant_wait_p99_ms": n.p99_ms.filter(|ms| ms.is_finite()),
                })
            })
            .collect();
        let active = self.active();
        json!({
            "by": if self.by_age { "age" } else { "waiting" },
            "nodes": nodes,
            "active": active.map(|a| a.addr.clone()),
            "contended": active.and_then(|a| a.keys.as_ref()).map(|k| k["contended"].clone()),
            "keys": active
                .and_then(|a| a.keys.as_ref())
                .map_or(json!([]), |k| k["keys"].clone()),
        })
    }
}

fn cut(mut lines: Vec<String>, width: usize, height: usize) -> Vec<String> {
    lines.truncate(height);
    for line in &mut lines {
        if line.chars().count() > width {
            *line = line.chars().take(width).collect();
        }
        let trimmed = line.trim_end().len();
        line.truncate(trimmed);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_at_a_glance() {
        assert_eq!(span(0), "0ms");
        assert_eq!(span(999), "999ms");
        assert_eq!(span(4_250), "4.2s");
        assert_eq!(span(187_000), "3m07s");
        assert_eq!(span(7_500_000), "2h05m");
        assert_eq!(span(273_600_000), "3d04h");
    }

    #[test]
    fn the_p99_is_the_bucket_the_interval_s_99th_grant_fell_in() {
        let before = [(0.001, 10.0), (0.025, 10.0), (f64::INFINITY, 10.0)];
        let now = [(0.001, 108.0), (0.025, 110.0), (f64::INFINITY, 110.0)];
        assert_eq!(p99_ms(&before, &now), Some(25.0));
        assert_eq!(p99_ms(&before, &before), None);
    }
}
