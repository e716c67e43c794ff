//! Peer authentication: the handshake by which a link proves that it knows
//! the cluster key, and the MACs that cover every message after it.
//!
//! Owns: the cluster key ([`ClusterKey`]), the three handshake lines, and
//! the sealing ([`Sealer`]) and checking ([`Opener`]) of the message stream
//! of an authenticated link. All of it is pure (no I/O, no clock, no
//! randomness: the caller passes fresh nonces in), run by the replication
//! thread's shell for every peer link; the cluster core only ever hears of
//! a link once it is authenticated. The crypto is `ring`'s HMAC-SHA256.
//!
//! The handshake (node `from` dials node `to`; `nodes` and the fingerprint
//! `fp` of the `--peers` list must be the same on both):
//!
//! ```text
//! dialer   -> acceptor   P HELLO <from> <nodes> <fp> <nonce_d>
//! acceptor -> dialer     P CHAL <nonce_a> <proof_a>
//! dialer   -> acceptor   P AUTH <proof_d>
//! ```
//!
//! Nonces are 32 random bytes, proofs HMAC-SHA256 tags, all in hex. Each
//! proof is the HMAC, under the cluster key, of a role label and the whole
//! transcript (`from`, `to`, `nodes`, `fp`, both nonces): the key never
//! crosses the wire, each side proves it for a nonce the other just chose
//! (so a recorded handshake cannot be replayed), and the acceptor proves it
//! first, so a dialer never sends state to a node that does not know the
//! key. The link then carries the dialer's messages only; they are sealed
//! in batches: after some lines, `P M <tag>`, the HMAC under a session key
//! (derived from the key and the transcript) of a batch counter and the
//! exact bytes of the lines since the last seal. The receiver acts on no
//! line before its batch's seal checks, so a line cannot be forged,
//! altered, dropped, reordered or replayed from another link, and it keeps
//! at most [`MAX_UNSEALED`] bytes waiting for a seal.
//!
//! Never does: I/O, or decide what a link may do once it is authenticated
//! (that is the cluster core's job).

use ring::{digest, hmac};

use crate::protocol::MAX_LINE;

/// Random bytes of each side's nonce.
pub const NONCE_LEN: usize = 32;
/// The shortest cluster key accepted, in bytes.
pub const MIN_KEY_LEN: usize = 32;
/// The longest cluster key file read, in bytes.
pub const MAX_KEY_FILE: usize = 64 * 1024;
/// Unsealed bytes past which a sender seals its batch at once (it also
/// seals at the end of every round).
pub const SEAL_EVERY: usize = 32 * 1024;
/// Unsealed bytes a receiver keeps before it has seen a seal; past this the
/// link is dropped.
pub const MAX_UNSEALED: usize = SEAL_EVERY + 2 * MAX_LINE;

const TAG_LEN: usize = 32;
const FP_LEN: usize = 8;
/// The key of `--insecure-peers`: public, so it proves nothing; the links
/// only keep their framing (and a node with a real key refuses them).
const INSECURE_KEY: &[u8] = b"baton --insecure-peers: this is not a secret";

/// The secret every node of a cluster shares.
#[derive(Clone)]
pub struct ClusterKey {
    key: hmac::Key,
    insecure: bool,
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("ClusterKey")
            .field("insecure", &self.insecure)
            .finish_non_exhaustive()
    }
}

impl PartialEq for ClusterKey {
    /// Keys are never compared; configs holding one compare by mode only.
    fn eq(&self, other: &Self) -> bool {
        self.insecure == other.insecure
    }
}

impl Eq for ClusterKey {}

impl ClusterKey {
    /// The key in a key file's contents: surrounding whitespace ignored, at
    /// least [`MIN_KEY_LEN`] bytes.
    pub fn from_file_contents(contents: &[u8]) -> Result<ClusterKey, String> {
        let secret = contents.trim_ascii();
        if secret.len() < MIN_KEY_LEN {
            return Err(format!(
                "the key is {} bytes; it must be at least {MIN_KEY_LEN} (for example: \
                 head -c 32 /dev/urandom | base64 > FILE)",
                secret.len()
            ));
        }
        Ok(ClusterKey {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
            insecure: false,
        })
    }

    /// The stand-in of `--insecure-peers`.
    pub fn insecure() -> ClusterKey {
        ClusterKey {
            key: hmac::Key::new(hmac::HMAC_SHA256, INSECURE_KEY),
            insecure: true,
        }
    }

