//! A real Prometheus scrapes a real two-node cluster: both targets come up,
//! the rules in `scripts/baton.rules.yml` load and evaluate without error,
//! `baton_role` names the active, a `histogram_quantile` over the grant
//! wait histogram is a number once grants were made, a healthy cluster
//! raises no alert, and once the active is killed (by PID) the queries show
//! the other node active and the rules put the dead target's alert
//! pending. Every node's `/metrics` passes `promtool check metrics`.
//! Every query of every panel of the Grafana dashboard
//! (`scripts/grafana/baton-dashboard.json`) parses and returns a series
//! on the live cluster, and the dashboard is importable as it is (a
//! `DS_PROMETHEUS` input that every panel names); the alert rules' links
//! to it name panels it has (that check needs no Prometheus).
//!
//! The Prometheus is this test's own child process, on its own free
//! loopback port with its own storage in a temporary directory; it is
//! killed by PID (and the directory removed) when the test ends or fails.
//! Without `prometheus` and `promtool` on PATH the test says it skips and
//! passes, unless `BATON_REQUIRE_PROMETHEUS=1` (as `.ci/run` sets when it
//! installed them): then it fails. The whole test is bounded (60 s).

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::nodes::Nodes;
use common::{DEADLINE, free_port, on_path, run_to_exit, token_of, wait_for};

/// The whole test, Prometheus's start included.
const TEST_BOUND: Duration = Duration::from_secs(60);
/// Between two polls of Prometheus's API (its answers change once a
/// second, at a scrape or a rule evaluation).
const POLL_EVERY: Duration = Duration::from_millis(50);
/// Connecting to, and each read from, an HTTP server.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/baton.rules.yml");
const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/scripts/grafana/baton-dashboard.json"
);

/// The dashboard, checked importable as it is: a `DS_PROMETHEUS` data
/// source input, and every panel and query naming it (no data source of
/// the machine it was made on).
fn dashboard() -> Value {
    let text = std::fs::read_to_string(DASHBOARD).expect("read the dashboard");
    let json: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let input = &json["__inputs"][0];
    assert_eq!(
        (&input["name"], &input["type"], &input["pluginId"]),
        (
            &"DS_PROMETHEUS".into(),
            &"datasource".into(),
            &"prometheus".into()
        ),
        "{input}"
    );
    assert!(json["id"].is_null(), "no id of the Grafana it was made on");
    let ds = serde_json::json!({"type": "prometheus", "uid": "${DS_PROMETHEUS}"});
    for panel in json["panels"].as_array().expect("panels") {
        if panel["type"] == "text" {
            continue;
        }
        assert_eq!(panel["datasource"], ds, "panel {}", panel["title"]);
        for target in panel["targets"].as_array().expect("targets") {
            assert_eq!(target["datasource"], ds, "panel {}", panel["title"]);
        }
    }
    json
}

/// Every panel's queries as (panel id, panel title, PromQL), with the
/// dashboard's variables as a Prometheus of job "baton" sees them.
fn dashboard_queries(dashboard: &Value) -> Vec<(u64, String, String)> {
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let Some(targets) = panel["targets"].as_array() else {
            continue;
        };
        for target in targets {
            let expr = target["expr"].as_str().expect("an expr");
            queries.push((
                panel["id"].as_u64().expect("a panel id"),
                panel["title"].as_str().unwrap_or_default().to_string(),
                expr.replace("$job", "baton")
                    .replace("$__rate_interval", "1m"),
            ));
        }
    }
    queries
}

