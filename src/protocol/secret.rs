//! Client secrets (`U <secret>`): their rule, and reading a secrets file.

use super::*;

/// The secret of a `U` line. Its `Debug` never shows the bytes, so a
/// request can be logged without leaking it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Box<[u8]>);

impl Secret {
    /// Any bytes (the parser does not judge a secret; see [`is_valid_secret`]).
    pub fn new(bytes: &[u8]) -> Secret {
        Secret(Box::from(bytes))
    }

    /// The secret's bytes, as sent on the wire.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The lines of a secrets file (`--auth-file`, server and CLI alike) that
/// should hold a secret, with their numbers (from 1): each line trimmed of
/// surrounding whitespace; blank lines and lines starting with `#` left out.
/// Whether each is a valid secret is [`is_valid_secret`].
pub fn secret_lines(contents: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    contents
        .split(|&b| b == b'\n')
        .enumerate()
        .map(|(index, line)| (index + 1, line.trim_ascii()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with(b"#"))
}

/// The rule for a configured client secret: [`MIN_SECRET`] to
/// [`MAX_SECRET`] bytes of printable ASCII (0x21 to 0x7E: no space).
pub fn is_valid_secret(bytes: &[u8]) -> bool {
    (MIN_SECRET..=MAX_SECRET).contains(&bytes.len())
        && bytes.iter().all(|&b| (0x21..=0x7E).contains(&b))
}
