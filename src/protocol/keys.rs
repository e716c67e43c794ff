//! Keys and values: what bytes they may hold, kept inline when short.

use super::*;

/// A lock key: 1 to 250 bytes, none of them a space, a control byte (< 0x21)
/// or 0x7F. Bytes >= 0x80 are allowed (UTF-8 is fine).
///
/// Keys of up to `INLINE_KEY` bytes are stored inline (no allocation: most
/// keys are short, and every request carries one); longer ones on the heap.
/// Equality, ordering and hashing are those of the bytes.
#[derive(Clone)]
pub struct Key(KeyRepr);

/// Bytes a key may have and still be stored inline.
pub const INLINE_KEY: usize = 22;

#[derive(Clone)]
pub(super) enum KeyRepr {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Key) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Key) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

/// A holder's value: 1 to [`MAX_VALUE`] bytes, the same bytes a key may
/// have (no space, control byte or 0x7F), but not `-` alone, which is how
/// a `W` line says "no value". Kept on the heap: most grants
/// carry none, and `Option<Value>` costs them one pointer's worth.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Value(Box<[u8]>);

impl Value {
    /// Validates: 1..=MAX_VALUE bytes, each a key byte, not `-` alone.
    /// Err(BadValue) otherwise.
    pub fn new(bytes: &[u8]) -> Result<Value, Reason> {
        if bytes.len() <= MAX_VALUE && is_printable_field(bytes) && bytes != b"-" {
            Ok(Value(Box::from(bytes)))
        } else {
            Err(Reason::BadValue)
        }
    }

    /// The value's bytes, as sent on the wire.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

impl Key {
    /// Validates: 1..=MAX_KEY bytes, every byte >= 0x21 and != 0x7F.
    /// Err(Reason::BadKey) otherwise.
    pub fn new(bytes: &[u8]) -> Result<Key, Reason> {
        if bytes.is_empty() || bytes.len() > MAX_KEY {
            return Err(Reason::BadKey);
        }
        if bytes.len() > INLINE_KEY {
            return if is_printable_field(bytes) {
                Ok(Key(KeyRepr::Heap(Box::from(bytes))))
            } else {
                Err(Reason::BadKey)
            };
        }
        // A short key is checked without a branch per byte (which the
        // compiler turns into a few vector compares).
        if !all_key_bytes(bytes) {
            return Err(Reason::BadKey);
        }
        Ok(Key::inline(bytes))
    }

    /// A key of bytes already known to be key bytes ([`first_non_key_byte`]
    /// found none): only its length is checked. None if it is empty or too
    /// long.
    pub(super) fn from_key_bytes(bytes: &[u8]) -> Option<Key> {
        debug_assert!(all_key_bytes(bytes));
        let n = bytes.len();
        if n == 0 || n > MAX_KEY {
            None
        } else if n <= INLINE_KEY {
            Some(Key::inline(bytes))
        } else {
            Some(Key(KeyRepr::Heap(Box::from(bytes))))
        }
    }

    /// A short key (1 to `INLINE_KEY` bytes), copied in at most three
    /// fixed-size moves rather than a call to `memcpy`.
    pub(super) fn inline(bytes: &[u8]) -> Key {
        let n = bytes.len();
        debug_assert!((1..=INLINE_KEY).contains(&n));
        let mut inline = [0u8; INLINE_KEY];
        if n >= 8 {
            // The first eight, the next eight if the key is longer than
            // sixteen, and the last eight (overlapping the others).
            inline[..8].copy_from_slice(&bytes[..8]);
            if n > 16 {
                inline[8..16].copy_from_slice(&bytes[8..16]);
            }
            inline[n - 8..n].copy_from_slice(&bytes[n - 8..]);
        } else {
            for (to, from) in inline.iter_mut().zip(bytes) {
                *to = *from;
            }
        }
        Key(KeyRepr::Inline {
            len: n as u8,
            bytes: inline,
        })
    }

    /// The key's bytes, as sent on the wire.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            KeyRepr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            KeyRepr::Heap(bytes) => bytes,
        }
    }
}

/// Non-empty, and every byte allowed in a key (no space, control byte or 0x7F).
pub(super) fn is_printable_field(bytes: &[u8]) -> bool {
    !bytes.is_empty() && all_key_bytes(bytes)
}

/// A byte a key may have: not a space, a control byte or 0x7F.
pub(super) fn is_key_byte(b: u8) -> bool {
    b >= 0x21 && b != 0x7F
}

/// Where the first byte of `bytes` that may not be in a key is (a space, a
/// control byte or 0x7F: [`is_key_byte`]), eight bytes at a time; None if
/// there is none. One pass both finds where a key field ends and checks it.
pub(super) fn first_non_key_byte(bytes: &[u8]) -> Option<usize> {
    const LOW: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let mut base = 0;
    let mut rest = bytes;
    while let Some((chunk, more)) = rest.split_first_chunk::<8>() {
        let word = u64::from_le_bytes(*chunk);
        // The lowest marked byte of each is a real one (a false mark only
        // ever lies above a real one): bytes below 0x21, and bytes 0x7F.
        let below = word.wrapping_sub(LOW * 0x21) & !word & HIGH;
        let del = word ^ (LOW * 0x7F);
        let del = del.wrapping_sub(LOW) & !del & HIGH;
        let marks = below | del;
        if marks != 0 {
            return Some(base + (marks.trailing_zeros() / 8) as usize);
        }
        base += 8;
        rest = more;
    }
    rest.iter()
        .position(|&b| !is_key_byte(b))
        .map(|at| base + at)
}

/// Every byte is a key byte ([`is_key_byte`]); no early exit, so that it
/// compiles to vector compares (a key is checked on every request).
pub(super) fn all_key_bytes(bytes: &[u8]) -> bool {
    bytes.iter().fold(true, |ok, &b| ok & is_key_byte(b))
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_bytes()))
    }
}