    pub fn is_insecure(&self) -> bool {
        self.insecure
    }
}

/// Short fingerprint of a `--peers` list, so that nodes whose lists differ
/// find out in the first line instead of agreeing on indexes that name
/// different nodes.
pub fn peers_fingerprint(peers: &[String]) -> [u8; FP_LEN] {
    let joined = peers.join(",");
    let d = digest::digest(&digest::SHA256, joined.as_bytes());
    let mut fp = [0; FP_LEN];
    fp.copy_from_slice(&d.as_ref()[..FP_LEN]);
    fp
}

/// Who dials whom, in which cluster: what both ends of a link agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkIds {
    pub from: usize,
    pub to: usize,
    pub nodes: usize,
    pub fp: [u8; FP_LEN],
}

/// Why a handshake failed, in words for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandshakeError {
    /// The acceptor refused the hello, saying why (`P NO <reason>`).
    Refused(String),
    /// A line that is not the handshake line expected.
    Malformed,
    /// The other side answered with a client-protocol line (a node without
    /// peers, a full node): its words.
    Answered(String),
    /// The lists of `--peers` differ (count or contents).
    PeersDiffer { theirs: usize, ours: usize },
    /// The hello names a node index that cannot be the dialer.
    BadIndex(usize),
    /// The proof does not check: the keys differ (or one side runs
    /// `--insecure-peers`), or someone without the key is trying.
    BadProof,
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeError::Malformed => write!(f, "not a peer handshake"),
            HandshakeError::Refused(why) if why == "peers-differ" => write!(
                f,
                "it refuses the link: its --peers list differs from this node's (count, \
                 order or spelling)"
            ),
            HandshakeError::Refused(why) => write!(f, "it refuses the link ({why})"),
            HandshakeError::Answered(words) => write!(f, "it answered {words:?}, not as a peer"),
            HandshakeError::PeersDiffer { theirs, ours } => write!(
                f,
                "its --peers list differs from this node's ({theirs} vs {ours} entries, \
                 or the same count in another order or spelling)"
            ),
            HandshakeError::BadIndex(i) => write!(f, "it claims to be node index {i}"),
            HandshakeError::BadProof => write!(
                f,
                "its proof of the cluster key does not check (a different \
                 --cluster-key-file, --insecure-peers on one side only, or not a peer)"
            ),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

fn unhex<const N: usize>(field: &[u8]) -> Option<[u8; N]> {
    if field.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (i, pair) in field.chunks_exact(2).enumerate() {
        out[i] = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

/// The line an acceptor sends before it closes a link whose hello it
/// refused for a reason the dialer can act on (so the dialer says why and
/// backs off instead of redialing at once). None: close without a word.
pub fn refusal_line(e: &HandshakeError) -> Option<&'static [u8]> {
    match e {
        HandshakeError::PeersDiffer { .. } => Some(b"P NO peers-differ\n"),
        HandshakeError::BadIndex(_) => Some(b"P NO bad-index\n"),
        _ => None,
    }
}

/// The fields of a handshake line (the `\n` and a `\r` before it removed).
fn fields(line: &[u8]) -> Vec<&[u8]> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    line.split(|&b| b == b' ').collect()
}

/// A line from the client protocol's answers (`E ...`), said back in logs.
fn answered(line: &[u8]) -> Option<HandshakeError> {
    if line.starts_with(b"P ") {
        return None;
    }
    let text = String::from_utf8_lossy(line);
    let text: String = text.trim_end().chars().take(80).collect();
    Some(HandshakeError::Answered(text))
}

fn transcript(label: &[u8], ids: &LinkIds, nonce_d: &[u8], nonce_a: &[u8]) -> Vec<u8> {
    let mut t = Vec::with_capacity(96 + label.len());
    t.extend_from_slice(b"baton peer link v1\0");
    t.extend_from_slice(label);
    t.push(0);
    for n in [ids.from, ids.to, ids.nodes] {
        t.extend_from_slice(&(n as u64).to_be_bytes());
    }
    t.extend_from_slice(&ids.fp);
    t.extend_from_slice(nonce_d);
    t.extend_from_slice(nonce_a);
    t
}

fn proof(key: &ClusterKey, label: &[u8], ids: &LinkIds, nd: &[u8], na: &[u8]) -> hmac::Tag {
    hmac::sign(&key.key, &transcript(label, ids, nd, na))
}

