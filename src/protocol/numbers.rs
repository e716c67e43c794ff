//! The number formats of the wire: seconds with up to three decimals
//! (leases and waits), tokens and counts as decimal u64, read and
//! written without allocation; leases, waits, limits and tokens checked
//! against their rules.

use super::*;

/// Decimal seconds with at most 3 decimals -> milliseconds. Grammar:
/// `DIGITS ( '.' DIGIT{1,3} )?`. No sign, no exponent, no leading or trailing
/// '.', no spaces. Overflow -> None.
pub fn parse_seconds(field: &[u8]) -> Option<u64> {
    // Whole seconds of up to eight digits (`30`, `0`: nearly every lease
    // and wait) in one pass; anything else (a point, more digits, a bad
    // byte) the general way below.
    if field.len() <= 8 {
        let mut acc = 0u64;
        let mut whole = true;
        for &b in field {
            let digit = b.wrapping_sub(b'0');
            whole &= digit <= 9;
            acc = acc * 10 + u64::from(digit);
        }
        if whole && !field.is_empty() {
            return Some(acc * 1000);
        }
    }
    parse_seconds_general(field)
}

/// [`parse_seconds`] for any field.
pub(super) fn parse_seconds_general(field: &[u8]) -> Option<u64> {
    let (whole, millis) = split_seconds(field)?;
    parse_u64(whole)?.checked_mul(1000)?.checked_add(millis)
}

/// A seconds field's whole part (its digits, unchecked) and its fraction
/// as milliseconds (0 without one); None when the fraction breaks the
/// grammar.
fn split_seconds(field: &[u8]) -> Option<(&[u8], u64)> {
    match field.iter().position(|&b| b == b'.') {
        Some(dot) => Some((&field[..dot], parse_millis(&field[dot + 1..])?)),
        None => Some((field, 0)),
    }
}

/// [`parse_seconds`] for a request's lease or wait: the same grammar, but a
/// well-formed number too large for a u64 of milliseconds is `u64::MAX`
/// instead of None, so that it is refused as too long (above any maximum)
/// rather than as malformed, however many digits it has. None only for
/// text that breaks the grammar. Never overflows.
pub fn parse_seconds_saturating(field: &[u8]) -> Option<u64> {
    let (whole, millis) = split_seconds(field)?;
    let whole = parse_u64_saturating(whole)?;
    Some(whole.saturating_mul(1000).saturating_add(millis))
}

/// Decimal digits only (at least one, no sign); a value past `u64::MAX` is
/// `u64::MAX`.
pub(super) fn parse_u64_saturating(field: &[u8]) -> Option<u64> {
    if field.is_empty() {
        return None;
    }
    field.iter().try_fold(0u64, |acc, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        Some(acc.saturating_mul(10).saturating_add(u64::from(digit)))
    })
}

/// The 1 to 3 digits after the point, as milliseconds.
pub(super) fn parse_millis(digits: &[u8]) -> Option<u64> {
    let scale = match digits.len() {
        1 => 100,
        2 => 10,
        3 => 1,
        _ => return None,
    };
    Some(parse_u64(digits)? * scale)
}

/// Milliseconds -> shortest decimal seconds text: 30000 -> "30", 500 -> "0.5",
/// 2125 -> "2.125", 0 -> "0".
pub fn write_seconds(ms: u64, out: &mut Vec<u8>) {
    write_u64(ms / 1000, out);
    let millis = ms % 1000;
    if millis != 0 {
        let digits = [millis / 100, millis / 10 % 10, millis % 10].map(|d| b'0' + d as u8);
        let len = if digits[2] != b'0' {
            3
        } else if digits[1] != b'0' {
            2
        } else {
            1
        };
        out.push(b'.');
        out.extend_from_slice(&digits[..len]);
    }
}

