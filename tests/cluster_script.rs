//! `scripts/cluster.sh` run as a user would (docs/cluster.md):
//! start, status, kill, restart and stop of a 2-node cluster on free
//! loopback ports, a start that fails because a port is taken, and a
//! metrics port per node (start returning once the cluster is formed).
//!
//! The script gets the `batond` that cargo built (`BATOND`), its own state
//! directory, and a deadline on every run; a guard stops the cluster and
//! removes the directory whatever happens.

mod common;

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Duration;

use common::{Finished, batond_path, run_to_exit, wait_for};

/// The longest one script run may take (a graceful stop of 2 nodes included).
const RUN_DEADLINE: Duration = Duration::from_secs(60);

/// A state directory of the script's; `stop` and removal when dropped.
struct ScriptCluster {
    dir: PathBuf,
    /// What the script runs as batond (`BATOND`).
    bin: String,
    /// More `NAME=value` for the script's environment.
    env: Vec<String>,
}

impl ScriptCluster {
    fn new(name: &str) -> ScriptCluster {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("cluster-sh-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        ScriptCluster {
            dir,
            bin: batond_path().to_string(),
            env: Vec::new(),
        }
    }

    fn run(&self, args: &[&str]) -> Finished {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cluster.sh");
        let mut all = vec![script];
        all.extend_from_slice(args);
        // run_to_exit has no environment parameter: pass it through `env`.
        let dir = format!("BATON_CLUSTER_DIR={}", self.dir.display());
        let bin = format!("BATOND={}", self.bin);
        let mut with_env = vec![dir.as_str(), bin.as_str(), "BATON_START_TIMEOUT=20"];
        with_env.extend(self.env.iter().map(String::as_str));
        with_env.extend(all);
        run_to_exit("env", &with_env, RUN_DEADLINE)
    }

    fn pid(&self, node: usize) -> Option<u32> {
        std::fs::read_to_string(self.dir.join(format!("node{node}.pid")))
            .ok()
            .and_then(|pid| pid.trim().parse().ok())
    }
}