fn session_key(key: &ClusterKey, ids: &LinkIds, nd: &[u8], na: &[u8]) -> hmac::Key {
    let tag = proof(key, b"session", ids, nd, na);
    hmac::Key::new(hmac::HMAC_SHA256, tag.as_ref())
}

fn check(key: &ClusterKey, label: &[u8], ids: &LinkIds, nd: &[u8], na: &[u8], tag: &[u8]) -> bool {
    hmac::verify(&key.key, &transcript(label, ids, nd, na), tag).is_ok()
}

/// The dialing side of a handshake.
pub struct Dialer {
    key: ClusterKey,
    ids: LinkIds,
    nonce: [u8; NONCE_LEN],
}

impl Dialer {
    /// Dial as `ids.from`, with a fresh random `nonce`.
    pub fn new(key: ClusterKey, ids: LinkIds, nonce: [u8; NONCE_LEN]) -> Dialer {
        Dialer { key, ids, nonce }
    }

    /// The first line to send.
    pub fn hello_line(&self) -> Vec<u8> {
        format!(
            "P HELLO {} {} {} {}\n",
            self.ids.from,
            self.ids.nodes,
            hex(&self.ids.fp),
            hex(&self.nonce)
        )
        .into_bytes()
    }

    /// The acceptor's challenge: if its proof checks, the line to send and
    /// the sealer of everything after it.
    pub fn handle_challenge(self, line: &[u8]) -> Result<(Vec<u8>, Sealer), HandshakeError> {
        if let Some(e) = answered(line) {
            return Err(e);
        }
        let f = fields(line);
        if let [b"P", b"NO", why] = f.as_slice() {
            let why: String = String::from_utf8_lossy(why)
                .chars()
                .filter(|c| c.is_ascii_graphic())
                .take(40)
                .collect();
            return Err(HandshakeError::Refused(why));
        }
        let [b"P", b"CHAL", nonce, tag] = f.as_slice() else {
            return Err(HandshakeError::Malformed);
        };
        let nonce: [u8; NONCE_LEN] = unhex(nonce).ok_or(HandshakeError::Malformed)?;
        let tag: [u8; TAG_LEN] = unhex(tag).ok_or(HandshakeError::Malformed)?;
        if !check(&self.key, b"acceptor", &self.ids, &self.nonce, &nonce, &tag) {
            return Err(HandshakeError::BadProof);
        }
        let mine = proof(&self.key, b"dialer", &self.ids, &self.nonce, &nonce);
        let line = format!("P AUTH {}\n", hex(mine.as_ref())).into_bytes();
        let sealer = Sealer::new(session_key(&self.key, &self.ids, &self.nonce, &nonce));
        Ok((line, sealer))
    }
}

/// The accepting side of a handshake, after a hello it accepted.
pub struct Acceptor {
    key: ClusterKey,
    ids: LinkIds,
    nonce_d: [u8; NONCE_LEN],
    nonce: [u8; NONCE_LEN],
}

impl Acceptor {
    /// A hello arrived at node `me` of `nodes` whose `--peers` fingerprint is
    /// `fp`: check it, and answer with a challenge for the fresh `nonce`.
    pub fn handle_hello(
        key: ClusterKey,
        me: usize,
        nodes: usize,
        fp: [u8; FP_LEN],
        line: &[u8],
        nonce: [u8; NONCE_LEN],
    ) -> Result<(Acceptor, Vec<u8>), HandshakeError> {
        let f = fields(line);
        let [b"P", b"HELLO", from, theirs, their_fp, nonce_d] = f.as_slice() else {
            return Err(HandshakeError::Malformed);
        };
        let num = |field: &[u8]| -> Option<usize> {
            if field.is_empty() || field.len() > 4 || !field.iter().all(u8::is_ascii_digit) {
                return None;
            }
            std::str::from_utf8(field).ok()?.parse().ok()
        };
        let from = num(from).ok_or(HandshakeError::Malformed)?;
        let theirs = num(theirs).ok_or(HandshakeError::Malformed)?;
        let their_fp: [u8; FP_LEN] = unhex(their_fp).ok_or(HandshakeError::Malformed)?;
        let nonce_d: [u8; NONCE_LEN] = unhex(nonce_d).ok_or(HandshakeError::Malformed)?;
        if theirs != nodes || their_fp != fp {
            return Err(HandshakeError::PeersDiffer {
                theirs,
                ours: nodes,
            });
        }
        if from >= nodes || from == me {
            return Err(HandshakeError::BadIndex(from));
        }
        let ids = LinkIds {
            from,
            to: me,
            nodes,
            fp,
        };
        let tag = proof(&key, b"acceptor", &ids, &nonce_d, &nonce);
        let line = format!("P CHAL {} {}\n", hex(&nonce), hex(tag.as_ref())).into_bytes();
        let acceptor = Acceptor {
            key,
            ids,
            nonce_d,
            nonce,
        };
        Ok((acceptor, line))
    }

