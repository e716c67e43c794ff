//! The node-to-node messages: heartbeats, snapshots, deltas, handoff.
//!
//! Owns: [`PeerMsg`], and parsing and formatting the lines peers send each
//! other once their link is authenticated (the handshake before them, and
//! the seals between them, are `trust/peer_auth.rs`'s; the framing of a
//! link's bytes is `server::peer_wire`'s). Peers use the client port: a connection whose
//! first line starts with `P ` is handed from the I/O loop to the
//! replication thread, which alone speaks this.
//! `P` is therefore not a client op (a client sending it gets `unknown-op`
//! on a single node, and a confused peer link on a cluster node).
//!
//! Lines (same MAX_LINE rule and `\n` ending as the client protocol):
//! - `P B <role> <following|-> <synced 0|1> <has_state 0|1> <last_token> <ceiling>`: heartbeat;
//! - `P S` … `P E`: a snapshot, in pieces: the `G` lines of the table, with
//!   the active's deltas (`G`, `F`, `C`) since the snapshot began between
//!   the pieces, in the active's order;
//! - `P G <key> <token> <ms_left> [<limit> <slot> [<value>]]`,
//!   `P F <key> <token> [<slot>]`, `P C <ceiling>`: deltas, a grant or the
//!   end of one each (a semaphore's holders are a `G` per slot). The
//!   trailing fields are left out when they say nothing: a plain mutex's
//!   grant without a value (limit 1, slot 0) is `P G <key> <token>
//!   <ms_left>` and its free `P F <key> <token>`, as before semaphores.
//! - `P H`: handoff (the receiver takes over); `P T`: took over.
//!
//! Never does: I/O. Never panics on input; a malformed line is an error the
//! caller answers by dropping the link.

use crate::protocol::{Key, MAX_LINE, Value, parse_u64, write_u64};
use crate::server::core::events::Delta;
use crate::server::core::roles::{Beat, RoleName};

/// One message between peers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerMsg {
    Beat {
        beat: Beat,
        last_token: u64,
        ceiling: u64,
    },
    SnapshotBegin,
    Delta(Delta),
    SnapshotEnd,
    Handoff,
    Took,
}

/// What the parser made of the start of a buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerParsed {
    /// No complete line yet: read more.
    Incomplete,
    /// One line of `used` bytes: the message, or None if not understood.
    Line { used: usize, msg: Option<PeerMsg> },
}

/// Does this buffer start like a peer link?
pub fn is_peer_line(buf: &[u8]) -> bool {
    buf.starts_with(b"P ")
}

impl PeerMsg {
    /// Append the message's line to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        // Writing to a Vec cannot fail.
        let _ = match self {
            PeerMsg::Beat {
                beat,
                last_token,
                ceiling,
            } => {
                let following = beat.following.map_or("-".to_string(), |f| f.to_string());
                writeln!(
                    out,
                    "P B {} {following} {} {} {last_token} {ceiling}",
                    beat.role.as_str(),
                    u8::from(beat.synced),
                    u8::from(beat.has_state)
                )
            }
            PeerMsg::SnapshotBegin => writeln!(out, "P S"),
            PeerMsg::SnapshotEnd => writeln!(out, "P E"),
            PeerMsg::Handoff => writeln!(out, "P H"),
            PeerMsg::Took => writeln!(out, "P T"),
            PeerMsg::Delta(delta) => write_delta(delta, out),
        };
    }
}

fn write_delta(delta: &Delta, out: &mut Vec<u8>) -> std::io::Result<()> {
    // By hand, not `write!`: the active writes a line per replicated change.
    match delta {
        Delta::Grant {
            key,
            token,
            ms_left,
            limit,
            slot,
            value,
        } => {
            out.extend_from_slice(b"P G ");
            out.extend_from_slice(key.as_bytes());
            out.push(b' ');
            write_u64(*token, out);
            out.push(b' ');
            write_u64(*ms_left, out);
            if *limit != 1 || *slot != 0 || value.is_some() {
                out.push(b' ');
                write_u64(u64::from(*limit), out);
                out.push(b' ');
                write_u64(u64::from(*slot), out);
                if let Some(value) = value {
                    out.push(b' ');
                    out.extend_from_slice(value.as_bytes());
                }
            }
        }
        Delta::Free { key, token, slot } => {
            out.extend_from_slice(b"P F ");
            out.extend_from_slice(key.as_bytes());
            out.push(b' ');
            write_u64(*token, out);
            if *slot != 0 {
                out.push(b' ');
                write_u64(u64::from(*slot), out);
            }
        }
        Delta::Ceiling(ceiling) => {
            out.extend_from_slice(b"P C ");
            write_u64(*ceiling, out);
        }
    }
    out.push(b'\n');
    Ok(())
}

