//! The contention view's JSON (`GET /keys`, `GET /keys/<key>`), written by
//! hand from a [`KeysView`] the lock owner copied.
//!
//! Owns: the shape of the JSON (section 11 of the spec: `{"role", "node",
//! "contended", "keys": [...]}` for the list, one key's entry for a
//! lookup, `{"error": ...}` for a key with neither holder nor waiter) and
//! how bytes become JSON strings ([`json_string`]): a key or value may
//! hold any byte from 0x21 up but 0x7F, UTF-8 or not, so each run of valid
//! UTF-8 is written as itself (`"` and `\` escaped), and each byte that is not
//! part of valid UTF-8 as `\u00XX`, the character of the same number (its
//! Latin-1 reading). That last is lossy: `\u00e9` may be the byte 0xE9 or
//! the character é sent as UTF-8 (0xC3 0xA9). Such keys are rare (clients
//! send text); to look one up, percent-encode its bytes.
//!
//! Runs on the metrics thread; pure functions, unit-tested here.
//!
//! Never does: I/O, or touch the lock table.

use std::fmt::Write as _;

use crate::server::core::contention::{By, KeyEntry, KeysView};

/// `GET /keys?top=N&by=...`: the first `top` contended keys by `by`, from
/// a view taken for at least that many.
pub fn render_list(view: &KeysView, by: By, top: usize) -> String {
    let keys = match by {
        By::Waiting => &view.by_waiting,
        By::Age => &view.by_age,
    };
    let mut out = String::with_capacity(256 + 256 * keys.len().min(top));
    out.push_str("{\"role\":");
    json_string(&mut out, view.role.as_bytes());
    out.push_str(",\"node\":");
    json_string(&mut out, view.node.as_bytes());
    let _ = write!(out, ",\"contended\":{},\"keys\":[", view.contended);
    for (i, entry) in keys.iter().take(top).enumerate() {
        if i > 0 {
            out.push(',');
        }
        key_entry(&mut out, entry);
    }
    out.push_str("]}\n");
    out
}

/// `GET /keys/<key>` of a key held or awaited: its entry.
pub fn render_key(entry: &KeyEntry) -> String {
    let mut out = String::with_capacity(256 + 128 * entry.holders.len());
    key_entry(&mut out, entry);
    out.push('\n');
    out
}

/// `GET /keys/<key>` of a key with neither holder nor waiter (a 404).
pub fn render_not_found(key: &[u8]) -> String {
    let mut out = String::from("{\"error\":\"no holder and no waiter\",\"key\":");
    json_string(&mut out, key);
    out.push_str("}\n");
    out
}

/// `{"error": what}`, for the view's other failures.
pub fn render_error(what: &str) -> String {
    let mut out = String::from("{\"error\":");
    json_string(&mut out, what.as_bytes());
    out.push_str("}\n");
    out
}

fn key_entry(out: &mut String, e: &KeyEntry) {
    out.push_str("{\"key\":");
    json_string(out, e.key.as_bytes());
    let _ = write!(
        out,
        ",\"limit\":{},\"waiting\":{},\"oldest_wait_ms\":{},\"holders\":[",
        e.limit, e.waiting, e.oldest_wait_ms
    );
    for (i, h) in e.holders.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"token\":\"{}\",\"slot\":{},\"value\":",
            h.token, h.slot
        );
        match &h.value {
            Some(value) => json_string(out, value.as_bytes()),
            None => out.push_str("null"),
        }
        let _ = write!(
            out,
            ",\"held_ms\":{},\"ms_left\":{}}}",
            h.held_ms, h.ms_left
        );
    }
    out.push(']');
    if e.more_holders > 0 {
        let _ = write!(out, ",\"more_holders\":{}", e.more_holders);
    }
    out.push('}');
}

