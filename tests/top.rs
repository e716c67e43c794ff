//! `baton top` against a real node with a contended key: `--once` (a
//! table), `--json`, a cluster's nodes, and the full-screen view driven in
//! a real terminal under tmux (skipped without tmux unless
//! BATON_REQUIRE_TMUX is set, as CI sets it).

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::nodes::two_nodes_with_metrics;
use common::{DEADLINE, LineClient, Node, baton_path, free_port, run_to_exit, token_of, wait_for};
use serde_json::Value as Json;

/// A node with a metrics port, `jobs/nightly` held by a client whose
/// value is `worker-7@host-a`, and three requests waiting for it.
struct Contended {
    node: Node,
    metrics: String,
    token: u64,
    _clients: Vec<LineClient>,
}

fn contended() -> Contended {
    let metrics = format!("127.0.0.1:{}", free_port());
    let node = Node::start(&["--metrics", metrics.as_str()]);
    let mut holder = node.client();
    let token = token_of(&holder.ask("A jobs/nightly 60 0 1 worker-7@host-a"));
    let mut clients = vec![];
    for _ in 0..3 {
        let mut waiter = node.client();
        waiter.send("A jobs/nightly 60 0 1");
        clients.push(waiter);
    }
    wait_for("three waiters", DEADLINE, || {
        (holder.query("jobs/nightly").waiting == 3).then_some(())
    });
    clients.push(holder);
    Contended {
        node,
        metrics,
        token,
        _clients: clients,
    }
}

fn top(args: &[&str]) -> common::Finished {
    let mut all = vec!["top", "--interval", "0.2"];
    all.extend_from_slice(args);
    run_to_exit(baton_path(), &all, DEADLINE)
}

#[test]
fn once_prints_the_contended_key_its_holder_and_waiters_as_a_table() {
    let c = contended();
    let out = top(&["--metrics", &c.metrics, "--once"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let text = &out.stdout;
    assert!(
        !text.contains('\x1b'),
        "no screen control in a table: {text:?}"
    );
    let node = text
        .lines()
        .find(|l| l.starts_with(&c.metrics))
        .unwrap_or_else(|| panic!("no line for the node: {text}"));
    assert_eq!(node.split_whitespace().nth(1), Some("active"), "{node}");
    assert!(text.contains("grants 0.0/s"), "rates: {text}");
    assert!(text.contains("contended keys: 1"), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("jobs/nightly"))
        .unwrap_or_else(|| panic!("no row for the key: {text}"));
    let fields: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(fields[1], "3", "waiting: {row}");
    assert_eq!(fields[3], "worker-7@host-a", "{row}");
    assert_eq!(
        fields.last().copied(),
        Some(c.token.to_string().as_str()),
        "{row}"
    );
    drop(c.node);
}

#[test]
fn json_gives_the_nodes_and_the_active_s_keys() {
    let c = contended();
    let out = top(&["--metrics", &c.metrics, "--json", "--by", "age"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let json: Json = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(json["by"], "age");
    assert_eq!(json["active"], c.metrics);
    assert_eq!(json["contended"], 1);
    assert_eq!(json["nodes"][0]["role"], "active");
    assert_eq!(json["nodes"][0]["grants_per_s"], 0.0);
    let key = &json["keys"][0];
    assert_eq!(key["key"], "jobs/nightly");
    assert_eq!(key["waiting"], 3);
    assert_eq!(key["holders"][0]["value"], "worker-7@host-a");
    assert_eq!(key["holders"][0]["token"], c.token.to_string());
    assert!(key["holders"][0]["held_ms"].as_u64().is_some());
    assert!(key["oldest_wait_ms"].as_u64().is_some());
}

#[test]
fn a_cluster_shows_each_node_s_role_and_the_active_s_keys() {
    let (first, _second, metrics) = two_nodes_with_metrics(&[]);
    let metrics = metrics.map(|m| m.to_string());
    // The standby first in the list: top still shows the active's keys.
    let list = format!("{},{},127.0.0.1:1", metrics[1], metrics[0]);
    let mut holder = first.client();
    wait_for("node 0 to serve", DEADLINE, || {
        holder.send("A lead 60 0 1 10.0.0.7:8080");
        let answer = holder.recv();
        answer.starts_with("A ").then(|| token_of(&answer))
    });
    let mut waiter = first.client();
    waiter.send("A lead 60 0 1");
    let json = wait_for("a standby and the active's contended key", DEADLINE, || {
        let out = top(&["--metrics", &list, "--json"]);
        let json: Json = serde_json::from_str(&out.stdout).ok()?;
        (json["nodes"][0]["role"] == "standby" && json["contended"] == 1).then_some(json)
    });
    assert_eq!(json["active"], metrics[0]);
    assert_eq!(json["nodes"][1]["role"], "active");
    assert!(json["nodes"][2]["error"].is_string(), "{json}");
    assert_eq!(json["keys"][0]["holders"][0]["value"], "10.0.0.7:8080");
}

#[test]
fn bad_flags_are_usage_errors() {
    for (args, says) in [
        (&["top"][..], "top needs --metrics"),
        (&["top", "--metrics", "127.0.0.1:1", "--by", "size"], "--by"),
        (
            &["top", "--metrics", "127.0.0.1:1", "--once", "--json"],
            "either",
        ),
        (
            &["top", "--metrics", "127.0.0.1:1", "--interval", "0"],
            "--interval",
        ),
        (
            &["query", "k", "--metrics", "127.0.0.1:1"],
            "--metrics is for top",
        ),
    ] {
        let out = run_to_exit(baton_path(), args, DEADLINE);
        assert_eq!(out.code, Some(2), "{args:?}");
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
    }
    // No node answers: exit 1, saying why.
    let out = top(&["--metrics", "127.0.0.1:1", "--once"]);
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("unreachable"), "{}", out.stderr);
}

/// Whether tmux is installed; CI sets BATON_REQUIRE_TMUX=1 (it installs
/// tmux), so that a missing tmux fails there instead of skipping.
fn tmux_present() -> bool {
    let found = Command::new("tmux")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("BATON_REQUIRE_TMUX").is_none(),
            "BATON_REQUIRE_TMUX is set and tmux is not installed"
        );
        eprintln!("baton top screen test skipped: no tmux");
    }
    found
}

/// A tmux server of the test's own (its own socket), killed when dropped.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Start `command` in a session of its own, 160x40, through a shell
    /// that writes the command's exit status to a file when it exits (tmux
    /// 3.3 may mark a pane dead and never fill in its exit status).
    fn start(&self, session: &str, command: &str) {
        let status = self.status_file(session);
        let _ = std::fs::remove_file(&status);
        let wrapped = format!("{command}; echo $? > {}", status.display());
        self.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            session,
            "-x",
            "160",
            "-y",
            "40",
            "sh",
            "-c",
            &wrapped,
            ";",
            "set-option",
            "-t",
            session,
            "remain-on-exit",
            "on",
        ]);
    }

    fn status_file(&self, session: &str) -> PathBuf {
        self.socket.with_extension(format!("{session}.status"))
    }

    fn screen(&self, session: &str) -> String {
        self.run(&["capture-pane", "-p", "-t", session])
    }

    /// The command's exit status, once it has exited.
    fn exit_status(&self, session: &str) -> String {
        let file = self.status_file(session);
        wait_for("top to exit", DEADLINE, || {
            let said = std::fs::read_to_string(&file).ok()?;
            said.ends_with('\n').then(|| said.trim().to_string())
        })
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_file(&self.socket);
        for session in ["top", "again"] {
            let _ = std::fs::remove_file(self.status_file(session));
        }
    }
}