/// Decimal digits only (at least one, no sign), fitting a u64.
pub(crate) fn parse_u64(field: &[u8]) -> Option<u64> {
    if field.is_empty() {
        return None;
    }
    // Up to 19 digits cannot overflow a u64: no checks on the way (tokens
    // have 19 digits, so this is the path of every `R` and `K`), and eight
    // digits are checked and added at a time.
    let (head, tail) = field.split_at(field.len().min(19));
    let mut acc = 0u64;
    let mut rest = head;
    while let Some((chunk, more)) = rest.split_first_chunk::<8>() {
        acc = acc * 100_000_000 + u64::from(eight_digits(u64::from_le_bytes(*chunk))?);
        rest = more;
    }
    for &b in rest {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        acc = acc * 10 + u64::from(digit);
    }
    tail.iter().try_fold(acc, |acc, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        acc.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// Eight ASCII bytes (the first in the lowest byte of `word`) as the number
/// they write, or None if one is not a decimal digit. No branch per byte.
pub(super) fn eight_digits(word: u64) -> Option<u32> {
    const ZEROS: u64 = u64::from_ne_bytes([b'0'; 8]);
    const HIGH_NIBBLES: u64 = u64::from_ne_bytes([0xF0; 8]);
    const SIXES: u64 = u64::from_ne_bytes([6; 8]);
    // A digit byte is 0x30-0x39: its high nibble is 3, and stays 3 with 6
    // added (no byte of such a word carries into the next).
    if word & HIGH_NIBBLES != ZEROS || word.wrapping_add(SIXES) & HIGH_NIBBLES != ZEROS {
        return None;
    }
    let digits = word - ZEROS;
    // Adjacent digits into pairs, pairs into fours, fours into eight.
    let pairs = (digits * 10 + (digits >> 8)) & 0x00FF_00FF_00FF_00FF;
    let fours = (pairs * 100 + (pairs >> 16)) & 0x0000_FFFF_0000_FFFF;
    Some(((fours * 10_000 + (fours >> 32)) & 0xFFFF_FFFF) as u32)
}

/// Writes `n` in decimal without allocating beyond growing `out`.
pub(crate) fn write_u64(n: u64, out: &mut Vec<u8>) {
    // A 19-digit token is written for every grant: its digits are made
    // eight at a time, without a loop or a table, as three words of eight
    // digits (the first has at most four), and the leading zeros skipped.
    const ZEROS: u64 = u64::from_ne_bytes([b'0'; 8]);
    let words = [
        eight_ascii((n / 10_000_000_000_000_000) as u32),
        eight_ascii((n / 100_000_000 % 100_000_000) as u32),
        eight_ascii((n % 100_000_000) as u32),
    ];
    let mut text = [0u8; 24];
    for (at, word) in words.iter().enumerate() {
        text[at * 8..at * 8 + 8].copy_from_slice(&word.to_le_bytes());
    }
    // The first word with a digit other than 0 (the last digit is always
    // written), and in it the first such digit (the lowest byte is first).
    let start = match words.iter().position(|&word| word != ZEROS) {
        Some(at) => at * 8 + ((words[at] ^ ZEROS).trailing_zeros() / 8) as usize,
        None => 23,
    };
    out.extend_from_slice(&text[start..]);
}

/// `n` (below 10^8) as eight ASCII digits, leading zeros included, the
/// first in the lowest byte.
pub(super) fn eight_ascii(n: u32) -> u64 {
    debug_assert!(n < 100_000_000);
    // Two fours, each split into two pairs, each pair into two digits, in
    // lanes of one word; x / 100 is (x * 10486) >> 20 and x / 10 is
    // (x * 103) >> 10 for the values that occur.
    let fours = u64::from(n / 10_000) | u64::from(n % 10_000) << 32;
    let hundreds = ((fours * 10_486) >> 20) & 0x0000_007F_0000_007F;
    let pairs = hundreds | (fours - hundreds * 100) << 16;
    let tens = ((pairs * 103) >> 10) & 0x000F_000F_000F_000F;
    let digits = tens | (pairs - tens * 10) << 8;
    digits | u64::from_ne_bytes([b'0'; 8])
}

/// A lease: malformed or 0 is `BadLease`, well formed but above `max_ms`
/// (however many digits) is `LeaseTooLong`.
pub(super) fn parse_lease(field: &[u8], max_ms: u64) -> Result<u64, Reason> {
    match parse_seconds(field) {
        Some(0) => Err(Reason::BadLease),
        Some(ms) if ms <= max_ms => Ok(ms),
        Some(_) => Err(Reason::LeaseTooLong),
        None if past_u64(field) => Err(Reason::LeaseTooLong),
        None => Err(Reason::BadLease),
    }
}

/// A wait: malformed is `BadWait`, well formed but above `max_ms` (however
/// many digits) is `WaitTooLong`.
pub(super) fn parse_wait(field: &[u8], max_ms: u64) -> Result<u64, Reason> {
    match parse_seconds(field) {
        Some(ms) if ms <= max_ms => Ok(ms),
        Some(_) => Err(Reason::WaitTooLong),
        None if past_u64(field) => Err(Reason::WaitTooLong),
        None => Err(Reason::BadWait),
    }
}

/// A field [`parse_seconds`] refused that is nevertheless a well-formed
/// number of seconds, only too large for a u64 of milliseconds: above any
/// maximum, even `u64::MAX` ms. Asked only on that refusal's path.
pub(super) fn past_u64(field: &[u8]) -> bool {
    parse_seconds_saturating(field).is_some()
}

/// An acquire's limit: decimal digits (leading zeros accepted), 1 to
/// [`MAX_LIMIT`], else `BadLimit`.
pub(super) fn parse_limit(field: &[u8]) -> Result<u32, Reason> {
    match parse_u64(field) {
        Some(n) if (1..=u64::from(MAX_LIMIT)).contains(&n) => Ok(n as u32),
        _ => Err(Reason::BadLimit),
    }
}

pub(super) fn parse_token(field: &[u8]) -> Result<u64, Reason> {
    match parse_u64(field) {
        None | Some(0) => Err(Reason::BadToken),
        Some(token) => Ok(token),
    }
}

/// Appends a space and `n` in decimal.
pub(super) fn push_u64(out: &mut Vec<u8>, n: u64) {
    out.push(b' ');
    write_u64(n, out);
}

/// Appends a space and `ms` as decimal seconds.
pub(super) fn push_seconds(out: &mut Vec<u8>, ms: u64) {
    out.push(b' ');
    write_seconds(ms, out);
}