/// Parse one peer line from the start of `buf`.
pub fn parse_peer(buf: &[u8]) -> PeerParsed {
    let window = &buf[..buf.len().min(MAX_LINE)];
    let Some(end) = window.iter().position(|&b| b == b'\n') else {
        if buf.len() >= MAX_LINE {
            return PeerParsed::Line {
                used: MAX_LINE,
                msg: None,
            };
        }
        return PeerParsed::Incomplete;
    };
    let line = buf[..end].strip_suffix(b"\r").unwrap_or(&buf[..end]);
    PeerParsed::Line {
        used: end + 1,
        msg: parse_line(line),
    }
}

/// Fields after the kind, at most (a heartbeat has the most).
const MAX_FIELDS: usize = 6;

fn parse_line(line: &[u8]) -> Option<PeerMsg> {
    let not_understood = || {
        log::debug!(
            "peer line not understood: {:?}",
            std::str::from_utf8(line).ok()
        );
        None
    };
    let mut fields = line.split(|&b| b == b' ');
    if fields.next()? != b"P" {
        return None;
    }
    let kind = fields.next()?;
    // On the stack: a standby parses every replicated change here.
    let mut rest: [&[u8]; MAX_FIELDS] = [&[]; MAX_FIELDS];
    let mut n = 0;
    for field in fields {
        if n == MAX_FIELDS {
            return not_understood();
        }
        rest[n] = field;
        n += 1;
    }
    let rest = &rest[..n];
    let num = parse_u64;
    let msg = match (kind, rest) {
        (b"B", [role, following, synced, has_state, last_token, ceiling]) => PeerMsg::Beat {
            beat: Beat {
                role: RoleName::parse(std::str::from_utf8(role).ok()?)?,
                following: match *following {
                    b"-" => None,
                    f => Some(num(f)? as usize),
                },
                synced: flag(synced)?,
                has_state: flag(has_state)?,
            },
            last_token: num(last_token)?,
            ceiling: num(ceiling)?,
        },
        (b"S", []) => PeerMsg::SnapshotBegin,
        (b"E", []) => PeerMsg::SnapshotEnd,
        (b"H", []) => PeerMsg::Handoff,
        (b"T", []) => PeerMsg::Took,
        (b"G", [key, token, ms_left]) => PeerMsg::Delta(Delta::grant(
            Key::new(key).ok()?,
            num(token)?,
            num(ms_left)?,
        )),
        (b"G", [key, token, ms_left, limit, slot, value @ ..]) if value.len() <= 1 => {
            PeerMsg::Delta(Delta::Grant {
                key: Key::new(key).ok()?,
                token: num(token)?,
                ms_left: num(ms_left)?,
                // Any u32: the range is the receiver's check (a refusal
                // that says why, not a line not understood).
                limit: u32::try_from(num(limit)?).ok()?,
                slot: u32::try_from(num(slot)?).ok()?,
                value: match value {
                    [value] => Some(Value::new(value).ok()?),
                    _ => None,
                },
            })
        }
        (b"F", [key, token, slot @ ..]) if slot.len() <= 1 => PeerMsg::Delta(Delta::Free {
            key: Key::new(key).ok()?,
            token: num(token)?,
            slot: match slot {
                [slot] => u32::try_from(num(slot)?).ok()?,
                _ => 0,
            },
        }),
        (b"C", [ceiling]) => PeerMsg::Delta(Delta::Ceiling(num(ceiling)?)),
        _ => return not_understood(),
    };
    Some(msg)
}