#[test]
fn the_full_screen_view_shows_the_key_sorts_and_quits_cleanly_under_tmux() {
    if !tmux_present() {
        return;
    }
    let c = contended();
    let tmux = Tmux {
        socket: std::env::temp_dir().join(format!("baton-top-{}.sock", std::process::id())),
    };
    let command = format!(
        "{} top --metrics {} --interval 0.2",
        baton_path(),
        c.metrics
    );
    tmux.start("top", &command);
    let screen = wait_for("the view to show the contended key", DEADLINE, || {
        let screen = tmux.screen("top");
        screen.contains("worker-7@host-a").then_some(screen)
    });
    let row = screen
        .lines()
        .find(|l| l.starts_with("jobs/nightly"))
        .unwrap_or_else(|| panic!("no row for the key:\n{screen}"));
    let fields: Vec<&str> = row.split_whitespace().collect();
    assert_eq!((fields[1], fields[3]), ("3", "worker-7@host-a"), "{row}");
    assert!(screen.contains("by waiting"), "{screen}");
    // `a` sorts by the oldest wait, `w` back.
    tmux.run(&["send-keys", "-t", "top", "a"]);
    wait_for("the view sorted by oldest wait", DEADLINE, || {
        tmux.screen("top").contains("by oldest wait").then_some(())
    });
    tmux.run(&["send-keys", "-t", "top", "w"]);
    wait_for("the view sorted by waiting", DEADLINE, || {
        tmux.screen("top").contains("by waiting").then_some(())
    });
    // `q` quits: the process exits 0 and the screen is the terminal's own
    // again (the alternate screen left).
    tmux.run(&["send-keys", "-t", "top", "q"]);
    assert_eq!(tmux.exit_status("top"), "0", "exited with status 0");
    let after = tmux.screen("top");
    assert!(
        !after.contains("jobs/nightly"),
        "the view's screen is gone:\n{after}"
    );

    // Ctrl+C too.
    tmux.start("again", &command);
    wait_for("the view again", DEADLINE, || {
        tmux.screen("again")
            .contains("worker-7@host-a")
            .then_some(())
    });
    tmux.run(&["send-keys", "-t", "again", "C-c"]);
    assert_eq!(tmux.exit_status("again"), "0", "exited with status 0");
    let after = tmux.screen("again");
    assert!(
        !after.contains("jobs/nightly"),
        "the view's screen is gone:\n{after}"
    );
}
