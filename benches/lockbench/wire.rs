//! The wire formats the load generator speaks, with no I/O.
//!
//! Owns: writing an acquire and a release, and reading one answer, for each
//! system the harness drives — baton's line protocol (docs/protocol.md),
//! `batond --echo` (every line comes back as it was sent), a Redis lock in
//! RESP (`SET key token NX PX lease`, released by the compare-and-delete
//! script through `EVALSHA`), a Redis sorted-set semaphore (one Lua script
//! to acquire, `ZREM` to release), and Redis `PING` inline (the Redis
//! floor); and the watch streams read by the watch rows: baton's `W` lines
//! and Redis pub/sub messages. The engine (engine.rs) drives every lock
//! through the same code; only these functions differ.
//!
//! Never does: allocate per answer, or decide what a slot does next.

use std::fmt;

/// The compare-and-delete release, loaded with `SCRIPT LOAD`.
pub const RELEASE_SCRIPT: &str = "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"del\",KEYS[1]) else return 0 end";

/// The sorted-set semaphore's acquire, loaded with `SCRIPT LOAD` and called
/// `EVALSHA sha 1 key token limit lease_ms`: drop the members whose lease
/// ran out (scored by the server's clock in ms), then join if fewer than
/// `limit` hold the key. Answers 1 (granted) or 0 (full: retry).
pub const SEMAPHORE_SCRIPT: &str = "local t = redis.call('TIME') \
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3])) \
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then \
redis.call('ZADD', KEYS[1], now, ARGV[1]) return 1 end return 0";

/// Which system a connection talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// baton: `A key lease wait` / `R key token`; answers name (op, key).
    Baton,
    /// `batond --echo`: the same lines, each answered with itself.
    Echo,
    /// A Redis lock: `SET key token NX PX lease` / `EVALSHA sha 1 key token`.
    RedisLock,
    /// The Redis floor: `PING` inline for each of the two requests.
    RedisPing,
    /// A Redis sorted-set semaphore: `EVALSHA` of `SEMAPHORE_SCRIPT` /
    /// `ZREM key token`.
    RedisSemaphore,
}

impl Proto {
    /// Answers come back in request order (so the engine matches them
    /// first-in first-out); baton matches by (op, key) instead.
    pub fn in_order(self) -> bool {
        self != Proto::Baton
    }

    /// The server issues the token (baton); otherwise the client makes one.
    pub fn server_tokens(self) -> bool {
        self == Proto::Baton
    }
}

/// The requests of a lock (and the Redis watch rows' `PUBLISH`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Acquire,
    Release,
    Publish,
}

/// What an answer says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The key is ours; baton's token (0 where the client made the token).
    Granted(u64),
    /// Redis: the key is held by someone else (`SET NX` answered nil).
    Busy,
    /// baton: the wait ran out.
    TimedOut,
    /// Released.
    Released,
    /// The token did not hold the key.
    NotHeld,
    /// A floor answer (echo line or PONG).
    Ack,
    /// Anything else: `E`, `M`, `-ERR`, or a line we do not understand.
    Error,
}

/// A token as the wire carries it: decimal digits, kept as text so a
/// release sends back the grant's digits as they came, with no
/// formatting per request (as a client would).
#[derive(Clone, Copy, Debug, Default)]
pub struct TokenText {
    digits: [u8; 20],
    len: u8,
}

impl TokenText {
    /// `n` in decimal.
    pub fn of(n: u64) -> TokenText {
        let mut text = [0u8; 20];
        TokenText::copied(decimal(n, &mut text))
    }

    /// The token of a baton grant (`A <token> <key>`) as it came off the
    /// wire: only called on an answer `parse_reply` read as a grant, whose
    /// token field parsed as a u64 (so at most 20 digits).
    pub fn of_grant(line: &[u8]) -> TokenText {
        let field = line.get(2..).unwrap_or_default();
        let end = field.iter().position(|&b| b == b' ').unwrap_or(field.len());
        TokenText::copied(&field[..end])
    }

