//! etcd as a lock service, spoken through its JSON gateway (etcd 3.4:
//! `/v3/...`), for the etcd rows of lockbench (etcd_rows.rs).
//!
//! Owns: base64 (keys and values are base64 in the gateway's JSON), the
//! reading of the gateway's answers (an error answer is an error, a 64-bit
//! number may come as a string or a number), the calls the rows make
//! (`lease/grant`, `lease/revoke`, `lock/lock`, `lock/unlock`,
//! `election/campaign`, `election/observe` (a stream), `election/resign`,
//! `kv/range` with a count, `maintenance/status`), and the etcd side of
//! the rows: closed-loop lock/unlock clients (one thread and connection
//! each, one lease each, as etcd's own `concurrency.Session` keeps), and
//! an election's handoffs timed from the leader's resign to the observer's
//! message naming the next leader.
//!
//! Never does: start or stop etcd, keep a lease alive (the leases outlive
//! a run: `LEASE_TTL_S`), or retry a failed call itself (the caller
//! decides).

use std::net::SocketAddr;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use crate::http::{self, Conn};

/// The TTL of every lease the rows grant: longer than any run.
pub const LEASE_TTL_S: u64 = 120;
/// The longest any one call may take before it is an error.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// A run gives up after this many errors.
const MAX_ERRORS: u64 = 100;

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn b64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64, padding optional; an error on any other byte.
pub fn unb64(text: &str) -> Result<Vec<u8>, String> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut n = 0u32;
    let mut bits = 0;
    for c in text.bytes() {
        let v = B64
            .iter()
            .position(|&b| b == c)
            .ok_or_else(|| format!("not base64: {text:?}"))? as u32;
        n = (n << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((n >> bits) as u8);
            n &= (1 << bits) - 1;
        }
    }
    if bits >= 6 {
        return Err(format!("not base64 (length): {text:?}"));
    }
    Ok(out)
}

/// The JSON of a 200 answer; any other status, or a body that is not
/// JSON, or one naming an error, is an error saying what the gateway said.
pub fn json_of(response: &http::Response) -> Result<Value, String> {
    let text = String::from_utf8_lossy(&response.body);
    let value: Value = serde_json::from_str(&text).map_err(|_| {
        format!(
            "HTTP {}: not JSON: {:?}",
            response.status,
            text.chars().take(200).collect::<String>()
        )
    })?;
    let error = match value.get("error") {
        Some(e) => Some(e),
        None if response.status != 200 => value.get("message"),
        None => None,
    };
    match error {
        Some(e) => Err(format!(
            "HTTP {}: {}",
            response.status,
            e.as_str().map_or_else(|| e.to_string(), str::to_string)
        )),
        None if response.status != 200 => Err(format!(
            "HTTP {}: {}",
            response.status,
            text.chars().take(200).collect::<String>()
        )),
        None => Ok(value),
    }
}

/// A 64-bit field of the gateway's JSON: a string of digits, or a number.
pub fn int_field(value: &Value, name: &str) -> Result<u64, String> {
    match value.get(name) {
        Some(Value::String(s)) => s
            .parse()
            .map_err(|_| format!("field {name}: not a number: {s:?}")),
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| format!("field {name}: not a u64: {n}")),
        _ => Err(format!("no field {name} in {value}")),
    }
}

/// A base64 field, decoded.
pub fn bytes_field(value: &Value, name: &str) -> Result<Vec<u8>, String> {
    match value.get(name) {
        Some(Value::String(s)) => unb64(s),
        _ => Err(format!("no field {name} in {value}")),
    }
}

/// The leader's value in one message of an `observe` stream
/// (`{"result":{"header":..,"kv":{..,"value":"<base64>"}}}`).
pub fn observed_value(message: &[u8]) -> Result<Vec<u8>, String> {
    let value: Value = serde_json::from_slice(message).map_err(|_| {
        format!(
            "observe: not JSON: {:?}",
            String::from_utf8_lossy(&message[..message.len().min(200)])
        )
    })?;
    if let Some(error) = value.get("error") {
        return Err(format!("observe: {error}"));
    }
    let kv = value
        .get("result")
        .and_then(|r| r.get("kv"))
        .ok_or_else(|| format!("observe: no result.kv in {value}"))?;
    match kv.get("value") {
        Some(_) => bytes_field(kv, "value"),
        None => Ok(Vec::new()), // an empty value is left out
    }
}

/// `maintenance/status`: (this member's id, the leader's id).
pub fn parse_status(value: &Value) -> Result<(u64, u64), String> {
    let header = value
        .get("header")
        .ok_or_else(|| format!("status: no header in {value}"))?;
    Ok((int_field(header, "member_id")?, int_field(value, "leader")?))
}

/// One gateway connection.
pub struct Client {
    conn: Conn,
}

impl Client {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<Client, String> {
        Ok(Client {
            conn: Conn::connect(addr, timeout)?,
        })
    }

