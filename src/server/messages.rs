//! Every message that crosses a thread boundary inside a node, in one place.
//!
//! Owns: the types on the node's channels — I/O loop → lock owner
//! ([`ToOwner`]), lock owner → I/O loop ([`OwnerBatch`]), lock owner ⇄
//! replication ([`TableToCluster`], [`ClusterToTable`], defined with the
//! cores in `core::events` and carried here), anyone →
//! replication ([`ToRepl`]) — and the capacity of each channel with the
//! policy for when it fills ([`capacity`]). The threads import these from
//! here, never from each other, so no thread module depends on another.
//!
//! Three different things are called a "handoff" in a lock server; the
//! names here keep them apart:
//! - *adopting a link*: an I/O loop passes a connection that turned out to
//!   be a peer's to the replication thread ([`ToRepl::AdoptPeerLink`]);
//! - *granting to the next waiter*: a release or an expiry gives the key to
//!   the front of its queue (the lock table's business, no message here);
//! - *transferring the active role*: an active node gives the role to a
//!   higher-priority or surviving standby ([`ClusterToTable::StartTransfer`]
//!   and the rest of that family).
//!
//! Never does: anything but define data.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crossbeam_channel::Sender;
use mio::Waker;

use crate::protocol::Answer;
use crate::server::core::contention::KeysAsk;
use crate::server::core::events::ConnId;
pub use crate::server::core::events::{ClusterToTable, Inbound, TableToCluster};

/// Channel capacities (in messages) and what a sender does when one is full.
/// Every channel of the node is bounded by one of these.
pub mod capacity {
    /// I/O loop → lock owner, one batch of requests per message. Full: the
    /// loop keeps its batch, stops reading its clients, and retries on its
    /// next round (backpressure reaches the clients through TCP).
    pub const TO_OWNER: usize = 4096;
    /// Lock owner → one I/O loop, one batch of answers per message. Full:
    /// the owner keeps the batch (answers stay in order behind it) and
    /// retries on its next round, which comes within a millisecond.
    pub const TO_IO_LOOP: usize = 1024;
    /// Anything → replication. Full: the lock owner keeps its messages in
    /// order and retries on its next round; an I/O loop closes the peer
    /// connection it wanted to pass on (the peer redials).
    pub const TO_REPL: usize = 4096;
    /// Deltas the lock owner keeps while the channel to replication is
    /// full (the replication thread has not run for seconds: it only
    /// copies deltas into its peers' bounded buffers). Past it the owner
    /// drops its queued deltas and tells replication so in their place
    /// ([`super::TableToCluster::DeltasLost`]): every standby's link is
    /// then dropped and re-synced from a fresh snapshot, as one too far
    /// behind would be. The token ceilings dropped with them still reach
    /// the standbys in every heartbeat. Its memory is bounded so, not by
    /// how long the replication thread stalls.
    pub const OWNER_DELTAS: usize = 1 << 18;
    /// Replication → lock owner, in entries ([`super::ClusterToTable::weight`]:
    /// one per message, plus one per delta or snapshot entry it carries),
    /// counted from when the replication thread queues a message until the
    /// owner has applied it: in the replication thread's backlog (where
    /// messages wait, in order, while the owner's channel — `TO_OWNER`
    /// messages — is full) and in that channel. At or over it, the
    /// replication thread reads no peer link until the owner has caught up
    /// below it: what peers send waits in the kernel's socket buffers, then
    /// in the senders' own bounded output (a sender drops a link it cannot
    /// write, and re-syncs it later), never in this node's memory. A
    /// snapshot counts whole: one alone may be over it (it is bounded by
    /// `--max-keys`).
    pub const CLUSTER_ENTRIES: usize = 1 << 16;
    /// The replication thread's "handoff done, exit now" signal: one message.
    pub const EXIT_SIGNAL: usize = 1;
}

/// Everything the lock owner receives.
#[derive(Debug)]
pub enum ToOwner {
    Clients(Vec<Inbound>),
    Cluster(ClusterToTable),
    /// From the metrics thread: publish a snapshot of the figures.
    Scrape,
    /// From the metrics thread: publish the contention view it asks for
    /// (`GET /keys`), between two rounds, like a scrape.
    Keys(KeysAsk),
    /// A single node is stopping: answer every waiter `M - A <key>` (no
    /// node is active), as the last node of a cluster does, then signal
    /// once those answers are on their way to the I/O loops.
    Retire(Retired),
}

