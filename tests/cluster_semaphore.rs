//! Semaphores across a failover: real `batond` processes on loopback ports.
//! The active holds a limit-3 key with three holders (each with a value)
//! and a plain mutex; it is killed (SIGKILL, by PID); the standby it
//! replicated to takes over and serves the same holders in the same slots:
//! `Q` and `I` agree with what was held, a fourth acquire waits in line,
//! another limit is refused, the old tokens keep and release their grants,
//! and a freed slot goes to the next acquire (the waiter first).
//!
//! Waits are polls with a deadline; the one short wait shows that the
//! fourth acquire is NOT granted. Nodes are killed by PID when dropped.

mod common;

use std::time::Duration;

use common::info::{field, num};
use common::nodes::{Nodes, deref_to_nodes};
use common::{DEADLINE, LineClient, token_of, wait_for};

const DETECT: &str = "0.5";
const LEASE: &str = "60";

struct Cluster {
    nodes: Nodes,
}

deref_to_nodes!(Cluster);

impl Cluster {
    /// Two nodes, node 0 active and node 1 its synced standby.
    fn formed() -> Cluster {
        let cluster = Cluster {
            nodes: Nodes::formed_pair(DETECT),
        };
        cluster.wait_standby_of(1, 0);
        cluster
    }
}

/// `A <token> <key> <slot>`: (token, slot).
fn granted_slot(answer: &str, key: &str) -> (u64, u32) {
    let fields: Vec<&str> = answer.split(' ').collect();
    match fields.as_slice() {
        ["A", token, k, slot] if *k == key => (
            token.parse().expect("a token"),
            slot.parse().expect("a slot"),
        ),
        _ => panic!("expected `A <token> {key} <slot>`, got {answer:?}"),
    }
}

/// `Q <key> <token> <ms_left> <waiting>`: (token, ms_left, waiting).
fn query(client: &mut LineClient, key: &str) -> (u64, u64, u64) {
    let answer = client.ask(&format!("Q {key}"));
    let fields: Vec<&str> = answer.split(' ').collect();
    match fields.as_slice() {
        ["Q", k, token, ms_left, waiting] if *k == key => (
            token.parse().expect("a token"),
            ms_left.parse().expect("ms_left"),
            waiting.parse().expect("waiting"),
        ),
        _ => panic!("expected `Q {key} ...`, got {answer:?}"),
    }
}

#[test]
fn a_promoted_standby_serves_a_semaphores_holders_in_their_slots_with_their_tokens() {
    let mut cluster = Cluster::formed();
    let mut client = cluster.client(0);
    let mut held = Vec::new();
    for (i, host) in ["host-a", "host-b", "host-c"].iter().enumerate() {
        let answer = client.ask(&format!("A pool {LEASE} 0 3 {host}"));
        let (token, slot) = granted_slot(&answer, "pool");
        assert_eq!(slot as usize, i, "{answer}");
        held.push(token);
    }
    // The mutex goes last: the standby holds it only after every change
    // before it (the active's changes leave in order).
    let mutex = client.acquire_now("m", LEASE);
    let before = query(&mut client, "pool");
    assert_eq!((before.0, before.2), (held[2], 0), "{before:?}");
    wait_for("the standby to hold the mutex", DEADLINE, || {
        let info = cluster.info(1)?;
        (num(&info, "held") == 2 && num(&info, "token") >= mutex).then_some(())
    });

    cluster.kill(0);
    let info = cluster.wait_serving(1);
    assert_eq!(field(&info, "active"), cluster.name(1), "{info}");
    assert_eq!(num(&info, "held"), 2, "{info}");
    assert!(num(&info, "token") >= mutex, "{info}");
    let mut client = cluster.client(1);
    let (token, ms_left, waiting) = query(&mut client, "pool");
    assert_eq!((token, waiting), (held[2], 0), "the newest holder");
    assert!(ms_left > 0 && ms_left <= 60_000, "{ms_left}");
    assert_eq!(query(&mut client, "m").0, mutex);

    // All three slots are held: a fourth acquire waits in line.
    let mut fourth = cluster.client(1);
    fourth.send(&format!("A pool {LEASE} 0 3 host-d"));
    wait_for("the fourth acquire to wait in line", DEADLINE, || {
        (query(&mut client, "pool").2 == 1).then_some(())
    });
    // Observation window: it is not granted while every slot is held.
    assert_eq!(fourth.try_recv(Duration::from_millis(200)), None);
    // The limit came across too.
    assert_eq!(
        client.ask(&format!("A pool {LEASE} 0 2")),
        "E A pool limit-mismatch"
    );

    // The old tokens hold their grants: they keep, and they release.
    assert_eq!(client.ask(&format!("K pool {} 30", held[2])), "K pool");
    assert_eq!(client.ask(&format!("R pool {}", held[1])), "R pool");
    // Slot 1 went straight to the waiter, with a new token above them all.
    let (next, slot) = granted_slot(&fourth.recv(), "pool");
    assert_eq!(slot, 1);
    assert!(next > mutex, "{next} above {mutex}");
    assert_eq!(client.ask(&format!("R pool {}", held[0])), "R pool");
    assert_eq!(client.ask(&format!("R pool {}", held[1])), "N pool");
    // Slot 0 is free now (slot 2 is still held): the lowest free one.
    let (_, slot) = granted_slot(&client.ask(&format!("A pool {LEASE} 0 3")), "pool");
    assert_eq!(slot, 0, "the lowest free slot");
    assert_eq!(client.ask(&format!("R pool {}", held[2])), "R pool");
    let (_, slot) = granted_slot(&client.ask(&format!("A pool {LEASE} 0 3")), "pool");
    assert_eq!(slot, 2);
    assert_eq!(client.ask(&format!("R m {mutex}")), "R m");
    let answer = client.ask(&format!("A m {LEASE} 0"));
    assert!(token_of(&answer) > next, "{answer}");
}
