//! Lines and their fields: framing a line out of a buffer (its length,
//! its ending, a blank line), and splitting it into fields.

use super::*;

/// Cuts the first line off `buf` and hands its body (without `\n` or `\r\n`,
/// never empty) to `parse`.
pub(super) fn parse_line<T>(
    buf: &[u8],
    parse: impl FnOnce(&[u8]) -> Result<T, LineError>,
) -> Parsed<T> {
    let window = &buf[..buf.len().min(MAX_LINE)];
    let Some(end) = find_byte(window, b'\n') else {
        return if buf.len() >= MAX_LINE {
            Parsed::Line {
                used: MAX_LINE,
                result: Err(LineError::Fatal(Reason::LineTooLong)),
            }
        } else {
            Parsed::Incomplete
        };
    };
    let line = &window[..end];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let result = if line.is_empty() {
        Err(LineError::Blank)
    } else {
        parse(line)
    };
    Parsed::Line {
        used: end + 1,
        result,
    }
}

/// The index of the first `needle` in `hay`, reading eight bytes at a
/// time (request lines are short, but a byte loop was a third of the I/O
/// loop's own work per request).
pub(super) fn find_byte(hay: &[u8], needle: u8) -> Option<usize> {
    const LOW: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let pattern = LOW.wrapping_mul(u64::from(needle));
    let mut chunks = hay.chunks_exact(8);
    let mut base = 0;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word) ^ pattern;
        // A byte of `x` is zero where `needle` is; the lowest set bit of
        // this marks the first such byte (any false marks lie above it).
        let found = x.wrapping_sub(LOW) & !x & HIGH;
        if found != 0 {
            return Some(base + (found.trailing_zeros() / 8) as usize);
        }
        base += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == needle)
        .map(|at| base + at)
}

/// Splits a line on single spaces.
pub(super) fn fields(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|&b| b == b' ')
}

/// Exactly `N` space-separated fields, or None.
pub(super) fn exact<const N: usize>(line: &[u8]) -> Option<[&[u8]; N]> {
    let mut parts = fields(line);
    let mut out: [&[u8]; N] = [DASH; N];
    for slot in &mut out {
        *slot = parts.next()?;
    }
    parts.next().is_none().then_some(out)
}

/// Appends a space and `field`.
pub(super) fn push_field(out: &mut Vec<u8>, field: &[u8]) {
    out.push(b' ');
    out.extend_from_slice(field);
}