    /// Digits as given (at most 20 bytes are kept).
    fn copied(field: &[u8]) -> TokenText {
        let mut token = TokenText::default();
        let len = field.len().min(token.digits.len());
        token.digits[..len].copy_from_slice(&field[..len]);
        token.len = len as u8;
        token
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.digits[..usize::from(self.len)]
    }
}

/// One answer, borrowed from the read buffer.
#[derive(Debug)]
pub struct Reply<'a> {
    pub kind: Kind,
    /// The op the answer belongs to, where the answer says so.
    pub op: Option<Op>,
    /// The key the answer names (baton and echo).
    pub key: Option<&'a [u8]>,
    /// The whole answer, line ending excluded (for error messages).
    pub text: &'a [u8],
    /// Bytes of the buffer this answer used.
    pub used: usize,
}

/// A malformed answer: the server is not speaking the protocol we expect.
#[derive(Debug)]
pub struct BadAnswer(pub String);

impl fmt::Display for BadAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Longest answer line accepted before calling the stream broken.
const MAX_ANSWER: usize = 4096;

/// Append an acquire of `key`. `token` is the client's token (Redis only);
/// `lease_ms` and `wait_ms` as docs/protocol.md (Redis uses only the lease:
/// the wait is the client's retry loop).
pub fn write_acquire(
    proto: Proto,
    out: &mut Vec<u8>,
    key: &[u8],
    token: &TokenText,
    lease_ms: u64,
    wait_ms: u64,
) {
    write_acquire_limited(proto, out, key, token, lease_ms, wait_ms, None, &[]);
}

/// `write_acquire` with a semaphore's limit: baton's `A key lease wait
/// limit` (no field when `None`), the Redis semaphore's `EVALSHA sha 1 key
/// token limit lease_ms` (`sha`: its script's SHA1; limit 1 when `None`).
#[allow(clippy::too_many_arguments)]
pub fn write_acquire_limited(
    proto: Proto,
    out: &mut Vec<u8>,
    key: &[u8],
    token: &TokenText,
    lease_ms: u64,
    wait_ms: u64,
    limit: Option<u32>,
    sha: &[u8],
) {
    match proto {
        Proto::Baton | Proto::Echo => {
            out.extend_from_slice(b"A ");
            out.extend_from_slice(key);
            out.push(b' ');
            write_seconds(lease_ms, out);
            out.push(b' ');
            write_seconds(wait_ms, out);
            if let Some(limit) = limit {
                let mut text = [0u8; 20];
                out.push(b' ');
                out.extend_from_slice(decimal(u64::from(limit), &mut text));
            }
            out.push(b'\n');
        }
        Proto::RedisSemaphore => {
            let (mut limit_text, mut lease_text) = ([0u8; 20], [0u8; 20]);
            let limit_text = decimal(u64::from(limit.unwrap_or(1)), &mut limit_text);
            let lease_text = decimal(lease_ms, &mut lease_text);
            resp_command(
                out,
                &[
                    b"EVALSHA",
                    sha,
                    b"1",
                    key,
                    token.as_bytes(),
                    limit_text,
                    lease_text,
                ],
            );
        }
        Proto::RedisLock => {
            let mut lease_text = [0u8; 20];
            let lease_text = decimal(lease_ms, &mut lease_text);
            let token = token.as_bytes();
            resp_command(out, &[b"SET", key, token, b"NX", b"PX", lease_text]);
        }
        Proto::RedisPing => out.extend_from_slice(b"PING\r\n"),
    }
}

/// Append a release of `key` held with `token`. `sha` is the release
/// script's SHA1 (Redis lock only).
pub fn write_release(proto: Proto, out: &mut Vec<u8>, key: &[u8], token: &TokenText, sha: &[u8]) {
    match proto {
        Proto::Baton | Proto::Echo => {
            out.extend_from_slice(b"R ");
            out.extend_from_slice(key);
            out.push(b' ');
            out.extend_from_slice(token.as_bytes());
            out.push(b'\n');
        }
        Proto::RedisLock => {
            resp_command(out, &[b"EVALSHA", sha, b"1", key, token.as_bytes()]);
        }
        Proto::RedisSemaphore => resp_command(out, &[b"ZREM", key, token.as_bytes()]),
        Proto::RedisPing => out.extend_from_slice(b"PING\r\n"),
    }
}

