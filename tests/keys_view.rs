//! The contention view of a real node's metrics port (`GET /keys`,
//! `GET /keys/<key>`): what it shows of contended and held keys on an
//! active and on a standby, and how it refuses bad requests and floods
//! without the lock port noticing.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use common::http::try_exchange;
use common::nodes::two_nodes_with_metrics;
use common::{DEADLINE, Node, free_port, token_of, wait_for};
use serde_json::Value as Json;

fn get(addr: SocketAddr, target: &str) -> (u16, Json) {
    let request = format!("GET {target} HTTP/1.1\r\nHost: test\r\n\r\n");
    let (code, content_type, body) = try_exchange(addr, request.as_bytes()).expect("a response");
    assert_eq!(content_type, "application/json", "{target}: {body}");
    let json = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{target}: {e}: {body}"));
    (code, json)
}

fn get_ok(addr: SocketAddr, target: &str) -> Json {
    let (code, json) = get(addr, target);
    assert_eq!(code, 200, "{target}: {json}");
    json
}

fn metrics_node() -> (Node, SocketAddr) {
    let listen = format!("127.0.0.1:{}", free_port());
    let node = Node::start(&["--metrics", listen.as_str()]);
    (node, listen.parse().expect("addr"))
}

#[test]
fn the_view_lists_contended_keys_with_holders_and_looks_keys_up() {
    let (node, metrics) = metrics_node();
    let mut holder = node.client();
    let started = Instant::now();
    let token = token_of(&holder.ask("A jobs/nightly 60 0 1 worker-7@host-a"));
    let other = holder.acquire_now("calm", "60");
    let mut waiters: Vec<_> = (0..3).map(|_| node.client()).collect();
    for w in &mut waiters {
        w.send("A jobs/nightly 60 0 1");
    }
    let mut second = node.client();
    second.acquire_now("pair", "60");
    second.send("A pair 60 0");
    wait_for("four waiters", DEADLINE, || {
        (holder.query("jobs/nightly").waiting == 3 && holder.query("pair").waiting == 1)
            .then_some(())
    });

    let list = get_ok(metrics, "/keys");
    assert_eq!(list["role"], "active");
    assert_eq!(list["node"].as_str().map(str::is_empty), Some(false));
    assert_eq!(list["contended"], 2);
    let keys = list["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 2);
    let first = &keys[0];
    assert_eq!(first["key"], "jobs/nightly", "most waiting first");
    assert_eq!(
        (first["limit"].as_u64(), first["waiting"].as_u64()),
        (Some(1), Some(3))
    );
    let holders = first["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0]["token"], token.to_string());
    assert_eq!(holders[0]["slot"], 0);
    assert_eq!(holders[0]["value"], "worker-7@host-a");
    let ms_left = holders[0]["ms_left"].as_u64().expect("ms_left");
    assert!(ms_left > 0 && ms_left <= 60_000, "{ms_left}");
    let held = holders[0]["held_ms"].as_u64().expect("held_ms");
    assert!(
        held <= started.elapsed().as_millis() as u64 + 1_000,
        "{held} ms held, within a clock's step"
    );
    assert_eq!(keys[1]["key"], "pair");
    assert!(keys[1]["holders"][0]["value"].is_null());
    let oldest = first["oldest_wait_ms"].as_u64().expect("oldest_wait_ms");
    assert!(
        oldest <= started.elapsed().as_millis() as u64 + 1_000,
        "{oldest} ms waited, within a clock's rounding"
    );

    // By the oldest waiter: "jobs/nightly"'s came first. top limits.
    let by_age = get_ok(metrics, "/keys?by=age&top=1");
    assert_eq!(by_age["contended"], 2);
    assert_eq!(by_age["keys"].as_array().map(Vec::len), Some(1));
    assert_eq!(by_age["keys"][0]["key"], "jobs/nightly");

    // One key, percent-encoded or not; held and not contended; unknown.
    let one = get_ok(metrics, "/keys/jobs%2Fnightly");
    assert_eq!(one["key"], "jobs/nightly");
    assert_eq!(one["waiting"], 3);
    let calm = get_ok(metrics, "/keys/calm");
    assert_eq!(
        (calm["waiting"].as_u64(), calm["oldest_wait_ms"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(calm["holders"][0]["token"], other.to_string());
    let (code, missing) = get(metrics, "/keys/nobody");
    assert_eq!(code, 404);
    assert_eq!(missing["key"], "nobody");

    // Held time and waiting time grow as the clock goes.
    wait_for(
        "the holder's held_ms and the oldest wait to pass 200 ms",
        DEADLINE,
        || {
            let one = get_ok(metrics, "/keys/jobs/nightly");
            let held = one["holders"][0]["held_ms"].as_u64()?;
            (held >= 200 && one["oldest_wait_ms"].as_u64()? >= 200).then_some(())
        },
    );

    // The waiters go: nothing is contended, the holder still shows.
    drop(waiters);
    drop(second);
    wait_for("nothing contended", DEADLINE, || {
        let list = get_ok(metrics, "/keys?top=1000");
        (list["contended"] == 0 && list["keys"] == serde_json::json!([])).then_some(())
    });
    assert_eq!(get_ok(metrics, "/keys/jobs/nightly")["waiting"], 0);
    assert_eq!(
        holder.ask(&format!("R jobs/nightly {token}")),
        "R jobs/nightly"
    );
    assert_eq!(get(metrics, "/keys/jobs/nightly").0, 404);
}

#[test]
fn keys_that_are_not_utf8_are_looked_up_by_their_bytes_and_shown_escaped() {
    let (node, metrics) = metrics_node();
    let mut client = node.client();
    client.send_raw(b"A caf\xc3\xa9\"\\\xe9 60 0 1 v\xff\n");
    let token = token_of(&client.recv());
    let one = get_ok(metrics, "/keys/caf%C3%A9%22%5C%E9");
    assert_eq!(one["key"], "café\"\\\u{e9}");
    assert_eq!(one["holders"][0]["value"], "v\u{ff}");
    assert_eq!(one["holders"][0]["token"], token.to_string());
}

#[test]
fn bad_view_requests_are_refused_and_a_flood_is_bounded_without_the_lock_port_noticing() {
    let (node, metrics) = metrics_node();
    let mut client = node.client();
    let token = client.acquire_now("held", "60");
    let long_key = "k".repeat(251);
    let cases: Vec<(String, u16)> = vec![
        ("GET /keys?top=0 HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400),
        ("GET /keys?top=1001 HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400),
        ("GET /keys?top=junk HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400),
        (
            "GET /keys?top=5&top=5 HTTP/1.1\r\nHost: x\r\n\r\n".into(),
            400,
        ),
        ("GET /keys?by=size HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400),
        ("GET /keys?sort=age HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400),
        ("GET /keys/ HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400),
        ("GET /keys/%G1 HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400),
        ("GET /keys/ab% HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400),
        ("GET /keys/a%20b HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400),
        ("GET /keys/a%7F HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400),
        ("GET /keys/held?x=1 HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400),
        (
            format!("GET /keys/{long_key} HTTP/1.1\r\nHost: x\r\n\r\n"),
            400,
        ),
        ("GET /keys HTTP/1.1\r\n\r\n".into(), 400),
        ("POST /keys HTTP/1.1\r\nHost: x\r\n\r\n".into(), 405),
        ("DELETE /keys/held HTTP/1.1\r\nHost: x\r\n\r\n".into(), 405),
        ("HEAD /keys?top=5 HTTP/1.1\r\nHost: x\r\n\r\n".into(), 405),
        ("GET /keysx HTTP/1.1\r\nHost: x\r\n\r\n".into(), 404),
        ("GET /key/held HTTP/1.1\r\nHost: x\r\n\r\n".into(), 404),
    ];
    for (request, want) in &cases {
        let (code, _, body) = try_exchange(metrics, request.as_bytes()).expect("an answer");
        assert_eq!(code, *want, "{request:?}: {body}");
    }
    // A good key not held: 404 with a JSON body.
    assert_eq!(get(metrics, "/keys/free").0, 404);

    // A flood: 20 view requests at once; at most 16 connections are
    // served, the rest closed unanswered; every one served is a 200.
    let mut many: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(metrics).expect("connect"))
        .collect();
    for (i, stream) in many.iter_mut().enumerate() {
        let target = if i % 2 == 0 {
            "/keys?top=1000&by=age"
        } else {
            "/keys/held"
        };
        let _ = write!(stream, "GET {target} HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    let mut served = 0;
    for stream in &mut many {
        stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
        let mut said = Vec::new();
        let _ = stream.read_to_end(&mut said);
        if said.starts_with(b"HTTP/1.1 200 OK\r\n") {
            served += 1;
        } else {
            assert_eq!(said, b"", "refused connections get no answer");
        }
    }
    assert!((1..=16).contains(&served), "{served} of 20 served");
    drop(many);
    // Both ports still serve.
    let one = wait_for("the view to be served again", DEADLINE, || {
        let request = b"GET /keys/held HTTP/1.1\r\nHost: x\r\n\r\n";
        let (code, _, body) = try_exchange(metrics, request)?;
        (code == 200).then(|| serde_json::from_str::<Json>(&body).expect("JSON"))
    });
    assert_eq!(one["holders"][0]["token"], token.to_string());
    assert_eq!(client.query("held").token, token);
}

#[test]
fn a_standby_shows_its_replicated_holders_and_no_waiters() {
    let (first, _second, m) = two_nodes_with_metrics(&[]);
    wait_for("node 0 active, node 1 its standby", DEADLINE, || {
        let a = get_ok(m[0], "/keys");
        let b = get_ok(m[1], "/keys");
        (a["role"] == "active" && b["role"] == "standby").then_some(())
    });
    let mut holder = first.client();
    let token = token_of(&holder.ask("A lead 60 0 1 10.0.0.7:8080"));
    let mut waiter = first.client();
    waiter.send("A lead 60 0 1");
    wait_for("the waiter in line", DEADLINE, || {
        (holder.query("lead").waiting == 1).then_some(())
    });
    assert_eq!(get_ok(m[0], "/keys")["contended"], 1);
    let replicated = wait_for("the standby to hold the key", DEADLINE, || {
        let (code, json) = get(m[1], "/keys/lead");
        (code == 200).then_some(json)
    });
    assert_eq!(replicated["waiting"], 0, "waiters are the active's");
    assert_eq!(replicated["oldest_wait_ms"], 0);
    assert_eq!(replicated["holders"][0]["token"], token.to_string());
    assert_eq!(replicated["holders"][0]["value"], "10.0.0.7:8080");
    let standby = get_ok(m[1], "/keys");
    assert_eq!(
        (standby["role"].as_str(), standby["contended"].as_u64()),
        (Some("standby"), Some(0))
    );
}

#[test]
fn back_to_back_views_each_see_every_waiter_queued_before_them() {
    // The owner is asked for a view at most once per 100 ms, but a request
    // still waits for a view taken after it arrived: never an older one.
    let (node, metrics) = metrics_node();
    let mut holder = node.client();
    let mut waiters = Vec::new();
    for i in 1..=6 {
        let key = format!("k{i}");
        holder.acquire_now(&key, "60");
        let mut waiter = node.client();
        waiter.send(&format!("A {key} 60 0"));
        wait_for("the waiter in line", DEADLINE, || {
            (holder.query(&key).waiting == 1).then_some(())
        });
        waiters.push(waiter);
        assert_eq!(get_ok(metrics, "/keys?top=1")["contended"], i, "view {i}");
        assert_eq!(get_ok(metrics, &format!("/keys/{key}"))["waiting"], 1);
    }
}
