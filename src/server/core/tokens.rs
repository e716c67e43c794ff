//! Fencing tokens: where they come from and why they only grow.
//!
//! Owns: the token counter of a node. Runs on the lock-owner thread (inside
//! the lock table); the replication thread feeds it tokens and ceilings seen
//! from peers through the owner.
//!
//! A token is `(sequence << NODE_BITS) | node_index`: the low bits name the
//! node that issued it, so two nodes that are briefly active at once never
//! issue the same token, and each new token is strictly above every token
//! this node has issued or observed. A node that starts with no memory starts
//! above `unix_milliseconds × 2^20` (docs/fencing.md), which is above every
//! token it issued before a restart unless it issued more than 2^16 tokens in
//! every millisecond of its life.
//!
//! Never does: I/O or clock reads (the start floor is computed by the caller).

/// Low bits of a token that name the issuing node (up to 16 nodes).
pub const NODE_BITS: u32 = 4;
/// The largest node index a token can name.
pub const MAX_NODES: usize = 1 << NODE_BITS;

/// How far ahead of the wall clock (in ms of `clock_floor`) tokens may run:
/// the reserve behind the replicated ceiling, and the head start of a node
/// that starts without memory.
pub const LEAD_MS: u64 = 64;

/// The largest token or ceiling a node takes from anywhere (a peer's
/// heartbeat, a delta, a snapshot): half the token space. Larger values are
/// refused by the cluster core's check of peer messages and never lift the
/// counter, so issuing a token can never run out of room (at the clock
/// floor's pace, half the space lasts past the year 2200).
pub const MAX_TOKEN: u64 = u64::MAX >> 1;

/// The wall clock as a token: the lock owner keeps every new token above
/// this, so tokens issued later, by any node, are larger (clocks permitting).
pub fn clock_floor(unix_ms: u64) -> u64 {
    unix_ms.saturating_mul(1 << 20)
}

/// Where a node that starts without memory begins: `LEAD_MS` ahead of the
/// clock, which is above every token it issued before it restarted, even
/// just after a failover put its tokens ahead of the clock.
pub fn start_floor(unix_ms: u64) -> u64 {
    clock_floor(unix_ms.saturating_add(LEAD_MS))
}

/// The token counter of one node.
#[derive(Clone, Debug)]
pub struct TokenSource {
    last: u64,
    issued: u64,
    /// The largest token known to have been granted: issued here, or
    /// carried by the state replicated to this node.
    granted: u64,
    node: u64,
}

impl TokenSource {
    /// Tokens of node `node_index`, all strictly above `floor`.
    pub fn new(node_index: usize, floor: u64) -> TokenSource {
        assert!(node_index < MAX_NODES, "node index fits in NODE_BITS");
        TokenSource {
            last: floor,
            issued: 0,
            granted: 0,
            node: node_index as u64,
        }
    }

    /// The next token: strictly above every token issued or observed.
    pub fn issue(&mut self) -> u64 {
        let seq = (self.last >> NODE_BITS)
            .checked_add(1)
            .expect("the u64 token space lasts until the year 2500");
        let token = (seq << NODE_BITS) | self.node;
        // Tokens only grow: checked in every build (a release build aborts).
        assert!(token > self.last, "tokens only grow");
        self.last = token;
        self.issued = token;
        self.granted = token;
        token
    }

    /// A token issued elsewhere (or a ceiling): later tokens go above it.
    pub fn observe(&mut self, token: u64) {
        if token <= MAX_TOKEN {
            self.last = self.last.max(token);
        }
    }

    /// A token some node granted (a replicated grant or free): later
    /// tokens go above it, and it counts as granted.
    pub fn observe_granted(&mut self, token: u64) {
        if token <= MAX_TOKEN {
            self.observe(token);
            self.granted = self.granted.max(token);
        }
    }

    /// The largest token known to have been granted, here or by the active
    /// this node's state came from (0 if none): what `I` calls `token`.
    /// Unlike [`TokenSource::last`], never a ceiling or the clock's floor.
    pub fn last_granted(&self) -> u64 {
        self.granted
    }

    /// The largest token issued or observed.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// The largest token this node issued itself (0 if none): what its
    /// heartbeats tell peers, so an active that meets a node that was active
    /// too goes above everything that node granted.
    pub fn last_issued(&self) -> u64 {
        self.issued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_strictly_increase_and_name_their_node() {
        let mut tokens = TokenSource::new(3, 1000);
        let mut prev = 1000;
        for _ in 0..1000 {
            let t = tokens.issue();
            assert!(t > prev);
            assert_eq!(t % MAX_NODES as u64, 3);
            prev = t;
        }
    }

    #[test]
    fn observed_tokens_lift_the_counter() {
        let mut tokens = TokenSource::new(0, 5);
        tokens.observe(1_000_000);
        assert!(tokens.issue() > 1_000_000);
        tokens.observe(10);
        assert!(tokens.issue() > 1_000_000);
    }

    #[test]
    fn two_nodes_never_issue_the_same_token() {
        let mut a = TokenSource::new(0, 77);
        let mut b = TokenSource::new(1, 77);
        let from_a: std::collections::HashSet<u64> = (0..500).map(|_| a.issue()).collect();
        assert!((0..500).map(|_| b.issue()).all(|t| !from_a.contains(&t)));
    }

    #[test]
    fn a_token_beyond_the_limit_never_lifts_the_counter() {
        let mut tokens = TokenSource::new(1, 5);
        tokens.observe(u64::MAX);
        tokens.observe(MAX_TOKEN + 1);
        assert!(tokens.issue() < 100);
        tokens.observe(MAX_TOKEN);
        assert!(tokens.issue() > MAX_TOKEN, "and issuing never overflows");
    }

    #[test]
    fn only_grants_count_as_granted_ceilings_and_floors_do_not() {
        let mut tokens = TokenSource::new(0, 1000);
        assert_eq!(tokens.last_granted(), 0, "nothing granted yet");
        tokens.observe(5000);
        assert_eq!(tokens.last_granted(), 0, "a ceiling or floor is no grant");
        let mine = tokens.issue();
        assert_eq!(tokens.last_granted(), mine);
        tokens.observe_granted(mine + 1000);
        assert_eq!(tokens.last_granted(), mine + 1000);
        assert!(tokens.issue() > mine + 1000, "and later tokens go above it");
        tokens.observe_granted(MAX_TOKEN + 1);
        assert!(tokens.last_granted() <= MAX_TOKEN, "out of range: ignored");
        tokens.observe_granted(10);
        assert!(tokens.last_granted() > mine + 1000, "never goes down");
    }

    #[test]
    fn clock_floor_grows_with_the_clock() {
        let earlier = clock_floor(1_700_000_000_000);
        let later = clock_floor(1_700_000_000_001);
        assert!(later > earlier);
        assert_eq!(later - earlier, 1 << 20);
    }
}