    /// The node index the dialer claims (proved only by `handle_auth`).
    pub fn from(&self) -> usize {
        self.ids.from
    }

    /// The dialer's proof: if it checks, the opener of its messages.
    pub fn handle_auth(self, line: &[u8]) -> Result<Opener, HandshakeError> {
        let f = fields(line);
        let [b"P", b"AUTH", tag] = f.as_slice() else {
            return Err(HandshakeError::Malformed);
        };
        let tag: [u8; TAG_LEN] = unhex(tag).ok_or(HandshakeError::Malformed)?;
        if !check(
            &self.key,
            b"dialer",
            &self.ids,
            &self.nonce_d,
            &self.nonce,
            &tag,
        ) {
            return Err(HandshakeError::BadProof);
        }
        Ok(Opener::new(session_key(
            &self.key,
            &self.ids,
            &self.nonce_d,
            &self.nonce,
        )))
    }
}

/// Seals the lines an authenticated link sends, in batches.
pub struct Sealer {
    key: hmac::Key,
    batch: u64,
    ctx: hmac::Context,
    unsealed: usize,
}

impl Sealer {
    fn new(key: hmac::Key) -> Sealer {
        let ctx = batch_context(&key, 0);
        Sealer {
            key,
            batch: 0,
            ctx,
            unsealed: 0,
        }
    }

    /// Append `line` (one whole line, `\n` included) to `out`, sealing the
    /// batch first if it is full.
    pub fn push_line(&mut self, line: &[u8], out: &mut Vec<u8>) {
        if self.unsealed + line.len() > SEAL_EVERY {
            self.seal(out);
        }
        self.ctx.update(line);
        self.unsealed += line.len();
        out.extend_from_slice(line);
    }

    /// Lines have been pushed since the last seal.
    pub fn has_unsealed(&self) -> bool {
        self.unsealed > 0
    }

    /// Close the batch: append its seal line to `out` (nothing if empty).
    pub fn seal(&mut self, out: &mut Vec<u8>) {
        if self.unsealed == 0 {
            return;
        }
        self.batch = self.batch.wrapping_add(1);
        let next = batch_context(&self.key, self.batch);
        let tag = std::mem::replace(&mut self.ctx, next).sign();
        out.extend_from_slice(b"P M ");
        out.extend_from_slice(hex(tag.as_ref()).as_bytes());
        out.push(b'\n');
        self.unsealed = 0;
    }
}

fn batch_context(key: &hmac::Key, batch: u64) -> hmac::Context {
    let mut ctx = hmac::Context::with_key(key);
    ctx.update(&batch.to_be_bytes());
    ctx
}

/// Why a sealed stream was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenError {
    /// A seal that does not check: forged, altered, reordered or replayed.
    BadSeal,
    /// More unsealed bytes than a peer ever sends.
    TooMuchUnsealed,
}

impl OpenError {
    pub fn as_str(self) -> &'static str {
        match self {
            OpenError::BadSeal => "a message whose seal does not check",
            OpenError::TooMuchUnsealed => "unsealed input over its bound",
        }
    }
}

/// Checks the seals of an authenticated link's incoming lines.
pub struct Opener {
    key: hmac::Key,
    batch: u64,
    /// The batch counter and the lines since the last seal: exactly what
    /// the seal covers.
    pending: Vec<u8>,
}

impl Opener {
    fn new(key: hmac::Key) -> Opener {
        Opener {
            key,
            batch: 0,
            pending: 0u64.to_be_bytes().to_vec(),
        }
    }

