//! The nodes of a test cluster on loopback ports, and what every cluster
//! harness does with them: start one on its port (again after a kill or an
//! exit) with the flags every cluster node has (`--bind`, `--port`,
//! `--peers`) before the harness's own, kill it (by PID, in `Node`'s drop),
//! see it exit, connect, poll its `I` (on a fresh connection, or on a kept
//! one for fast polls) until it serves or follows, and print every node's
//! log (those gone too) when the test fails. Which other flags and
//! environment a node gets is the harness's.

use std::net::SocketAddr;

use super::info::{Probe, num, probe, serving, standby_of};
use super::{DEADLINE, LineClient, Node, free_port_run, wait_for};

/// Start `batond --bind 127.0.0.1 --port <port> --peers <peers> <flags>`,
/// with `env` on top of the test's environment; returns once it listens.
/// `peers` is the comma-separated `--peers` list. The one place a test
/// cluster node's command line is put together.
pub fn start_node(port: u16, peers: &str, flags: &[&str], env: &[(&str, &str)]) -> Node {
    let port_arg = port.to_string();
    let mut args = vec![
        "--bind",
        "127.0.0.1",
        "--port",
        port_arg.as_str(),
        "--peers",
        peers,
    ];
    args.extend_from_slice(flags);
    Node::start_raw_with_env(&args, Some(port), env)
}

/// A two-node cluster on free loopback ports, each node with a metrics
/// port of its own (`--metrics`), the test cluster key and `flags`: node 0
/// is started first (so it becomes the active), then node 1. The two nodes
/// and their metrics addresses, node 0's first.
pub fn two_nodes_with_metrics(flags: &[&str]) -> (Node, Node, [SocketAddr; 2]) {
    let first = free_port_run(4);
    let ports = [first, first + 1];
    let metrics = [first + 2, first + 3].map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
    let peers = format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1]);
    let start = |i: usize| {
        let metrics = metrics[i].to_string();
        let mut all = vec![
            "--cluster-key-file",
            super::cluster_key_file(),
            "--metrics",
            metrics.as_str(),
        ];
        all.extend_from_slice(flags);
        start_node(ports[i], &peers, &all, &[])
    };
    let node0 = start(0);
    let node1 = start(1);
    (node0, node1, metrics)
}