/// Append `PUBLISH channel <id>` (the Redis watch rows: the new holder
/// tells the subscribers which change this is).
pub fn write_publish(out: &mut Vec<u8>, channel: &[u8], id: u64) {
    let mut text = [0u8; 20];
    resp_command(out, &[b"PUBLISH", channel, decimal(id, &mut text)]);
}

/// What an in-order answer means for the request it answers: the Redis
/// semaphore's acquire answers 1 (granted) or 0 (full), which RESP reading
/// alone takes for a release's.
pub fn in_answer_to(proto: Proto, op: Op, kind: Kind) -> Kind {
    match (proto, op, kind) {
        (Proto::RedisSemaphore, Op::Acquire, Kind::Released) => Kind::Granted(0),
        (Proto::RedisSemaphore, Op::Acquire, Kind::NotHeld) => Kind::Busy,
        _ => kind,
    }
}

/// Read one answer from the front of `buf`: `Ok(None)` when no whole answer
/// is there yet.
pub fn parse_reply(proto: Proto, buf: &[u8]) -> Result<Option<Reply<'_>>, BadAnswer> {
    let Some(end) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > MAX_ANSWER {
            return Err(BadAnswer(format!("answer longer than {MAX_ANSWER} bytes")));
        }
        return Ok(None);
    };
    let used = end + 1;
    let line = match &buf[..end] {
        [head @ .., b'\r'] => head,
        line => line,
    };
    let reply = match proto {
        Proto::Baton => baton_answer(line, used),
        Proto::Echo => echo_answer(line, used),
        Proto::RedisLock | Proto::RedisPing | Proto::RedisSemaphore => resp_answer(line, used)?,
    };
    Ok(Some(reply))
}

fn baton_answer(line: &[u8], used: usize) -> Reply<'_> {
    common_baton_answer(line, used).unwrap_or_else(|| general_baton_answer(line, used))
}

/// Any baton answer, field by field.
pub(crate) fn general_baton_answer(line: &[u8], used: usize) -> Reply<'_> {
    let mut fields = line.split(|&b| b == b' ');
    let tag = fields.next().unwrap_or_default();
    let second = fields.next();
    let third = fields.next();
    let (kind, op, key) = match (tag, second, third) {
        (b"A", Some(token), Some(key)) => match parse_u64(token) {
            Some(token) if token != 0 => (Kind::Granted(token), Some(Op::Acquire), Some(key)),
            _ => (Kind::Error, None, None),
        },
        (b"T", Some(key), None) => (Kind::TimedOut, Some(Op::Acquire), Some(key)),
        (b"R", Some(key), None) => (Kind::Released, Some(Op::Release), Some(key)),
        (b"N", Some(key), None) => (Kind::NotHeld, Some(Op::Release), Some(key)),
        (b"E" | b"M", _, _) => {
            // `E <op> <key> <reason>`, `M <addr> <op> <key>`.
            let (op, key) = if tag == b"E" {
                (second, third)
            } else {
                (third, fields.next())
            };
            let op = match op {
                Some(b"A") => Some(Op::Acquire),
                Some(b"R") => Some(Op::Release),
                _ => None,
            };
            (Kind::Error, op, key.filter(|k| *k != b"-"))
        }
        _ => (Kind::Error, None, None),
    };
    Reply {
        kind,
        op,
        key,
        text: line,
        used,
    }
}