fn flag(field: &[u8]) -> Option<bool> {
    match field {
        b"0" => Some(false),
        b"1" => Some(true),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(msg: PeerMsg) {
        let mut out = Vec::new();
        msg.write_to(&mut out);
        assert!(is_peer_line(&out));
        assert_eq!(
            parse_peer(&out),
            PeerParsed::Line {
                used: out.len(),
                msg: Some(msg)
            }
        );
    }

    #[test]
    fn every_peer_message_round_trips() {
        let key = Key::new(b"some/key").expect("valid");
        for following in [None, Some(0)] {
            round_trip(PeerMsg::Beat {
                beat: Beat {
                    role: RoleName::HandingOff,
                    following,
                    synced: true,
                    has_state: false,
                },
                last_token: u64::MAX,
                ceiling: 7,
            });
        }
        round_trip(PeerMsg::SnapshotBegin);
        round_trip(PeerMsg::SnapshotEnd);
        round_trip(PeerMsg::Handoff);
        round_trip(PeerMsg::Took);
        round_trip(PeerMsg::Delta(Delta::grant(key.clone(), 17, 30_000)));
        round_trip(PeerMsg::Delta(Delta::free(key, 17)));
        round_trip(PeerMsg::Delta(Delta::Ceiling(1 << 40)));
    }

    #[test]
    fn deltas_round_trip_at_the_ends_of_their_numbers() {
        let key = Key::new(b"k").expect("valid");
        for n in [0, 1, 9, 10, u64::MAX - 1, u64::MAX] {
            round_trip(PeerMsg::Delta(Delta::grant(key.clone(), n, n)));
            round_trip(PeerMsg::Delta(Delta::free(key.clone(), n)));
            round_trip(PeerMsg::Delta(Delta::Ceiling(n)));
        }
        let mut out = Vec::new();
        PeerMsg::Delta(Delta::Ceiling(u64::MAX)).write_to(&mut out);
        assert_eq!(out, b"P C 18446744073709551615\n");
    }

    #[test]
    fn a_semaphores_grants_and_frees_carry_limit_slot_and_value_and_a_mutexs_lines_are_as_before() {
        let key = Key::new(b"pool").expect("valid");
        let value = Value::new(b"10.0.0.7:8080").expect("valid");
        for (limit, slot, value) in [
            (3, 2, Some(value.clone())),
            (3, 0, None),
            (1, 0, Some(value.clone())),
            (crate::protocol::MAX_LIMIT, 9_999, None),
        ] {
            round_trip(PeerMsg::Delta(Delta::Grant {
                key: key.clone(),
                token: 17,
                ms_left: 30_000,
                limit,
                slot,
                value,
            }));
        }
        round_trip(PeerMsg::Delta(Delta::Free {
            key: key.clone(),
            token: 17,
            slot: 4,
        }));
        let line = |msg: PeerMsg| {
            let mut out = Vec::new();
            msg.write_to(&mut out);
            String::from_utf8(out).expect("text")
        };
        assert_eq!(
            line(PeerMsg::Delta(Delta::grant(key.clone(), 17, 5))),
            "P G pool 17 5\n"
        );
        assert_eq!(
            line(PeerMsg::Delta(Delta::free(key.clone(), 17))),
            "P F pool 17\n"
        );
        assert_eq!(
            line(PeerMsg::Delta(Delta::Grant {
                key: key.clone(),
                token: 17,
                ms_left: 5,
                limit: 3,
                slot: 1,
                value: Some(value),
            })),
            "P G pool 17 5 3 1 10.0.0.7:8080\n"
        );
        assert_eq!(
            line(PeerMsg::Delta(Delta::Free {
                key,
                token: 17,
                slot: 1
            })),
            "P F pool 17 1\n"
        );
        // A limit or slot of any u32 parses (its range is the receiver's
        // check, with a reason); past u32 it is not understood.
        assert!(matches!(
            parse_peer(b"P G k 1 2 0 70000\n"),
            PeerParsed::Line {
                msg: Some(PeerMsg::Delta(Delta::Grant {
                    limit: 0,
                    slot: 70_000,
                    ..
                })),
                ..
            }
        ));
    }

    #[test]
    fn a_grant_with_a_bad_value_or_a_half_semaphore_is_not_understood() {
        let long = format!(
            "P G k 1 2 3 0 {}\n",
            "v".repeat(crate::protocol::MAX_VALUE + 1)
        );
        for line in [
            &b"P G k 1 2 3\n"[..],
            b"P G k 1 2 3 0 bad\x01value\n",
            b"P G k 1 2 3 0 del\x7f\n",
            b"P G k 1 2 3 0 a b\n",
            b"P G k 1 2 4294967296 0\n",
            b"P G k 1 2 3 4294967296\n",
            b"P G k 1 2 -3 0\n",
            b"P F k 1 2 3\n",
            b"P F k 1 4294967296\n",
            long.as_bytes(),
        ] {
            assert_eq!(
                parse_peer(line),
                PeerParsed::Line {
                    used: line.len(),
                    msg: None
                },
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn numbers_are_digits_only_and_never_overflow() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"007"), Some(7));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"18446744073709551616",
            b"99999999999999999999999",
            b"+5",
            b"-1",
            b"1a",
            b" 1",
            b"\xff",
        ] {
            assert_eq!(parse_u64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_line_with_too_many_fields_is_not_understood() {
        for line in [
            &b"P B active - 1 1 5 6 7\n"[..],
            b"P G k 1 2 3 4 5 6 7 8 9\n",
            b"P C 1 2 3 4 5 6 7\n",
        ] {
            assert_eq!(
                parse_peer(line),
                PeerParsed::Line {
                    used: line.len(),
                    msg: None
                }
            );
        }
    }

    #[test]
    fn malformed_peer_lines_are_errors_not_panics() {
        for line in [
            &b"P\n"[..],
            b"P X\n",
            b"P B active - 2 0 1 1\n",
            b"P G bad\x01key 1 1\n",
            b"P HELLO 1 3\n",
            b"Q k\n",
            b"P G k 1\n",
        ] {
            assert_eq!(
                parse_peer(line),
                PeerParsed::Line {
                    used: line.len(),
                    msg: None
                },
                "{line:?}"
            );
        }
        assert_eq!(parse_peer(b"P HEL"), PeerParsed::Incomplete);
        let long = vec![b'x'; MAX_LINE + 5];
        assert!(matches!(
            parse_peer(&long),
            PeerParsed::Line { msg: None, .. }
        ));
    }
}