/// `bytes` as a JSON string (see the module doc for bytes that are not
/// UTF-8).
pub fn json_string(out: &mut String, bytes: &[u8]) {
    out.push('"');
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c => out.push(c),
            }
        }
        for &b in chunk.invalid() {
            let _ = write!(out, "\\u{:04x}", b);
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Key, Value};
    use crate::server::core::contention::{HolderEntry, KeysAsk};

    fn s(bytes: &[u8]) -> String {
        let mut out = String::new();
        json_string(&mut out, bytes);
        out
    }

    #[test]
    fn strings_escape_quotes_backslashes_and_bytes_that_are_not_utf8() {
        assert_eq!(s(b"plain"), "\"plain\"");
        assert_eq!(s(b"a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(s(b"del\x7f"), "\"del\\u007f\"");
        assert_eq!(s("café".as_bytes()), "\"café\"");
        assert_eq!(s(b"\xe9t\xc3"), "\"\\u00e9t\\u00c3\"");
        assert_eq!(s(b"\xfe\xff"), "\"\\u00fe\\u00ff\"");
        // Every key byte gives JSON a parser takes, whatever follows it.
        for b in 0x21..=0xffu8 {
            let text = s(&[b, b'x', b]);
            let parsed: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
            assert!(parsed.is_string(), "{text}");
        }
    }

    fn entry() -> KeyEntry {
        KeyEntry {
            key: Key::new(b"jobs/\"nightly\"").expect("key"),
            limit: 2,
            waiting: 3,
            oldest_wait_ms: 4_200,
            holders: vec![
                HolderEntry {
                    token: (1 << 62) + 17,
                    slot: 1,
                    value: Some(Value::new(b"host-a:9").expect("value")),
                    held_ms: 61_000,
                    ms_left: 900,
                },
                HolderEntry {
                    token: 5,
                    slot: 0,
                    value: None,
                    held_ms: 1,
                    ms_left: 0,
                },
            ],
            more_holders: 0,
        }
    }

    #[test]
    fn the_list_and_a_key_render_as_the_spec_shows_them() {
        let view = KeysView {
            ask: KeysAsk::default(),
            role: "active",
            node: "127.0.0.1:7373".into(),
            contended: 7,
            by_waiting: vec![entry(), entry()],
            by_age: vec![],
            lookups: vec![],
        };
        let list: serde_json::Value =
            serde_json::from_str(&render_list(&view, By::Waiting, 1)).expect("JSON");
        assert_eq!(list["role"], "active");
        assert_eq!(list["node"], "127.0.0.1:7373");
        assert_eq!(list["contended"], 7);
        assert_eq!(list["keys"].as_array().map(Vec::len), Some(1), "top 1");
        let key = &list["keys"][0];
        assert_eq!(key["key"], "jobs/\"nightly\"");
        assert_eq!(
            (key["limit"].as_u64(), key["waiting"].as_u64()),
            (Some(2), Some(3))
        );
        assert_eq!(key["oldest_wait_ms"], 4_200);
        assert_eq!(key["holders"][0]["token"], ((1u64 << 62) + 17).to_string());
        assert_eq!(key["holders"][0]["slot"], 1);
        assert_eq!(key["holders"][0]["value"], "host-a:9");
        assert_eq!(key["holders"][0]["held_ms"], 61_000);
        assert_eq!(key["holders"][0]["ms_left"], 900);
        assert!(key["holders"][1]["value"].is_null());
        assert!(key.get("more_holders").is_none());
        let empty: serde_json::Value =
            serde_json::from_str(&render_list(&view, By::Age, 20)).expect("JSON");
        assert_eq!(empty["keys"], serde_json::json!([]));

        let mut many = entry();
        many.more_holders = 4;
        let one: serde_json::Value = serde_json::from_str(&render_key(&many)).expect("JSON");
        assert_eq!(one["more_holders"], 4);
        assert_eq!(one["key"], key["key"]);
        let missing: serde_json::Value =
            serde_json::from_str(&render_not_found(b"gone\xff")).expect("JSON");
        assert_eq!(missing["key"], "gone\u{ff}");
    }
}