impl Drop for ScriptCluster {
    fn drop(&mut self) {
        let _ = self.run(&["stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A base port with the next one free too.
fn two_free_ports() -> u16 {
    common::free_port_run(2)
}

fn alive(pid: u32) -> bool {
    // A zombie has an empty cmdline: gone for our purpose.
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty())
}

#[test]
fn start_status_kill_restart_and_stop_keep_the_pid_files_true() {
    let cluster = ScriptCluster::new("cycle");
    let out = cluster.run(&["status"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("no cluster started"), "{out:?}");
    let out = cluster.run(&["kill"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(
        out.stderr.contains("usage: scripts/cluster.sh kill NODE"),
        "{out:?}"
    );

    let base = two_free_ports();
    let out = cluster.run(&["start", "2", &base.to_string()]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("node 0: ") && out.stdout.contains("node 1: "),
        "{out:?}"
    );
    let (p0, p1) = (
        cluster.pid(0).expect("pid 0"),
        cluster.pid(1).expect("pid 1"),
    );
    assert!(alive(p0) && alive(p1));

    let out = cluster.run(&["status"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout.lines().count(), 2, "{out:?}");
    assert!(out.stdout.contains("I role="), "{out:?}");

    let out = cluster.run(&["start", "2", &base.to_string()]);
    assert_eq!(out.code, Some(1), "a second start is refused: {out:?}");
    assert!(out.stderr.contains("already running"), "{out:?}");
    assert_eq!(
        cluster.pid(0),
        Some(p0),
        "the pid files still name the real nodes"
    );

    let out = cluster.run(&["kill", "0"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(!alive(p0), "node 0 was killed");
    let out = cluster.run(&["status"]);
    assert_eq!(out.code, Some(1), "a node is down: {out:?}");
    assert!(out.stdout.contains("not running"), "{out:?}");
    let out = cluster.run(&["kill", "0"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("node 0 is not running"), "{out:?}");
    let out = cluster.run(&["kill", "7"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("nodes 0-1"), "{out:?}");

    // A pid file naming some other live process (this test) is stale: it
    // is reported and removed, and that process is never signalled.
    std::fs::write(
        cluster.dir.join("node0.pid"),
        std::process::id().to_string(),
    )
    .expect("write a stale pid file");
    let out = cluster.run(&["status"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("stale pid file removed"), "{out:?}");
    assert_eq!(cluster.pid(0), None, "{out:?}");

    let out = cluster.run(&["restart", "0"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let p0 = cluster.pid(0).expect("pid 0 after restart");
    assert!(alive(p0));

    let out = cluster.run(&["stop"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(!alive(p0) && !alive(p1), "both stopped: {out:?}");
    assert_eq!(
        (cluster.pid(0), cluster.pid(1)),
        (None, None),
        "pid files removed"
    );
    let out = cluster.run(&["status"]);
    assert!(out.stderr.contains("no cluster started"), "{out:?}");
}

#[test]
fn a_start_on_a_taken_port_fails_says_why_and_leaves_nothing_running() {
    let cluster = ScriptCluster::new("taken");
    let base = two_free_ports();
    let taken = TcpListener::bind(("127.0.0.1", base + 1)).expect("take the port");
    let out = cluster.run(&["start", "2", &base.to_string()]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.contains("node 1: batond exited at once"),
        "{out:?}"
    );
    assert!(
        out.stderr.contains("Address already in use"),
        "the log's last lines: {out:?}"
    );
    assert_eq!((cluster.pid(0), cluster.pid(1)), (None, None), "{out:?}");
    // Node 0, which did start, was stopped: its port is free again.
    wait_for("node 0's port to be free", common::DEADLINE, || {
        TcpListener::bind(("127.0.0.1", base)).ok()
    });
    let out = cluster.run(&["status"]);
    assert!(out.stderr.contains("no cluster started"), "{out:?}");
    drop(taken);
}

#[test]
fn a_node_slow_to_exec_is_waited_for_not_taken_for_dead() {
    // Between the fork in `launch` and the exec of batond the pid is a copy
    // of the script (not a batond on the port). A wrapper that pauses
    // before its exec (and whose name says nothing of batond) stretches
    // that window so the start must get through it.
    let mut cluster = ScriptCluster::new("slow-exec");
    std::fs::create_dir_all(&cluster.dir).expect("state dir");
    let wrapper = cluster.dir.join("slow-exec.sh");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nsleep 1\nexec '{}' \"$@\"\n", batond_path()),
    )
    .expect("write wrapper");
    let mut perms = std::fs::metadata(&wrapper).expect("wrapper").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&wrapper, perms).expect("chmod wrapper");
    cluster.bin = wrapper.display().to_string();
    let base = two_free_ports();
    let out = cluster.run(&["start", "1", &base.to_string()]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("node 0: 127.0.0.1:"), "{out:?}");
    let out = cluster.run(&["status"]);
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[test]
fn a_cluster_with_client_authentication_starts_and_reports_status() {
    // `I` alone gets auth-required: the probes must send U first, with the
    // first secret of BATON_AUTH_FILE (comments and blank lines skipped).
    let mut cluster = ScriptCluster::new("auth");
    std::fs::create_dir_all(&cluster.dir).expect("state dir");
    let secrets = cluster.dir.join("secrets");
    std::fs::write(
        &secrets,
        "# clients\n\n  script-secret-0123456789  \nother-secret-0123456789\n",
    )
    .expect("write secrets");
    let path = secrets.display().to_string();
    cluster.env = vec![
        format!("BATOND_FLAGS=--auth-file {path}"),
        format!("BATON_AUTH_FILE={path}"),
    ];
    let base = two_free_ports();
    let out = cluster.run(&["start", "2", &base.to_string()]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let out = cluster.run(&["status"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("role=active"), "{out:?}");
    assert!(!out.stdout.contains("script-secret"), "{out:?}");
}

/// `GET /metrics` of the node serving metrics on `port`, through a plain
/// TCP client (no curl needed).
fn metrics_of(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics port");
    stream
        .set_read_timeout(Some(common::DEADLINE))
        .expect("read timeout");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .expect("send the request");
    let mut body = String::new();
    stream.read_to_string(&mut body).expect("read the answer");
    body
}

#[test]
fn each_node_gets_a_metrics_port_of_its_own_and_start_waits_for_the_cluster_to_form() {
    // The natural attempt, a --metrics in BATOND_FLAGS (once the second
    // node could not bind it), and BATON_METRICS_BASE: node i gets base + i.
    for how in ["flags", "base"] {
        let mut cluster = ScriptCluster::new(&format!("metrics-{how}"));
        let base = two_free_ports();
        let metrics = two_free_ports();
        cluster.env = vec![match how {
            "flags" => format!("BATOND_FLAGS=--detect 0.5 --metrics 127.0.0.1:{metrics}"),
            _ => format!("BATON_METRICS_BASE={metrics}"),
        }];
        let out = cluster.run(&["start", "2", &base.to_string()]);
        assert_eq!(out.code, Some(0), "{out:?}");
        for port in [metrics, metrics + 1] {
            let url = format!("metrics http://127.0.0.1:{port}/metrics");
            assert!(out.stdout.contains(&url), "{url} in {out:?}");
        }
        // Returned once formed: the active counts its standby at once.
        assert!(
            out.stdout
                .contains("cluster formed: node 0 active, 1 standby(s) synced"),
            "{out:?}"
        );
        let out = cluster.run(&["status"]);
        assert_eq!(out.code, Some(0), "{out:?}");
        assert!(out.stdout.contains("standbys=1"), "{out:?}");
        assert!(
            out.stdout
                .contains(&format!("metrics http://127.0.0.1:{}/metrics", metrics + 1)),
            "{out:?}"
        );
        assert!(metrics_of(metrics).contains("baton_role{role=\"active\"} 1"));
        assert!(metrics_of(metrics + 1).contains("baton_role{role=\"standby\"} 1"));
        // A restart keeps the node's metrics port, and waits for it to rejoin.
        assert_eq!(cluster.run(&["kill", "1"]).code, Some(0));
        let out = cluster.run(&["restart", "1"]);
        assert_eq!(out.code, Some(0), "{out:?}");
        assert!(out.stdout.contains("cluster formed"), "{out:?}");
        assert!(metrics_of(metrics + 1).contains("baton_role{role=\"standby\"} 1"));
        let out = cluster.run(&["stop"]);
        assert_eq!(out.code, Some(0), "{out:?}");
        assert!(!cluster.dir.join("metrics").exists(), "{out:?}");
    }
}

#[test]
fn metrics_ports_that_overlap_the_client_ports_are_refused_before_anything_starts() {
    let mut cluster = ScriptCluster::new("metrics-overlap");
    let base = two_free_ports();
    cluster.env = vec![format!("BATON_METRICS_BASE={}", base + 1)];
    let out = cluster.run(&["start", "2", &base.to_string()]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("overlap the client ports"), "{out:?}");
    assert_eq!((cluster.pid(0), cluster.pid(1)), (None, None), "{out:?}");
}