    /// One line as received (its `\n` included). Ok(Some(lines)) when it was
    /// a seal that checks: the lines of the batch, now safe to act on;
    /// Ok(None) when it joined the batch.
    pub fn take_line(&mut self, line: &[u8]) -> Result<Option<Vec<u8>>, OpenError> {
        if let Some(rest) = line.strip_prefix(b"P M ") {
            let rest = rest.strip_suffix(b"\n").unwrap_or(rest);
            let rest = rest.strip_suffix(b"\r").unwrap_or(rest);
            let tag: [u8; TAG_LEN] = unhex(rest).ok_or(OpenError::BadSeal)?;
            hmac::verify(&self.key, &self.pending, &tag).map_err(|_| OpenError::BadSeal)?;
            self.batch = self.batch.wrapping_add(1);
            let mut next = Vec::with_capacity(self.pending.capacity().min(2 * SEAL_EVERY));
            next.extend_from_slice(&self.batch.to_be_bytes());
            let mut lines = std::mem::replace(&mut self.pending, next);
            lines.drain(..8);
            return Ok(Some(lines));
        }
        if self.pending.len() + line.len() > 8 + MAX_UNSEALED {
            return Err(OpenError::TooMuchUnsealed);
        }
        self.pending.extend_from_slice(line);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> ClusterKey {
        ClusterKey::from_file_contents(s.as_bytes()).expect("long enough")
    }

    const K1: &str = "0123456789abcdef0123456789abcdef";
    const K2: &str = "0123456789abcdef0123456789abcdeX";

    fn ids() -> LinkIds {
        LinkIds {
            from: 1,
            to: 0,
            nodes: 3,
            fp: peers_fingerprint(&["a:1".into(), "b:1".into(), "c:1".into()]),
        }
    }

    /// A full handshake between keys `d` and `a`: the sealer and opener, or
    /// the error of whichever side refused.
    fn handshake(
        d: ClusterKey,
        a: ClusterKey,
        nd: u8,
        na: u8,
    ) -> Result<(Sealer, Opener), HandshakeError> {
        let ids = ids();
        let dialer = Dialer::new(d, ids, [nd; NONCE_LEN]);
        let hello = dialer.hello_line();
        let (acceptor, chal) = Acceptor::handle_hello(a, 0, 3, ids.fp, &hello, [na; NONCE_LEN])?;
        assert_eq!(acceptor.from(), 1);
        let (auth, sealer) = dialer.handle_challenge(&chal)?;
        let opener = acceptor.handle_auth(&auth)?;
        Ok((sealer, opener))
    }

    #[test]
    fn a_key_file_needs_32_bytes_and_ignores_surrounding_whitespace() {
        assert!(ClusterKey::from_file_contents(b"  short  \n").is_err());
        assert!(ClusterKey::from_file_contents(&[b' '; 40]).is_err());
        let k = ClusterKey::from_file_contents(format!("\n  {K1}\n\n").as_bytes()).expect("ok");
        assert!(!k.is_insecure());
        assert!(!format!("{k:?}").contains(K1), "the key is never printed");
        // Whitespace around the key does not change it.
        assert!(handshake(k, key(K1), 1, 2).is_ok());
    }

    #[test]
    fn nodes_with_the_same_key_authenticate_and_seal_lines() {
        let (mut sealer, mut opener) = handshake(key(K1), key(K1), 1, 2).expect("same key");
        let mut wire = Vec::new();
        sealer.push_line(b"P C 42\n", &mut wire);
        sealer.push_line(b"P H\n", &mut wire);
        assert!(sealer.has_unsealed());
        sealer.seal(&mut wire);
        assert!(!sealer.has_unsealed());
        let mut released = Vec::new();
        for line in wire.split_inclusive(|&b| b == b'\n') {
            if let Some(lines) = opener.take_line(line).expect("checks") {
                released.extend(lines);
            }
        }
        assert_eq!(released, b"P C 42\nP H\n");
    }

    #[test]
    fn a_different_key_or_insecure_mode_fails_on_both_sides() {
        assert_eq!(
            handshake(key(K1), key(K2), 1, 2).err(),
            Some(HandshakeError::BadProof),
            "the dialer refuses an acceptor without the key"
        );
        assert_eq!(
            handshake(ClusterKey::insecure(), key(K1), 1, 2).err(),
            Some(HandshakeError::BadProof)
        );
        assert!(handshake(ClusterKey::insecure(), ClusterKey::insecure(), 1, 2).is_ok());
        // An acceptor never accepts a dialer without the key, even when the
        // dialer got a valid challenge: compute AUTH with the wrong key.
        let ids = ids();
        let hello = Dialer::new(key(K2), ids, [1; NONCE_LEN]).hello_line();
        let (acceptor, chal) =
            Acceptor::handle_hello(key(K1), 0, 3, ids.fp, &hello, [2; NONCE_LEN]).expect("hello");
        let wrong = Dialer::new(key(K2), ids, [1; NONCE_LEN]);
        assert_eq!(
            wrong.handle_challenge(&chal).err(),
            Some(HandshakeError::BadProof)
        );
        let forged = format!("P AUTH {}\n", "ab".repeat(32));
        assert_eq!(
            acceptor.handle_auth(forged.as_bytes()).err(),
            Some(HandshakeError::BadProof)
        );
    }

    #[test]
    fn a_recorded_handshake_cannot_be_replayed_against_a_new_nonce() {
        let ids = ids();
        let dialer = Dialer::new(key(K1), ids, [1; NONCE_LEN]);
        let hello = dialer.hello_line();
        let (acceptor, chal) =
            Acceptor::handle_hello(key(K1), 0, 3, ids.fp, &hello, [2; NONCE_LEN]).expect("hello");
        let (auth, _) = dialer.handle_challenge(&chal).expect("chal");
        assert!(acceptor.handle_auth(&auth).is_ok());
        // The attacker replays the recorded hello and auth; the node picks a
        // new nonce.
        let (acceptor, _) =
            Acceptor::handle_hello(key(K1), 0, 3, ids.fp, &hello, [3; NONCE_LEN]).expect("hello");
        assert_eq!(
            acceptor.handle_auth(&auth).err(),
            Some(HandshakeError::BadProof)
        );
    }

    #[test]
    fn recorded_sealed_lines_do_not_check_on_another_link() {
        let (mut sealer, _) = handshake(key(K1), key(K1), 1, 2).expect("ok");
        let mut wire = Vec::new();
        sealer.push_line(b"P C 99999999999999\n", &mut wire);
        sealer.seal(&mut wire);
        let (_, mut other) = handshake(key(K1), key(K1), 1, 3).expect("ok");
        let lines: Vec<&[u8]> = wire.split_inclusive(|&b| b == b'\n').collect();
        assert_eq!(other.take_line(lines[0]), Ok(None));
        assert_eq!(other.take_line(lines[1]), Err(OpenError::BadSeal));
    }

    #[test]
    fn altered_reordered_dropped_or_replayed_batches_are_refused() {
        let (mut sealer, _) = handshake(key(K1), key(K1), 1, 2).expect("ok");
        let mut batches = Vec::new();
        for line in [&b"P C 10\n"[..], b"P C 20\n"] {
            let mut wire = Vec::new();
            sealer.push_line(line, &mut wire);
            sealer.seal(&mut wire);
            batches.push(wire);
        }
        let feed = |opener: &mut Opener, wire: &[u8]| -> Result<Vec<u8>, OpenError> {
            let mut out = Vec::new();
            for line in wire.split_inclusive(|&b| b == b'\n') {
                if let Some(l) = opener.take_line(line)? {
                    out.extend(l);
                }
            }
            Ok(out)
        };
        let fresh = || handshake(key(K1), key(K1), 1, 2).expect("ok").1;
        // In order: both check.
        let mut o = fresh();
        assert_eq!(feed(&mut o, &batches[0]), Ok(b"P C 10\n".to_vec()));
        assert_eq!(feed(&mut o, &batches[1]), Ok(b"P C 20\n".to_vec()));
        // Replayed: the second copy of batch 0 fails.
        let mut o = fresh();
        assert!(feed(&mut o, &batches[0]).is_ok());
        assert_eq!(feed(&mut o, &batches[0]), Err(OpenError::BadSeal));
        // Dropped or reordered: batch 1 first fails.
        assert_eq!(feed(&mut fresh(), &batches[1]), Err(OpenError::BadSeal));
        // Altered.
        let mut altered = batches[0].clone();
        altered[4] = b'9';
        assert_eq!(feed(&mut fresh(), &altered), Err(OpenError::BadSeal));
    }

    #[test]
    fn an_endless_batch_without_a_seal_is_refused_at_its_bound() {
        let (_, mut opener) = handshake(key(K1), key(K1), 1, 2).expect("ok");
        let line = [b"P G k 1 1".as_slice(), &[b'x'; 500], b"\n"].concat();
        let mut result = Ok(None);
        for _ in 0..(MAX_UNSEALED / line.len() + 2) {
            result = opener.take_line(&line);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(result, Err(OpenError::TooMuchUnsealed));
    }

    #[test]
    fn a_sender_seals_before_its_batch_would_pass_the_bound() {
        let (mut sealer, mut opener) = handshake(key(K1), key(K1), 1, 2).expect("ok");
        let mut wire = Vec::new();
        let line = [b"P F ".as_slice(), &[b'k'; 200], b" 17\n"].concat();
        for _ in 0..1000 {
            sealer.push_line(&line, &mut wire);
        }
        sealer.seal(&mut wire);
        let mut n = 0;
        for l in wire.split_inclusive(|&b| b == b'\n') {
            if let Some(lines) = opener.take_line(l).expect("never over the bound") {
                n += lines.split_inclusive(|&b| b == b'\n').count();
            }
        }
        assert_eq!(n, 1000);
    }

    #[test]
    fn hellos_that_name_another_cluster_or_index_are_refused_with_the_reason() {
        let ids = ids();
        let nonce = [9; NONCE_LEN];
        let hello_of = |from: usize, nodes: usize, fp: [u8; FP_LEN]| {
            Dialer::new(
                key(K1),
                LinkIds {
                    from,
                    to: 0,
                    nodes,
                    fp,
                },
                [1; NONCE_LEN],
            )
            .hello_line()
        };
        let accept = |line: &[u8]| {
            Acceptor::handle_hello(key(K1), 0, 3, ids.fp, line, nonce).map(|(a, _)| a.from())
        };
        assert_eq!(accept(&hello_of(2, 3, ids.fp)), Ok(2));
        assert_eq!(
            accept(&hello_of(1, 2, ids.fp)),
            Err(HandshakeError::PeersDiffer { theirs: 2, ours: 3 })
        );
        let other_fp = peers_fingerprint(&["b:1".into(), "a:1".into(), "c:1".into()]);
        assert!(matches!(
            accept(&hello_of(1, 3, other_fp)),
            Err(HandshakeError::PeersDiffer { .. })
        ));
        assert_eq!(
            accept(&hello_of(0, 3, ids.fp)),
            Err(HandshakeError::BadIndex(0))
        );
        assert_eq!(
            accept(&hello_of(7, 3, ids.fp)),
            Err(HandshakeError::BadIndex(7))
        );
        for bad in [
            &b"P HELLO 1 3\n"[..],
            b"P HELLO 1 3 zz 00\n",
            b"P HELLO 99999999999999999999 3 0000000000000000 00\n",
            b"P AUTH 00\n",
            b"",
        ] {
            assert_eq!(accept(bad), Err(HandshakeError::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn a_refused_hello_is_answered_with_a_reason_the_dialer_reports() {
        let ids = ids();
        let other_fp = peers_fingerprint(&["b:1".into(), "a:1".into(), "c:1".into()]);
        let dialer = Dialer::new(
            key(K1),
            LinkIds {
                fp: other_fp,
                ..ids
            },
            [1; NONCE_LEN],
        );
        let err = Acceptor::handle_hello(key(K1), 0, 3, ids.fp, &dialer.hello_line(), [2; 32])
            .err()
            .expect("refused");
        let line = refusal_line(&err).expect("a reason to give");
        let said = dialer.handle_challenge(line).err().expect("refused");
        assert_eq!(said, HandshakeError::Refused("peers-differ".into()));
        assert!(said.to_string().contains("--peers list differs"), "{said}");
        assert_eq!(
            refusal_line(&HandshakeError::BadProof),
            None,
            "no oracle for the key"
        );
    }

    #[test]
    fn a_dialer_answered_by_a_plain_node_says_what_it_answered() {
        let dialer = Dialer::new(key(K1), ids(), [1; NONCE_LEN]);
        assert_eq!(
            dialer.handle_challenge(b"E - - unknown-op\n").err(),
            Some(HandshakeError::Answered("E - - unknown-op".into()))
        );
        let dialer = Dialer::new(key(K1), ids(), [1; NONCE_LEN]);
        assert_eq!(
            dialer.handle_challenge(b"P CHAL 00 00\n").err(),
            Some(HandshakeError::Malformed)
        );
    }
}