#[test]
fn the_dashboard_is_importable_and_the_rules_link_to_panels_it_has() {
    let dashboard = dashboard();
    let ids: BTreeSet<u64> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .map(|p| p["id"].as_u64().expect("a panel id"))
        .collect();
    let uid = dashboard["uid"].as_str().expect("a uid");
    let rules = std::fs::read_to_string(RULES).expect("read the rules");
    let mut links = 0;
    for line in rules.lines() {
        let Some(link) = line.trim().strip_prefix("dashboard: ") else {
            continue;
        };
        let link = link.trim_matches('"');
        let (path, panel) = link
            .split_once("?viewPanel=")
            .unwrap_or_else(|| panic!("a panel link: {link}"));
        assert!(path.starts_with(&format!("/d/{uid}/")), "{link}");
        let panel: u64 = panel.parse().expect("a panel id");
        assert!(ids.contains(&panel), "{link}: no panel {panel}");
        links += 1;
    }
    assert!(
        links >= 5,
        "the alerts link to the dashboard: {links} links"
    );
    assert!(!dashboard_queries(&dashboard).is_empty());
}

/// `prometheus` and `promtool`; None (the test skips) when one is missing,
/// a failure instead if `BATON_REQUIRE_PROMETHEUS=1`.
fn tools() -> Option<(PathBuf, PathBuf)> {
    let found = (on_path("prometheus"), on_path("promtool"));
    if let (Some(prometheus), Some(promtool)) = found {
        return Some((prometheus, promtool));
    }
    let missing: Vec<&str> = [("prometheus", &found.0), ("promtool", &found.1)]
        .iter()
        .filter(|(_, path)| path.is_none())
        .map(|(name, _)| *name)
        .collect();
    if std::env::var("BATON_REQUIRE_PROMETHEUS").as_deref() == Ok("1") {
        panic!(
            "BATON_REQUIRE_PROMETHEUS=1 but {} not on PATH",
            missing.join(" and ")
        );
    }
    println!(
        "skipping the Prometheus test: {} not on PATH (Debian: apt-get install prometheus)",
        missing.join(" and ")
    );
    None
}

/// The test's one time bound: every poll fails the test once it is past.
struct Deadline {
    start: Instant,
}

impl Deadline {
    fn new() -> Deadline {
        Deadline {
            start: Instant::now(),
        }
    }

    fn left(&self) -> Duration {
        TEST_BOUND.saturating_sub(self.start.elapsed())
    }

    /// Poll `f` every [`POLL_EVERY`] until it returns Some; fail the test
    /// once the test's time is up.
    fn poll<T>(&self, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(
                !self.left().is_zero(),
                "timed out ({TEST_BOUND:?} for the whole test) waiting for {what}"
            );
            std::thread::sleep(POLL_EVERY);
        }
    }
}

/// One HTTP/1.1 GET with `Connection: close`: the status code and the body
/// (de-chunked if the server chunked it, checked against Content-Length if
/// it sent one). Err on any failure to connect, send or read, or on a
/// response that is not HTTP.
fn http_get(addr: SocketAddr, target: &str) -> Result<(u16, Vec<u8>), String> {
    let mut stream =
        TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(HTTP_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(HTTP_TIMEOUT)))
        .map_err(|e| format!("timeouts: {e}"))?;
    let request = format!(
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .map_err(|e| format!("read: {e}"))?;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no end of head in {} bytes", response.len()))?;
    let head = std::str::from_utf8(&response[..split]).map_err(|_| "head not UTF-8".to_string())?;
    let body = &response[split + 4..];
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or_default();
    let code = status
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status.strip_prefix("HTTP/1.0 "))
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line {status:?}"))?;
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(format!("bad header line {line:?}"));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        } else if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| format!("bad Content-Length {value:?}"))?,
            );
        }
    }
    let body = if chunked {
        dechunk(body)?
    } else if let Some(length) = length {
        if body.len() != length {
            return Err(format!("body of {} bytes, not {length}", body.len()));
        }
        body.to_vec()
    } else {
        body.to_vec()
    };
    Ok((code, body))
}