    fn call(&mut self, path: &str, body: &Value) -> Result<Value, String> {
        let response = self.conn.post(path, body.to_string().as_bytes())?;
        json_of(&response).map_err(|e| format!("{path}: {e}"))
    }

    /// A lease of `ttl_s` seconds; its id.
    pub fn lease_grant(&mut self, ttl_s: u64) -> Result<u64, String> {
        let value = self.call("/v3/lease/grant", &json!({ "TTL": ttl_s }))?;
        int_field(&value, "ID")
    }

    pub fn lease_revoke(&mut self, lease: u64) -> Result<(), String> {
        self.call("/v3/lease/revoke", &json!({ "ID": lease.to_string() }))
            .map(drop)
    }

    /// Acquire lock `name` with `lease`: the key that holds it.
    pub fn lock(&mut self, name: &[u8], lease: u64) -> Result<Vec<u8>, String> {
        let value = self.call(
            "/v3/lock/lock",
            &json!({ "name": b64(name), "lease": lease.to_string() }),
        )?;
        bytes_field(&value, "key")
    }

    pub fn unlock(&mut self, key: &[u8]) -> Result<(), String> {
        self.call("/v3/lock/unlock", &json!({ "key": b64(key) }))
            .map(drop)
    }

    /// Send a campaign without reading its answer (it comes when this
    /// candidate leads): `campaign_answer` reads it.
    pub fn campaign_send(&mut self, name: &[u8], lease: u64, value: &[u8]) -> Result<(), String> {
        let body = json!({ "name": b64(name), "lease": lease.to_string(), "value": b64(value) });
        self.conn
            .send("/v3/election/campaign", body.to_string().as_bytes())
    }

    /// The campaign's answer: the leader key (to resign with).
    pub fn campaign_answer(&mut self) -> Result<Value, String> {
        let value = json_of(&self.conn.response()?)?;
        value
            .get("leader")
            .cloned()
            .ok_or_else(|| format!("campaign: no leader in {value}"))
    }

    pub fn resign(&mut self, leader: &Value) -> Result<(), String> {
        self.call("/v3/election/resign", &json!({ "leader": leader }))
            .map(drop)
    }

    /// Start observing election `name`; `next_leader` reads its messages.
    pub fn observe(&mut self, name: &[u8]) -> Result<(), String> {
        self.conn.send(
            "/v3/election/observe",
            json!({ "name": b64(name) }).to_string().as_bytes(),
        )?;
        let head = self.conn.stream_head()?;
        if head.status != 200 {
            return Err(format!("observe: HTTP {}", head.status));
        }
        Ok(())
    }

    /// The next leader's value an `observe` stream names.
    pub fn next_leader(&mut self) -> Result<Vec<u8>, String> {
        match self.conn.message()? {
            Some(message) => observed_value(&message),
            None => Err("observe: the stream ended".into()),
        }
    }

    /// Keys under `prefix` (a count only).
    pub fn count_prefix(&mut self, prefix: &[u8]) -> Result<u64, String> {
        let mut end = prefix.to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let value = self.call(
            "/v3/kv/range",
            &json!({ "key": b64(prefix), "range_end": b64(&end), "count_only": true }),
        )?;
        // A count of 0 is left out of the JSON.
        Ok(int_field(&value, "count").unwrap_or(0))
    }

    /// (this member's id, the leader's id).
    pub fn status(&mut self) -> Result<(u64, u64), String> {
        let value = self.call("/v3/maintenance/status", &json!({}))?;
        parse_status(&value)
    }
}

/// What a lock run measured (latencies in ns).
pub struct Measured {
    pub secs: f64,
    pub pairs: u64,
    pub grants: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Lock sent → its answer (the lock held).
    pub acquire: Histogram<u64>,
    /// Grants in the window per client.
    pub per_client: Vec<u64>,
}

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid histogram bounds")
}

/// What the clients of a lock run do.
#[derive(Clone, Copy, Debug)]
pub enum LockLoad {
    /// Each client locks a new name every time.
    Uncontended,
    /// Every client on one name.
    Contended,
}

