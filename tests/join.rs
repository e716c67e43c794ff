//! A standby joining an active that holds many keys: the snapshot goes in
//! pieces between the active's rounds, with the active's changes between
//! them (docs/cluster.md, "How a standby joins"). Real `batond` processes on
//! loopback ports, checked over TCP.
//!
//! - A join in pieces keeps every key, token and lease: keys are granted,
//!   released and granted afresh on the active all through the join; once
//!   the standby holds the state, the active hands its role over (SIGTERM)
//!   and the new active holds exactly what the old one held.
//! - A standby killed in the middle of its snapshot leaves the active
//!   unharmed: it serves on, holds every key, counts no standby, and takes
//!   the standby back (a fresh snapshot) when it restarts.
//!
//! Waits are polls with a deadline; every node is killed by PID when the
//! test ends.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::info::num;
use common::nodes::Nodes;
use common::{DEADLINE, LineClient, token_of, wait_for};

/// The flags of every node: the tests' cluster key and a short `--detect`.
fn flags() -> Vec<&'static str> {
    vec![
        "--cluster-key-file",
        common::cluster_key_file(),
        "--detect",
        "0.5",
    ]
}

/// Lease of the keys the tests grant (seconds): far longer than a test.
const LEASE_S: u64 = 600;

/// Acquire `keys` on `client`, pipelined a thousand at a time; each key's
/// token. `extra` is appended to each acquire (a limit and a value).
fn acquire_all(client: &mut LineClient, keys: &[String], extra: &str) -> Vec<u64> {
    let mut tokens = Vec::with_capacity(keys.len());
    for batch in keys.chunks(1000) {
        let lines: Vec<String> = batch
            .iter()
            .map(|k| format!("A {k} {LEASE_S} 0{extra}"))
            .collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        client.send_lines(&refs);
        for k in batch {
            let answer = client.recv();
            assert!(
                answer.starts_with("A ") && answer.split(' ').nth(2) == Some(k.as_str()),
                "{k}: {answer:?}"
            );
            tokens.push(token_of(&answer));
        }
    }
    tokens
}

/// The active's log line that ends a snapshot: how many pieces it took.
fn pieces_sent(log: &str) -> Option<u64> {
    log.lines()
        .rev()
        .filter(|l| l.contains("sent a snapshot of"))
        .find_map(|l| {
            l.rsplit(" in ")
                .next()?
                .strip_suffix(" pieces")?
                .parse()
                .ok()
        })
}

#[test]
fn a_join_in_pieces_keeps_every_key_token_and_lease() {
    let mut nodes = Nodes::on_free_ports(2);
    let flags = flags();
    nodes.start_with(0, &flags, &[]);
    nodes.wait_serving(0);
    // 20,000 mutexes and 500 semaphores of two holders, with values.
    let mut client = nodes.client(0);
    let granted_from = Instant::now();
    let keys: Vec<String> = (0..20_000).map(|i| format!("join/k{i}")).collect();
    let tokens = acquire_all(&mut client, &keys, "");
    let sems: Vec<String> = (0..500).map(|i| format!("join/s{i}")).collect();
    acquire_all(&mut client, &sems, " 3 first");
    let newest_sem = acquire_all(&mut client, &sems, " 3 second");
    let mut want: BTreeMap<String, u64> = keys.iter().cloned().zip(tokens).collect();
    want.extend(sems.iter().cloned().zip(newest_sem));

    // All through the join, a client releases loaded keys and grants
    // fresh ones, on both sides of wherever the snapshot has got to.
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let stop = Arc::clone(&stop);
        let mut client = nodes.client(0);
        let mut want = want.clone();
        std::thread::spawn(move || {
            let mut freed = Vec::new();
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) || n < 200 {
                // Spread over the table: the first keys, the last, between.
                let victim = format!("join/k{}", (n * 7919) % 20_000);
                if let Some(token) = want.remove(&victim) {
                    assert_eq!(
                        client.ask(&format!("R {victim} {token}")),
                        format!("R {victim}")
                    );
                    freed.push(victim);
                }
                let fresh = format!("join/new{n}");
                let token = client.acquire_now(&fresh, &LEASE_S.to_string());
                want.insert(fresh, token);
                n += 1;
            }
            (want, freed)
        })
    };
    nodes.start_with(1, &flags, &[]);
    nodes.wait_synced_standbys(0, 1);
    stop.store(true, Ordering::Relaxed);
    let (want, freed) = churn.join().expect("the churn thread");
    assert!(!freed.is_empty());
    let pieces = wait_for("the active to log its snapshot's end", DEADLINE, || {
        pieces_sent(&nodes.node(0).log())
    });
    assert!(pieces > 1, "the snapshot went in {pieces} pieces");

    // A graceful stop hands the role over with every change since: the new
    // active holds exactly the old one's keys.
    assert_eq!(nodes.terminate(0), Some(0));
    nodes.wait_serving(1);
    let mut client = nodes.client(1);
    for (key, token) in &want {
        let q = client.query(key);
        // Granted after `granted_from`: at most that long ago.
        let elapsed_ms = granted_from.elapsed().as_millis() as u64;
        assert_eq!(q.token, *token, "{key}");
        assert!(
            q.ms_left <= LEASE_S * 1000 && q.ms_left + elapsed_ms >= LEASE_S * 1000,
            "{key}: {} ms left {elapsed_ms} ms after the first grant",
            q.ms_left
        );
    }
    for key in &freed {
        assert_eq!(client.query(key).token, 0, "{key} was released");
    }
    for key in sems.iter().take(50) {
        let line = client.ask(&format!("W {key}"));
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.get(3), Some(&"2"), "two holders of {key}: {line:?}");
        assert_eq!(fields.get(5), Some(&"second"), "{line:?}");
        assert_eq!(client.ask(&format!("X {key}")), format!("X {key}"));
    }
    let info = client.info();
    assert_eq!(num(&info, "held"), want.len() as u64, "{info}");
}

#[test]
fn a_standby_killed_in_the_middle_of_its_snapshot_leaves_the_active_unharmed() {
    let mut nodes = Nodes::on_free_ports(2);
    let flags = flags();
    nodes.start_with(0, &flags, &[]);
    nodes.wait_serving(0);
    let mut client = nodes.client(0);
    let keys: Vec<String> = (0..100_000).map(|i| format!("kill/k{i}")).collect();
    let tokens = acquire_all(&mut client, &keys, "");
    // Its "taking a snapshot" line is a debug one (a standby refusing the
    // state would repeat it every round).
    nodes.start_with(1, &flags, &[("RUST_LOG", "debug")]);
    wait_for("the standby to begin its snapshot", DEADLINE, || {
        nodes
            .node(1)
            .log()
            .contains("taking a snapshot from")
            .then_some(())
    });
    nodes.kill(1);
    // The active serves on at once and holds every key.
    let fresh = client.acquire_now("kill/after", "10");
    assert!(fresh > *tokens.iter().max().expect("tokens"));
    for (i, key) in keys.iter().enumerate().step_by(97) {
        assert_eq!(client.query(key).token, tokens[i], "{key}");
    }
    let info = nodes.wait_info(0, "to count no standby", |info| num(info, "standbys") == 0);
    assert_eq!(num(&info, "held"), keys.len() as u64 + 1, "{info}");
    // The standby restarts and takes the state afresh.
    nodes.start_with(1, &flags, &[]);
    let started = Instant::now();
    while num(&nodes.must_info(0), "standbys") != 1 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the restarted standby never synced"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!nodes.node(0).log().contains("panicked"));
}
