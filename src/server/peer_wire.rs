//! The framing of one peer link: bytes off the socket into whole lines
//! ([`PeerReader`]), messages into sealed bytes for the socket
//! ([`PeerWriter`]). The replication thread owns one of each per link; what
//! the lines mean is `core::peer_msg`'s, the seals `trust::peer_auth`'s.
//!
//! Never does: I/O itself, or trust a line: every bound is checked here
//! (a line past MAX_LINE, input past [`MAX_PEER_INPUT`]) and the caller
//! drops the link on an error.

use crate::protocol::MAX_LINE;
use crate::server::core::peer_msg::PeerMsg;
use crate::server::trust::peer_auth::Sealer;

/// The framing of the bytes coming in on one peer link: bytes in, whole
/// lines out. The replication shell passes each line to the handshake, then
/// to the link's [`Opener`](crate::server::trust::peer_auth::Opener), and parses
/// only the lines whose seal checked.
#[derive(Debug, Default)]
pub struct PeerReader {
    input: Vec<u8>,
    used: usize,
}

/// Unparsed bytes from one peer past which its link is dropped (a line is
/// at most MAX_LINE; this only bounds a broken peer).
pub const MAX_PEER_INPUT: usize = 1024 * 1024;

impl PeerReader {
    /// A reader that starts with bytes already read off the socket.
    pub fn with_bytes(bytes: Vec<u8>) -> PeerReader {
        PeerReader {
            input: bytes,
            used: 0,
        }
    }

    /// Bytes read off the socket. Err when the unparsed input is over its
    /// bound (the caller drops the link).
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), &'static str> {
        if self.used > 0 {
            self.input.drain(..self.used);
            self.used = 0;
        }
        self.input.extend_from_slice(bytes);
        if self.input.len() > MAX_PEER_INPUT {
            return Err("input over limit");
        }
        Ok(())
    }

    /// The next whole line, its `\n` included: None when more bytes are
    /// needed, Some(Err) for a line over MAX_LINE.
    pub fn next_line(&mut self) -> Option<Result<&[u8], ()>> {
        let rest = &self.input[self.used..];
        let window = &rest[..rest.len().min(MAX_LINE)];
        match window.iter().position(|&b| b == b'\n') {
            Some(end) => {
                let start = self.used;
                self.used += end + 1;
                Some(Ok(&self.input[start..self.used]))
            }
            None if rest.len() >= MAX_LINE => Some(Err(())),
            None => None,
        }
    }
}

/// The framing of the messages going out on one peer link: messages in,
/// bytes out, sealed once the link has a [`Sealer`].
#[derive(Default)]
pub struct PeerWriter {
    output: Vec<u8>,
    written: usize,
    line: Vec<u8>,
    sealer: Option<Sealer>,
}

impl PeerWriter {
    /// A message of an authenticated link (sealed with the next seal).
    pub fn push(&mut self, msg: &PeerMsg) {
        self.line.clear();
        msg.write_to(&mut self.line);
        match &mut self.sealer {
            Some(sealer) => sealer.push_line(&self.line, &mut self.output),
            None => self.output.extend_from_slice(&self.line),
        }
    }

    /// A handshake line, sent as it is.
    pub fn push_raw(&mut self, line: &[u8]) {
        self.output.extend_from_slice(line);
    }

    /// From now on every message is sealed by `sealer`.
    pub fn set_sealer(&mut self, sealer: Sealer) {
        self.sealer = Some(sealer);
    }

    /// Seal what was pushed since the last seal (before writing it out).
    pub fn seal(&mut self) {
        if let Some(sealer) = &mut self.sealer {
            sealer.seal(&mut self.output);
        }
    }

    /// Bytes not yet written to the socket.
    pub fn pending(&self) -> &[u8] {
        &self.output[self.written..]
    }

    /// `n` bytes were written to the socket.
    pub fn consume(&mut self, n: usize) {
        self.written = (self.written + n).min(self.output.len());
        if self.written == self.output.len() {
            self.output.clear();
            self.written = 0;
        }
    }

    /// Forget everything (the link is gone; a new one starts afresh).
    pub fn clear(&mut self) {
        self.output.clear();
        self.written = 0;
        self.sealer = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reader_yields_whole_lines_and_refuses_an_endless_one() {
        let mut reader = PeerReader::with_bytes(b"P H\nP T".to_vec());
        assert_eq!(reader.next_line(), Some(Ok(&b"P H\n"[..])));
        assert_eq!(reader.next_line(), None);
        reader.push(b"\n").expect("small");
        assert_eq!(reader.next_line(), Some(Ok(&b"P T\n"[..])));
        reader.push(&vec![b'x'; MAX_LINE]).expect("small");
        assert_eq!(reader.next_line(), Some(Err(())));
        assert!(reader.push(&vec![b'x'; MAX_PEER_INPUT]).is_err());
    }
}