/// `conns` clients, one thread, connection and lease each, lock → unlock
/// in a closed loop for `warmup` then `measure`; counted: locks answered
/// inside the measure window (and the pairs whose unlock was).
pub fn lock_run(
    addr: SocketAddr,
    conns: usize,
    load: LockLoad,
    warmup: Duration,
    measure: Duration,
    prefix: &str,
) -> Result<Measured, String> {
    let barrier = Arc::new(Barrier::new(conns));
    let mut threads = Vec::new();
    for client in 0..conns {
        let barrier = barrier.clone();
        let prefix = prefix.to_string();
        threads.push(std::thread::spawn(move || {
            let setup = Client::connect(addr, CALL_TIMEOUT)
                .and_then(|mut c| c.lease_grant(LEASE_TTL_S).map(|lease| (c, lease)));
            barrier.wait();
            let (mut etcd, lease) = setup?;
            // Every client set up: the windows start together.
            let begin = Instant::now();
            let (from, to) = (begin + warmup, begin + warmup + measure);
            let mut out = Measured {
                secs: measure.as_secs_f64(),
                pairs: 0,
                grants: 0,
                errors: 0,
                first_error: None,
                acquire: histogram(),
                per_client: vec![0; conns],
            };
            let mut i = 0u64;
            while Instant::now() < to {
                i += 1;
                let name = match load {
                    LockLoad::Uncontended => format!("{prefix}u{client}:{i}"),
                    LockLoad::Contended => format!("{prefix}c"),
                };
                let sent = Instant::now();
                let pair = etcd.lock(name.as_bytes(), lease).and_then(|key| {
                    let got = Instant::now();
                    etcd.unlock(&key).map(|()| (got, Instant::now()))
                });
                match pair {
                    Ok((got, done)) => {
                        if sent >= from && got < to {
                            out.grants += 1;
                            out.per_client[client] += 1;
                            out.acquire
                                .record((got - sent).as_nanos() as u64)
                                .map_err(|e| e.to_string())?;
                            if done < to {
                                out.pairs += 1;
                            }
                        }
                    }
                    Err(e) => {
                        out.errors += 1;
                        out.first_error.get_or_insert(e);
                        if out.errors >= MAX_ERRORS {
                            break;
                        }
                        etcd = Client::connect(addr, CALL_TIMEOUT)?;
                    }
                }
            }
            let _ = etcd.lease_revoke(lease);
            Ok::<Measured, String>(out)
        }));
    }
    let mut total: Option<Measured> = None;
    let mut first_error = None;
    for thread in threads {
        match thread.join() {
            Ok(Ok(m)) => match total.as_mut() {
                None => total = Some(m),
                Some(t) => {
                    t.pairs += m.pairs;
                    t.grants += m.grants;
                    t.errors += m.errors;
                    if t.first_error.is_none() {
                        t.first_error = m.first_error;
                    }
                    t.acquire.add(&m.acquire).map_err(|e| e.to_string())?;
                    for (a, b) in t.per_client.iter_mut().zip(&m.per_client) {
                        *a += b;
                    }
                }
            },
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert("a client thread panicked".to_string());
            }
        }
    }
    match (total, first_error) {
        (_, Some(e)) => Err(e),
        (Some(t), None) => Ok(t),
        (None, None) => Err("no clients".into()),
    }
}

/// Wait (polling every millisecond, at most `bound`) until `ready`.
pub fn poll_until(
    bound: Duration,
    what: &str,
    mut ready: impl FnMut() -> Result<bool, String>,
) -> Result<(), String> {
    let deadline = Instant::now() + bound;
    loop {
        if ready()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("{what}: not within {bound:?}"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `handoffs` leader changes of election `name` between two candidates:
/// each time the waiting candidate's campaign is in (its key written), the
/// leader resigns; timed from the resign sent to the observer's message
/// naming the waiting candidate. Latencies in ns.
pub fn election_run(
    addr: SocketAddr,
    name: &str,
    handoffs: usize,
) -> Result<Histogram<u64>, String> {
    let mut candidates = [
        Client::connect(addr, CALL_TIMEOUT)?,
        Client::connect(addr, CALL_TIMEOUT)?,
    ];
    let mut observer = Client::connect(addr, CALL_TIMEOUT)?;
    let mut control = Client::connect(addr, CALL_TIMEOUT)?;
    let leases = [
        candidates[0].lease_grant(LEASE_TTL_S)?,
        candidates[1].lease_grant(LEASE_TTL_S)?,
    ];
    let name = name.as_bytes();
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    candidates[0].campaign_send(name, leases[0], b"c0-0")?;
    let mut leader = candidates[0].campaign_answer()?;
    observer.observe(name)?;
    let first = observer.next_leader()?;
    if first != b"c0-0" {
        return Err(format!(
            "observe: first leader {:?}, not c0-0",
            String::from_utf8_lossy(&first)
        ));
    }
    let mut times = histogram();
    let mut current = 0;
    for i in 1..=handoffs {
        let next = 1 - current;
        let value = format!("c{next}-{i}");
        candidates[next].campaign_send(name, leases[next], value.as_bytes())?;
        poll_until(CALL_TIMEOUT, "the campaign's key", || {
            Ok(control.count_prefix(&prefix)? >= 2)
        })?;
        let resigned = Instant::now();
        candidates[current].resign(&leader)?;
        loop {
            let seen = observer.next_leader()?;
            if seen == value.as_bytes() {
                break;
            }
        }
        times
            .record(resigned.elapsed().as_nanos() as u64)
            .map_err(|e| e.to_string())?;
        leader = candidates[next].campaign_answer()?;
        current = next;
    }
    candidates[current].resign(&leader)?;
    for lease in leases {
        let _ = control.lease_revoke(lease);
    }
    Ok(times)
}