/// Whom a `ToOwner::Retire` tells that its answers have left: the round
/// (rounds.rs) hands it to its shell, which signals once they have.
#[derive(Debug)]
pub struct Retired(Sender<()>);

impl Retired {
    pub fn new(done: Sender<()>) -> Retired {
        Retired(done)
    }

    /// The answers have left (a waiter gone is no matter).
    pub fn signal(self) {
        let _ = self.0.send(());
    }
}

/// What the lock owner sends one I/O loop per round.
#[derive(Debug, Default)]
pub struct OwnerBatch {
    /// Answers in the order they must be written.
    pub answers: Vec<(ConnId, Answer)>,
    /// Connections the owner has forgotten (acknowledged closes, or cut off
    /// by the owner): flush what is pending, then close.
    pub forgotten: Vec<ConnId>,
}

impl OwnerBatch {
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty() && self.forgotten.is_empty()
    }
}

/// The lock owner's link to one I/O loop.
pub struct IoLoopLink {
    pub answers: Sender<OwnerBatch>,
    pub waker: Arc<Waker>,
    /// False while the loop may be asleep in `poll`.
    pub awake: Arc<AtomicBool>,
}

/// A link to the replication thread (from the owner or an I/O loop).
pub struct ReplLink {
    pub tx: Sender<ToRepl>,
    pub waker: Arc<Waker>,
}

/// What the replication thread is told.
pub enum ToRepl {
    /// From the lock owner.
    Table(TableToCluster),
    /// From an I/O loop: a connection that opened with a peer line, and the
    /// bytes already read from it (adopting a peer link).
    AdoptPeerLink(crate::server::trust::tls::Stream, Vec<u8>),
    /// Graceful shutdown asked for (SIGINT/SIGTERM).
    Shutdown,
    /// Stop now (the last step of shutdown).
    Stop,
}

/// The entries ([`ClusterToTable::weight`]) the replication thread has
/// queued for the lock owner and the owner has not applied yet: added when
/// the replication thread queues a message, taken off when the owner has
/// applied it. Bounded by [`capacity::CLUSTER_ENTRIES`].
#[derive(Debug, Default)]
pub struct ClusterQueued(AtomicUsize);

impl ClusterQueued {
    /// A message of `weight` entries was queued for the owner.
    pub fn add(&self, weight: usize) {
        self.0.fetch_add(weight, Ordering::Relaxed);
    }

    /// The owner applied (or will never get) a message of `weight` entries.
    pub fn applied(&self, weight: usize) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |queued| {
                Some(queued.saturating_sub(weight))
            });
    }

    /// Entries queued and not applied yet.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// Room for the next round's batch: the largest of the recent rounds, an
/// eighth forgotten each round, and never more than `MAX_ROOM` entries, so
/// that a burst's room is not kept by a node that then goes idle.
pub fn next_room(room: usize, used: usize) -> usize {
    used.max(room - room / 8).min(MAX_ROOM)
}

/// What a batch is allocated with for `room` entries: a quarter more, so
/// that a round a little larger than the recent ones (the usual jitter of a
/// steady load) does not grow the batch, which copies all of it.
pub fn with_headroom(room: usize) -> usize {
    room + room / 4
}

/// The most room a round's batch is made with (a larger round grows it as
/// it goes, as every round once did).
const MAX_ROOM: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rounds_room_follows_the_recent_rounds_and_stays_bounded() {
        assert_eq!(next_room(0, 100), 100);
        assert_eq!(next_room(800, 0), 700, "an eighth forgotten per round");
        assert_eq!(next_room(800, 750), 750);
        assert_eq!(next_room(0, 1_000_000), MAX_ROOM);
        let mut room = MAX_ROOM;
        for _ in 0..100 {
            room = next_room(room, 0);
        }
        assert_eq!(with_headroom(800), 1000);
        assert_eq!(with_headroom(0), 0);
        assert!(
            room < 8,
            "rounds with few requests give the room back: {room}"
        );
    }
}