/// The two answers that make up nearly all traffic, `A <token> <key>` and
/// `R <key>`, read in one pass: the same reply the general reading in
/// `baton_answer` gives (tests/lockbench_wire.rs compares the two), or `None` for anything
/// else, which then goes the general way. A grant's token has at most 19
/// digits here, so it needs no overflow checks. The load generator sets the
/// rate of the busiest rows, so what it spends per answer shows in them.
pub(crate) fn common_baton_answer(line: &[u8], used: usize) -> Option<Reply<'_>> {
    let (kind, op, key) = match line {
        [b'A', b' ', rest @ ..] => {
            let digits = rest
                .iter()
                .take(20)
                .take_while(|b| b.is_ascii_digit())
                .count();
            if !(1..=19).contains(&digits) || rest.get(digits) != Some(&b' ') {
                return None;
            }
            let token = rest[..digits]
                .iter()
                .fold(0u64, |n, &b| n * 10 + u64::from(b - b'0'));
            let after = &rest[digits + 1..];
            let key = &after[..after.iter().position(|&b| b == b' ').unwrap_or(after.len())];
            if token == 0 {
                return None;
            }
            (Kind::Granted(token), Op::Acquire, key)
        }
        [b'R', b' ', key @ ..] if !key.contains(&b' ') => (Kind::Released, Op::Release, key),
        _ => return None,
    };
    Some(Reply {
        kind,
        op: Some(op),
        key: Some(key),
        text: line,
        used,
    })
}

fn echo_answer(line: &[u8], used: usize) -> Reply<'_> {
    let mut fields = line.split(|&b| b == b' ');
    let op = match fields.next() {
        Some(b"A") => Some(Op::Acquire),
        Some(b"R") => Some(Op::Release),
        _ => None,
    };
    Reply {
        kind: if op.is_some() { Kind::Ack } else { Kind::Error },
        op,
        key: fields.next(),
        text: line,
        used,
    }
}

fn resp_answer(line: &[u8], used: usize) -> Result<Reply<'_>, BadAnswer> {
    let kind = match line {
        b"+OK" => Kind::Granted(0),
        b"+PONG" => Kind::Ack,
        b"$-1" | b"_" => Kind::Busy,
        b":1" => Kind::Released,
        b":0" => Kind::NotHeld,
        // Any other integer: a `PUBLISH`'s count of receivers.
        [b':', digits @ ..] if parse_u64(digits).is_some() => Kind::Ack,
        [b'-', ..] => Kind::Error,
        _ => {
            return Err(BadAnswer(format!(
                "unexpected RESP answer {:?}",
                String::from_utf8_lossy(line)
            )));
        }
    };
    Ok(Reply {
        kind,
        op: None,
        key: None,
        text: line,
        used,
    })
}

/// Append a RESP array of bulk strings.
pub fn resp_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    let mut text = [0u8; 20];
    out.push(b'*');
    out.extend_from_slice(decimal(args.len() as u64, &mut text));
    out.extend_from_slice(b"\r\n");
    for arg in args {
        out.push(b'$');
        out.extend_from_slice(decimal(arg.len() as u64, &mut text));
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// `n` in decimal, written into `buf`; returns the digits. Two digits a
/// division (the load generator writes a key or a token per request).
pub fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    while n >= 100 {
        let pair = (n % 100) as usize;
        n /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[2 * pair..2 * pair + 2]);
    }
    if n >= 10 {
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[2 * n as usize..2 * n as usize + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + n as u8;
    }
    &buf[i..]
}

/// "00", "01", ..., "99".
const DIGIT_PAIRS: &[u8; 200] = b"\
    0001020304050607080910111213141516171819\
    2021222324252627282930313233343536373839\
    4041424344454647484950515253545556575859\
    6061626364656667686970717273747576777879\
    8081828384858687888990919293949596979899";

/// Milliseconds as baton's decimal seconds: 30000 -> "30", 50 -> "0.05".
pub fn write_seconds(ms: u64, out: &mut Vec<u8>) {
    let mut text = [0u8; 20];
    out.extend_from_slice(decimal(ms / 1000, &mut text));
    let millis = ms % 1000;
    if millis != 0 {
        let digits = [millis / 100, millis / 10 % 10, millis % 10].map(|d| b'0' + d as u8);
        let len = 3 - digits.iter().rev().take_while(|&&d| d == b'0').count();
        out.push(b'.');
        out.extend_from_slice(&digits[..len]);
    }
}

/// Decimal digits only, fitting a u64.
pub fn parse_u64(field: &[u8]) -> Option<u64> {
    if field.is_empty() || field.len() > 20 {
        return None;
    }
    field.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// One message of a watch stream, read by the watch rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watched {
    /// A state (baton `W <key> <token> ...`: the token; Redis: the id the
    /// publisher sent). The first baton line is the state at the `W`.
    State(u64),
    /// Redis: the `SUBSCRIBE` was confirmed.
    Subscribed,
}

