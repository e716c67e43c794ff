//! The messages between the deciders: what an I/O loop's connection tells
//! the table core ([`Inbound`]), and what the table core and the cluster
//! core tell each other ([`TableToCluster`], [`ClusterToTable`]). The
//! threads carry them over channels (`server::messages`), the simulation
//! over in-memory queues, both through the same rounds (`server::rounds`).
//!
//! Never does: anything but describe; these are plain values.

use crate::protocol::{Key, Op, Reason, Request};
use crate::server::core::lock_table::{ConnId, Delta};

/// What an I/O loop tells the lock owner about one connection.
#[derive(Debug)]
pub enum Inbound {
    /// A well-formed request.
    Request(ConnId, Request),
    /// A request the parser refused, routed through the owner so that its
    /// `E` leaves in request order with the connection's other answers.
    Refused(ConnId, Op, Option<Key>, Reason),
    /// The connection is closing: drop its waiters and acknowledge, after
    /// which no more answers for it will come.
    Closed(ConnId),
    /// I/O loop `worker` has a first watcher of `key` (`on`: told before
    /// that connection's `W`), or no longer any (told after the `X`, the
    /// close or the `M` that ended the last). See `core/watchers.rs`.
    Watching { worker: usize, key: Key, on: bool },
}

/// What the lock owner's core tells the cluster core.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableToCluster {
    /// State changes while active, in order.
    Deltas(Vec<Delta>),
    /// The whole table, for a standby that asked.
    Snapshot {
        peer: usize,
        entries: Vec<Delta>,
        ceiling: u64,
    },
    /// Every delta before this one has been sent: the role transfer message
    /// may go to `to`.
    TransferReady { to: usize },
    /// Clients have been redirected after the role was transferred (or the
    /// node retired).
    Redirected,
    /// Deltas were dropped here (the lock owner could not queue more:
    /// the owner-to-replication bound, `messages::capacity::OWNER_DELTAS`): no standby has every change since its
    /// snapshot, so each gets a fresh one.
    DeltasLost,
    /// A standby's lock owner refused part of what its active replicated
    /// (`why`: a grant past its `--max-keys`, say): it does not hold that
    /// state, so the link it came on goes, as for a message the cluster
    /// core refuses. Said once per snapshot taken; `snapshot` is the `seq`
    /// of the last [`ClusterToTable::Snapshot`] before the refused state (0
    /// if none), so that the cluster core ignores a refusal that a newer
    /// snapshot has made stale and drops only the link that carried it.
    StateRefused { why: &'static str, snapshot: u64 },
}

/// What the cluster core tells the lock owner's core.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterToTable {
    /// Serve, with tokens above `floor`; `failover` when promoted by an
    /// election (state may be missing), not by a role transfer.
    BecomeActive { floor: u64, failover: bool },
    /// Do not serve; redirect clients to `active` (its address), or `M -`.
    Follow { active: Option<String> },
    /// Transferring the active role to `to`: hold requests back, and answer
    /// `TransferReady` after this round's deltas.
    StartTransfer { to: usize },
    /// The transfer failed: serve again.
    AbortTransfer,
    /// `to` took the role over: redirect every held request and waiter to it.
    FinishTransfer { to: String },
    /// Shutting down with no successor: answer every waiter `M -`, then
    /// answer `Redirected`.
    Retire,
    /// Replace the table with the active's; `seq` numbers the snapshots
    /// the cluster core passed on (from 1), for `StateRefused`.
    Snapshot { seq: u64, entries: Vec<Delta> },
    /// Apply the active's deltas.
    Deltas(Vec<Delta>),
    /// Lift the token counter above this.
    Observe(u64),
    /// Send a snapshot for `peer`.
    SnapshotWanted { peer: usize },
}

impl ClusterToTable {
    /// What the message holds, in entries: one, plus one per delta or
    /// snapshot entry (what `messages::capacity::CLUSTER_ENTRIES` counts).
    pub fn weight(&self) -> usize {
        match self {
            ClusterToTable::Snapshot { entries, .. } | ClusterToTable::Deltas(entries) => {
                entries.len().saturating_add(1)
            }
            _ => 1,
        }
    }
}