/// `Deref` and `DerefMut` from a harness to its field `nodes: Nodes`, so
/// that a test calls the set's methods on the harness itself.
#[allow(unused_macros)]
macro_rules! deref_to_nodes {
    ($harness:ty) => {
        impl std::ops::Deref for $harness {
            type Target = $crate::common::nodes::Nodes;
            fn deref(&self) -> &Self::Target {
                &self.nodes
            }
        }

        impl std::ops::DerefMut for $harness {
            fn deref_mut(&mut self) -> &mut Self::Target {
                &mut self.nodes
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use deref_to_nodes;

pub struct Nodes {
    ports: Vec<u16>,
    nodes: Vec<Option<Node>>,
    /// Logs of nodes that are gone, for a failure report.
    old_logs: Vec<(usize, String)>,
}

impl Nodes {
    /// Nodes listening (once started) on `ports`, node i on `ports[i]`.
    pub fn new(ports: Vec<u16>) -> Nodes {
        Nodes {
            nodes: ports.iter().map(|_| None).collect(),
            ports,
            old_logs: Vec::new(),
        }
    }

    /// `n` nodes on free loopback ports (consecutive ones); none started.
    pub fn on_free_ports(n: usize) -> Nodes {
        let n = u16::try_from(n).expect("a few nodes");
        let first = free_port_run(n);
        Nodes::new((first..first + n).collect())
    }

    pub fn len(&self) -> usize {
        self.ports.len()
    }

    pub fn port(&self, i: usize) -> u16 {
        self.ports[i]
    }

    /// Node `i`'s entry in `--peers` (and its `node=` in `I`).
    pub fn name(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.ports[i])
    }

    /// Every node's name, in order: the `--peers` list.
    pub fn names(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.name(i)).collect()
    }

    pub fn addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[i]))
    }

    /// Start (or restart) node `i` on its port with this set's `--peers`,
    /// then `flags`, and `env` on top of the test's environment (see
    /// [`start_node`]); returns once it listens.
    pub fn start_with(&mut self, i: usize, flags: &[&str], env: &[(&str, &str)]) {
        assert!(self.nodes[i].is_none(), "node {i} is already running");
        let node = start_node(self.port(i), &self.names().join(","), flags, env);
        self.nodes[i] = Some(node);
    }

    /// Start (or restart) node `i` as a member of this set's cluster: the
    /// test cluster key, failure detected in `detect` seconds.
    pub fn start_clustered(&mut self, i: usize, detect: &str) {
        let flags = [
            "--detect",
            detect,
            "--cluster-key-file",
            super::cluster_key_file(),
        ];
        self.start_with(i, &flags, &[]);
    }

    /// Two nodes of one cluster, both started, node 0 active with node 1
    /// its synced standby.
    pub fn formed_pair(detect: &str) -> Nodes {
        let mut nodes = Nodes::on_free_ports(2);
        nodes.start_clustered(0, detect);
        nodes.start_clustered(1, detect);
        nodes.wait_synced_standbys(0, 1);
        nodes
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].is_some()
    }

    pub fn node(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().expect("node is running")
    }

    /// SIGKILL node `i` and reap it (by PID, in `Node`'s drop: SIGCONT,
    /// SIGKILL, wait).
    pub fn kill(&mut self, i: usize) {
        self.remove(i);
    }

    /// Wait until node `i` exits by itself (after a SIGTERM, say), failing
    /// the test after DEADLINE; its exit code. Then it is out of the set
    /// (and can be started again); reaped already, it is signalled no more.
    pub fn wait_exited(&mut self, i: usize) -> Option<i32> {
        let code = self.nodes[i]
            .as_mut()
            .expect("node is running")
            .wait_exit(DEADLINE);
        self.remove(i);
        code
    }

    /// Take node `i` out of the set, its log kept for a failure report, and
    /// drop it: a running one is killed, a reaped one left alone.
    fn remove(&mut self, i: usize) {
        let node = self.nodes[i].take().expect("node is running");
        self.old_logs.push((i, node.log()));
        drop(node);
    }

    /// SIGTERM node `i` (a graceful stop) and wait until it exits; its exit
    /// code.
    pub fn terminate(&mut self, i: usize) -> Option<i32> {
        self.node(i).signal("TERM");
        self.wait_exited(i)
    }

    /// The logs of the nodes killed or exited so far, with their indexes,
    /// in the order they went.
    pub fn old_logs(&self) -> &[(usize, String)] {
        &self.old_logs
    }

    pub fn client(&self, i: usize) -> LineClient {
        LineClient::connect(self.addr(i))
    }

    /// One `I` on node `i` over a fresh connection; None if it does not
    /// answer within half a second (not running, stopped, refusing).
    pub fn info(&self, i: usize) -> Option<String> {
        probe(self.addr(i), "I")
    }

    /// A connection to node `i` kept for polling it as fast as it answers
    /// (see [`Probe`]).
    pub fn probe(&self, i: usize) -> Probe {
        Probe::new(self.addr(i))
    }

    /// `I` on node `i`, failing the test if it does not answer.
    pub fn must_info(&self, i: usize) -> String {
        self.info(i)
            .unwrap_or_else(|| panic!("node {i} does not answer I"))
    }

    /// Wait until node `i`'s `I` passes `ok`; that `I`.
    pub fn wait_info(&self, i: usize, what: &str, ok: impl Fn(&str) -> bool) -> String {
        wait_for(&format!("node {i} {what}"), DEADLINE, || {
            self.info(i).filter(|info| ok(info))
        })
    }

    /// Wait until node `i` serves (`role=active state=active`).
    pub fn wait_serving(&self, i: usize) -> String {
        self.wait_info(i, "to serve", serving)
    }

    /// Wait until node `i` is a standby that names node `active` as active.
    pub fn wait_standby_of(&self, i: usize, active: usize) -> String {
        let name = self.name(active);
        self.wait_info(i, &format!("to follow node {active}"), |info| {
            standby_of(info, &name)
        })
    }

    /// Wait until active node `i` counts `n` live standbys holding its
    /// whole state (`standbys=n`): from then on it can hand over to them,
    /// and they win elections over nodes without state.
    pub fn wait_synced_standbys(&self, i: usize, n: u64) -> String {
        self.wait_info(i, &format!("to have {n} synced standbys"), |info| {
            serving(info) && num(info, "standbys") == n
        })
    }

    /// Wait until node `i` reports `held=n`.
    pub fn wait_held(&self, i: usize, n: u64) -> String {
        self.wait_info(i, &format!("to hold {n} keys"), |info| {
            num(info, "held") == n
        })
    }

    /// Wait until nodes `a` and `b` have each brought up their link to the
    /// other. A node that starts before a peer listens dials it again only
    /// after a backoff; until then that peer has never heard its heartbeat,
    /// so it would not count it in an election.
    pub fn wait_linked(&self, a: usize, b: usize) {
        for (from, to) in [(a, b), (b, a)] {
            let line = format!("replication: link to {} is up", self.name(to));
            wait_for(
                &format!("node {from}'s link to node {to}"),
                DEADLINE,
                || self.node(from).log().contains(&line).then_some(()),
            );
        }
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for (i, log) in &self.old_logs {
                eprintln!("----- log of node {i} (before it went) -----\n{log}");
            }
            for (i, node) in self.nodes.iter().enumerate() {
                if let Some(node) = node {
                    eprintln!("----- log of node {i} -----\n{}", node.log());
                }
            }
        }
    }
}