/// Read one watch message from the front of `buf`: `Ok(None)` when no
/// whole message is there yet; otherwise the message and the bytes used.
/// baton: `W <key> <token> <holders> <waiting> <value>` for `key`; Redis
/// (RESP2 push arrays): `subscribe` and `message` for channel `key`.
pub fn parse_watched(
    redis: bool,
    key: &[u8],
    buf: &[u8],
) -> Result<Option<(Watched, usize)>, BadAnswer> {
    if redis {
        return parse_push(key, buf);
    }
    let Some(end) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > MAX_ANSWER {
            return Err(BadAnswer(format!("answer longer than {MAX_ANSWER} bytes")));
        }
        return Ok(None);
    };
    let line = match &buf[..end] {
        [head @ .., b'\r'] => head,
        line => line,
    };
    let bad = || BadAnswer(format!("watch line {:?}", String::from_utf8_lossy(line)));
    let mut fields = line.split(|&b| b == b' ');
    if fields.next() != Some(b"W") || fields.next() != Some(key) {
        return Err(bad());
    }
    let token = fields.next().and_then(parse_u64).ok_or_else(bad)?;
    // holders, waiting, value; nothing after.
    let rest: Vec<&[u8]> = fields.collect();
    if rest.len() != 3 || parse_u64(rest[0]).is_none() || parse_u64(rest[1]).is_none() {
        return Err(bad());
    }
    Ok(Some((Watched::State(token), end + 1)))
}

/// A RESP2 push of three elements: `subscribe <channel> :n` or `message
/// <channel> <payload>`, the payload a decimal id.
fn parse_push(channel: &[u8], buf: &[u8]) -> Result<Option<(Watched, usize)>, BadAnswer> {
    let mut at = 0;
    let Some(head) = resp_line(buf, &mut at)? else {
        return Ok(None);
    };
    if head != b"*3" {
        return Err(BadAnswer(format!(
            "unexpected RESP push {:?}",
            String::from_utf8_lossy(head)
        )));
    }
    let mut items: [&[u8]; 3] = [&[]; 3];
    for item in &mut items {
        let Some(line) = resp_line(buf, &mut at)? else {
            return Ok(None);
        };
        *item = match line {
            [b':', ..] => line,
            [b'$', len @ ..] => {
                let len = parse_u64(len)
                    .filter(|&n| n as usize <= MAX_ANSWER)
                    .ok_or_else(|| BadAnswer("bad RESP bulk length".into()))?
                    as usize;
                if buf.len() < at + len + 2 {
                    return Ok(None);
                }
                let bulk = &buf[at..at + len];
                if &buf[at + len..at + len + 2] != b"\r\n" {
                    return Err(BadAnswer("RESP bulk without its CRLF".into()));
                }
                at += len + 2;
                bulk
            }
            _ => return Err(BadAnswer("unexpected RESP push item".into())),
        };
    }
    let message = match items {
        [b"subscribe", name, _] if name == channel => Watched::Subscribed,
        [b"message", name, id] if name == channel => Watched::State(
            parse_u64(id).ok_or_else(|| BadAnswer("a message that is not an id".into()))?,
        ),
        _ => {
            return Err(BadAnswer(format!(
                "unexpected RESP push {:?}",
                String::from_utf8_lossy(&buf[..at])
            )));
        }
    };
    Ok(Some((message, at)))
}

/// The next CRLF-ended line of `buf` from `*at` (moved past it).
fn resp_line<'a>(buf: &'a [u8], at: &mut usize) -> Result<Option<&'a [u8]>, BadAnswer> {
    let rest = &buf[*at..];
    let Some(end) = rest.windows(2).position(|w| w == b"\r\n") else {
        if rest.len() > MAX_ANSWER {
            return Err(BadAnswer(format!("answer longer than {MAX_ANSWER} bytes")));
        }
        return Ok(None);
    };
    *at += end + 2;
    Ok(Some(&rest[..end]))
}
