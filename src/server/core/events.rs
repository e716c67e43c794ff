//! The messages between the deciders: what an I/O loop's connection tells
//! the table core ([`Inbound`]), and what the table core and the cluster
//! core tell each other ([`TableToCluster`], [`ClusterToTable`]), and the
//! names and changes they carry: a client connection ([`ConnId`]) and a
//! change of lock state for the standbys ([`Delta`]). The
//! threads carry them over channels (`server::messages`), the simulation
//! over in-memory queues, both through the same rounds (`server::rounds`).
//!
//! Never does: anything but describe; these are plain values.

use crate::protocol::{Key, Op, Reason, Request, Value};

/// A client connection, named by the I/O loop that owns it: loop index in the
/// top 8 bits, slab slot in the next 24, a serial in the low 32 so that an
/// answer for a closed connection never reaches a new one in the same slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// The slab slot no connection has: [`ConnId::watchers`] names it.
const WATCHERS_SLOT: usize = (1 << 24) - 1;

impl ConnId {
    pub fn new(worker: usize, slot: usize, serial: u32) -> ConnId {
        debug_assert!(worker < 256 && slot < WATCHERS_SLOT);
        ConnId(((worker as u64) << 56) | ((slot as u64) << 32) | serial as u64)
    }
    /// Not a connection: the watchers of I/O loop `worker`. An answer
    /// addressed so is a change line for every connection of that loop
    /// that watches its key (`core/watchers.rs`), kept in order with the
    /// loop's answers.
    pub fn watchers(worker: usize) -> ConnId {
        ConnId(((worker as u64) << 56) | ((WATCHERS_SLOT as u64) << 32))
    }
    /// This names a loop's watchers ([`ConnId::watchers`]), no connection.
    pub fn is_watchers(self) -> bool {
        self.slot() == WATCHERS_SLOT
    }
    pub fn worker(self) -> usize {
        (self.0 >> 56) as usize
    }
    pub fn slot(self) -> usize {
        ((self.0 >> 32) & 0xFF_FFFF) as usize
    }
    pub fn serial(self) -> u32 {
        self.0 as u32
    }
}

/// `conn 2-17`: the I/O loop, then that loop's connection serial, for logs
/// (the slab slot is an internal detail and is left out).
impl std::fmt::Display for ConnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "conn {}-{}", self.worker(), self.serial())
    }
}

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
    /// A piece of the table for standby `peer`, which asked for it with
    /// `ask` (`ClusterToTable::SnapshotWanted`). The pieces go one per
    /// round of the lock owner at most, in the same queue as the deltas,
    /// so that a piece and the deltas around it reach the standby in the
    /// owner's order: a key the cursor has passed is kept current by the
    /// deltas, one it has not reached comes in a later piece. The first
    /// piece carries the token ceiling (`Some`) and the number of grants
    /// the table held then (for the log); the last says `last`.
    SnapshotChunk {
        peer: usize,
        ask: u64,
        ceiling: Option<u64>,
        held: usize,
        entries: Vec<Delta>,
        last: bool,
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
    /// A standby's lock owner applied the whole snapshot numbered `seq`
    /// (`ClusterToTable::SnapshotEnd`) and refused none of it: only now does
    /// the standby hold its active's state.
    SnapshotTaken { seq: u64 },
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
    /// the cluster core passed on (from 1), for `StateRefused`. A snapshot
    /// that streams in pieces is passed as one with no entries (the table
    /// is emptied) followed by its entries and the active's deltas as
    /// `Deltas`, in the order they came.
    Snapshot { seq: u64, entries: Vec<Delta> },
    /// Apply the active's deltas.
    Deltas(Vec<Delta>),
    /// The snapshot numbered `seq` ended: everything of it was passed on.
    /// Answered `TableToCluster::SnapshotTaken` unless part of it was
    /// refused (`StateRefused` was said instead).
    SnapshotEnd { seq: u64 },
    /// Lift the token counter above this.
    Observe(u64),
    /// Send a snapshot for `peer`, in pieces tagged `ask` (a newer ask for
    /// the same peer starts its pieces again from the start).
    SnapshotWanted { peer: usize, ask: u64 },
    /// Stop sending the pieces of a snapshot to `peer` (its link went, or
    /// this node no longer leads it).
    SnapshotStop { peer: usize },
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

/// A change of lock state, as replicated from the active to its standbys.
/// One grant each: a semaphore's holders are a `Grant` per slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delta {
    /// `key`, of `limit`, is held in `slot` by `token` for `ms_left` more
    /// milliseconds, carrying `value` (a new grant, a handover, or an
    /// extension). A standby puts it in that slot: its grant with the same
    /// token is extended; an older grant in the slot was handed over (its
    /// end coalesced away) and is replaced; a key held there with another
    /// limit is the active's no more, and goes first.
    Grant {
        key: Key,
        token: u64,
        ms_left: u64,
        limit: u32,
        slot: u32,
        value: Option<Value>,
    },
    /// The grant of `key` in `slot`, held by `token`, ended (released or
    /// expired, nobody waiting). A standby frees the key's grant in that
    /// slot if it is this token or an older one (the grants between may
    /// have been coalesced away); the key goes with its last grant.
    Free { key: Key, token: u64, slot: u32 },
    /// No token at or above this has been issued: a promoted node starts above it.
    Ceiling(u64),
}

impl Delta {
    /// A plain mutex's grant: limit 1, slot 0, no value.
    pub fn grant(key: Key, token: u64, ms_left: u64) -> Delta {
        Delta::Grant {
            key,
            token,
            ms_left,
            limit: 1,
            slot: 0,
            value: None,
        }
    }

    /// The end of a plain mutex's grant (slot 0).
    pub fn free(key: Key, token: u64) -> Delta {
        Delta::Free {
            key,
            token,
            slot: 0,
        }
    }
}