/// The body of a `Transfer-Encoding: chunked` response.
fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunk size line without its end")?;
        let line = std::str::from_utf8(&rest[..eol]).map_err(|_| "chunk size not UTF-8")?;
        let hex = line.split(';').next().unwrap_or_default().trim();
        let size =
            usize::from_str_radix(hex, 16).map_err(|_| format!("bad chunk size {line:?}"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(body);
        }
        if rest.len() < size + 2 || &rest[size..size + 2] != b"\r\n" {
            return Err(format!("a chunk of {size} bytes cut short"));
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// `text` percent-encoded for a URL's query string (everything but the
/// unreserved characters).
fn url_encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A `prometheus` process of this test's own, killed by PID when dropped.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
    log: Arc<Mutex<String>>,
}

impl Prometheus {
    /// Start `bin` on a free loopback port, scraping `targets` (job
    /// "baton") every second and evaluating [`RULES`] every second, its
    /// configuration and storage in a fresh directory. Returns at once.
    fn start(bin: &Path, targets: &[SocketAddr]) -> Prometheus {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("prometheus-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(dir.join("data")).expect("create Prometheus's directory");
        let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - \"{RULES}\"\n\
             scrape_configs:\n  - job_name: baton\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut child = Command::new(bin)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("stderr is piped");
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
            });
        }
        Prometheus {
            child,
            addr,
            dir,
            log,
        }
    }

    /// Fail the test (with Prometheus's log) if it has exited.
    fn check_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "prometheus exited ({status}):\n{}",
                self.log.lock().unwrap()
            );
        }
    }

    /// GET an API path; its `data`. None while Prometheus does not answer
    /// or answers 503 (it is starting: it listens before it is ready); a
    /// failure if it answers with anything but a successful JSON answer (a
    /// bad query is a bug in this test).
    fn api(&mut self, target: &str) -> Option<Value> {
        self.check_running();
        let (code, body) = http_get(self.addr, target).ok()?;
        if code == 503 {
            return None;
        }
        let text = String::from_utf8_lossy(&body);
        assert_eq!(code, 200, "GET {target}: {text}");
        let json: Value = serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("GET {target}: not JSON ({e}): {text}"));
        assert_eq!(json["status"], "success", "GET {target}: {text}");
        Some(json["data"].clone())
    }

    /// An instant query: the result vector's samples, as (labels, value).
    fn query(&mut self, promql: &str) -> Option<Vec<(Value, f64)>> {
        let data = self.api(&format!("/api/v1/query?query={}", url_encode(promql)))?;
        assert_eq!(data["resultType"], "vector", "{promql}: {data}");
        let result = data["result"].as_array().expect("a result array");
        let samples = result
            .iter()
            .map(|sample| {
                // "value": [<time>, "<value as text>"]; NaN and ±Inf too.
                let text = sample["value"][1].as_str().unwrap_or_default();
                let value = match text {
                    "NaN" => f64::NAN,
                    "+Inf" => f64::INFINITY,
                    "-Inf" => f64::NEG_INFINITY,
                    _ => text
                        .parse()
                        .unwrap_or_else(|_| panic!("{promql}: bad value in {sample}")),
                };
                (sample["metric"].clone(), value)
            })
            .collect();
        Some(samples)
    }

    /// The `instance` labels of a query's samples.
    fn instances(&mut self, promql: &str) -> Option<Vec<String>> {
        let samples = self.query(promql)?;
        Some(
            samples
                .iter()
                .map(|(labels, _)| labels["instance"].as_str().unwrap_or_default().to_string())
                .collect(),
        )
    }

    /// The rules of group "baton" as loaded, by name, once every one has
    /// been evaluated without error (`health` "ok"); None before. A rule
    /// that failed to evaluate fails the test.
    fn evaluated_rules(&mut self) -> Option<BTreeSet<String>> {
        let data = self.api("/api/v1/rules")?;
        let group = data["groups"]
            .as_array()?
            .iter()
            .find(|g| g["name"] == "baton")?
            .clone();
        let mut names = BTreeSet::new();
        let mut all_ok = true;
        for rule in group["rules"].as_array()? {
            let name = rule["name"].as_str().unwrap_or_default().to_string();
            assert_ne!(
                rule["health"], "err",
                "rule {name} failed to evaluate: {}",
                rule["lastError"]
            );
            all_ok &= rule["health"] == "ok";
            names.insert(name);
        }
        all_ok.then_some(names)
    }

    /// The alerts pending or firing now, as (alertname, instance, state).
    fn alerts(&mut self) -> Option<Vec<(String, String, String)>> {
        let data = self.api("/api/v1/alerts")?;
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        Some(
            data["alerts"]
                .as_array()?
                .iter()
                .map(|a| {
                    (
                        text(&a["labels"]["alertname"]),
                        text(&a["labels"]["instance"]),
                        text(&a["state"]),
                    )
                })
                .collect(),
        )
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // Only a child not reaped yet still owns its PID.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("----- prometheus log -----\n{}", self.log.lock().unwrap());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The alert names `scripts/baton.rules.yml` defines.
fn alerts_in_rules_file() -> BTreeSet<String> {
    let text = std::fs::read_to_string(RULES).expect("read scripts/baton.rules.yml");
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(|name| name.trim().to_string())
        .collect()
}

/// Pipe a node's `/metrics` through `promtool check metrics`: it must exit
/// 0 and say nothing (a lint finding is printed and exits 1).
fn promtool_check_metrics(promtool: &Path, metrics: SocketAddr, dir: &Path, deadline: &Deadline) {
    let (code, body) =
        http_get(metrics, "/metrics").unwrap_or_else(|e| panic!("scrape {metrics}: {e}"));
    assert_eq!(code, 200, "scrape {metrics}");
    let file = dir.join(format!("metrics-{}.txt", metrics.port()));
    std::fs::write(&file, &body).expect("write the scrape");
    let promtool = promtool.to_str().expect("a UTF-8 promtool path");
    let file_arg = file.to_str().expect("a UTF-8 temp path");
    // sh only redirects stdin and execs promtool, so run_to_exit's kill on
    // its deadline reaches promtool itself.
    let done = run_to_exit(
        "sh",
        &[
            "-c",
            "exec \"$0\" check metrics < \"$1\"",
            promtool,
            file_arg,
        ],
        deadline.left(),
    );
    assert!(
        done.code == Some(0) && done.stdout.trim().is_empty() && done.stderr.trim().is_empty(),
        "promtool check metrics on {metrics}'s scrape: exit {:?}\n{}{}\n--- the scrape ---\n{}",
        done.code,
        done.stdout,
        done.stderr,
        String::from_utf8_lossy(&body)
    );
}

#[test]
fn a_real_prometheus_scrapes_the_cluster_evaluates_the_rules_and_sees_a_failover() {
    let Some((prometheus_bin, promtool)) = tools() else {
        return;
    };
    let deadline = Deadline::new();
    let mut nodes = Nodes::on_free_ports(2);
    let metrics: Vec<SocketAddr> = (0..2)
        .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
        .collect();
    for (i, addr) in metrics.iter().enumerate() {
        let listen = addr.to_string();
        let flags = [
            "--cluster-key-file",
            common::cluster_key_file(),
            "--metrics",
            listen.as_str(),
        ];
        nodes.start_with(i, &flags, &[]);
    }
    let node_of = |instance: &str| {
        metrics
            .iter()
            .position(|m| m.to_string() == instance)
            .unwrap_or_else(|| panic!("instance {instance} is no node's metrics address"))
    };
    let mut prom = Prometheus::start(&prometheus_bin, &metrics);

    // Both targets scraped, under the job and instance labels the rules use.
    deadline.poll("Prometheus to scrape both nodes", || {
        let data = prom.api("/api/v1/targets")?;
        let targets = data["activeTargets"].as_array()?;
        let up: BTreeSet<String> = targets
            .iter()
            .filter(|t| t["health"] == "up" && t["labels"]["job"] == "baton")
            .filter_map(|t| t["labels"]["instance"].as_str().map(str::to_string))
            .collect();
        let want: BTreeSet<String> = metrics.iter().map(ToString::to_string).collect();
        (up == want).then_some(())
    });

    // Every alert of the rules file loaded, and each evaluates cleanly.
    let loaded = deadline.poll("the rules to load and evaluate", || prom.evaluated_rules());
    assert_eq!(
        loaded,
        alerts_in_rules_file(),
        "the alerts Prometheus loaded"
    );

    // Prometheus names the active: one node active, the other standby.
    let active = deadline.poll("one node active and one standby in Prometheus", || {
        let actives = prom.instances(r#"baton_role{job="baton",role="active"} == 1"#)?;
        let standbys = prom.instances(r#"baton_role{job="baton",role="standby"} == 1"#)?;
        match (actives.as_slice(), standbys.as_slice()) {
            ([a], [s]) if a != s => Some(node_of(a)),
            _ => None,
        }
    });
    let standby = 1 - active;
    // The node agrees, and its standby holds its whole state.
    nodes.wait_synced_standbys(active, 1);

    // Grants: five at once, one after a wait (a handoff on release).
    let mut holder = nodes.client(active);
    let first = holder.acquire_now("prom0", "30");
    for i in 1..5 {
        holder.acquire_now(&format!("prom{i}"), "30");
    }
    let mut waiter = nodes.client(active);
    waiter.send("A prom0 30 10");
    wait_for("the waiter to be in line", DEADLINE, || {
        (holder.query("prom0").waiting == 1).then_some(())
    });
    assert_eq!(holder.ask(&format!("R prom0 {first}")), "R prom0");
    token_of(&waiter.recv());
    let active_instance = metrics[active].to_string();
    deadline.poll("Prometheus to scrape the six grants", || {
        let grants = prom.query(&format!(
            r#"baton_grants_total{{job="baton",instance="{active_instance}"}}"#
        ))?;
        matches!(grants.as_slice(), [(_, n)] if *n == 6.0).then_some(())
    });
    for histogram in ["baton_grant_wait_seconds", "baton_handoff_seconds"] {
        let q = format!(
            r#"histogram_quantile(0.99, sum by (le) (rate({histogram}_bucket{{job="baton"}}[1m])))"#
        );
        let p99 = deadline.poll(&format!("{histogram}'s p99 to be a number"), || match prom
            .query(&q)?
            .as_slice()
        {
            [(_, v)] if v.is_finite() => Some(*v),
            _ => None,
        });
        assert!(p99 >= 0.0, "{q} = {p99}");
    }

    // Every panel of the dashboard: its query parses and returns a series.
    for (id, title, promql) in dashboard_queries(&dashboard()) {
        let series = deadline.poll(&format!("panel {id} ({title}) to return a series"), || {
            let samples = prom.query(&promql)?;
            (!samples.is_empty()).then_some(samples.len())
        });
        assert!(series >= 1, "{promql}");
    }

    // The exposition of both nodes, histograms filled, is lint-clean.
    for addr in &metrics {
        promtool_check_metrics(&promtool, *addr, &prom.dir, &deadline);
    }

    // A healthy cluster raises no alert (pending ones from before the
    // first scrapes, or before the standby synced, clear).
    deadline.poll("no alert pending or firing on the healthy cluster", || {
        prom.alerts()?.is_empty().then_some(())
    });

    // The active goes: Prometheus sees the other node take over once the
    // dead one's series go stale.
    let killed = active_instance;
    nodes.kill(active);
    let standby_instance = metrics[standby].to_string();
    deadline.poll("Prometheus to show the other node active", || {
        let actives = prom.instances(r#"baton_role{job="baton",role="active"} == 1"#)?;
        (actives == [standby_instance.clone()]).then_some(())
    });
    nodes.wait_serving(standby);
    // The rules see it too: the dead target is down, and the active is
    // short of a standby (both pending, their `for` not yet run).
    deadline.poll(
        "BatonTargetDown and BatonStandbysShort to be pending",
        || {
            let alerts = prom.alerts()?;
            let has = |name: &str, instance: &str| {
                alerts
                    .iter()
                    .any(|(n, i, state)| n == name && i == instance && state == "pending")
            };
            (has("BatonTargetDown", &killed) && has("BatonStandbysShort", "")).then_some(())
        },
    );
    // And still no rule fails to evaluate on the data since.
    deadline.poll("the rules to evaluate after the failover", || {
        prom.evaluated_rules()
    });
}
