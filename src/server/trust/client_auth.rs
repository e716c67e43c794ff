//! Client authentication: the secrets of `--auth-file` and the check of a
//! `U <secret>` line against them.
//!
//! Owns: reading the file's text into a [`SecretSet`] (one secret per line;
//! blank lines and lines starting with `#` ignored; each secret
//! `protocol::is_valid_secret`), and [`ClientAuth`], the node's current set
//! behind a `parking_lot` lock: the I/O loops read it for each `U` line, the
//! main thread replaces it on SIGHUP (`Server::reload`). A set keeps only
//! HMAC-SHA256 tags of its secrets under a key drawn at random when the set
//! is built, and a check compares the tag of the offered secret with every
//! stored tag in constant time, so neither the time taken nor the memory
//! says anything about the secrets.
//!
//! Never does: log, display or keep a secret in clear (errors name the flag,
//! the file and the line number, never the line), or touch the network.

use std::path::{Path, PathBuf};

use parking_lot::RwLock;
use ring::hmac;
use ring::rand::SystemRandom;

use crate::protocol::{MAX_SECRET, MIN_SECRET, is_valid_secret, secret_lines};

/// The longest `--auth-file` read, in bytes.
pub const MAX_AUTH_FILE: usize = 64 * 1024;
/// Secrets one file may hold, at most (each `U` is checked against all).
pub const MAX_SECRETS: usize = 256;

/// The secrets a node accepts, as tags under a random key.
pub struct SecretSet {
    key: hmac::Key,
    tags: Vec<hmac::Tag>,
}

impl std::fmt::Debug for SecretSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretSet({} secrets)", self.tags.len())
    }
}

impl SecretSet {
    /// The secrets in a file's text. Errors say what is wrong and where
    /// (line numbers from 1), never what the line holds.
    pub fn from_file_contents(contents: &[u8]) -> Result<SecretSet, String> {
        let rng = SystemRandom::new();
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng)
            .map_err(|_| "cannot draw a random key".to_string())?;
        let mut tags = Vec::new();
        for (number, line) in secret_lines(contents) {
            if !is_valid_secret(line) {
                return Err(format!(
                    "line {number}: a secret must be {MIN_SECRET} to {MAX_SECRET} bytes of \
                     printable ASCII without spaces (one per line; blank and '#' lines \
                     are ignored)"
                ));
            }
            if tags.len() == MAX_SECRETS {
                return Err(format!("more than {MAX_SECRETS} secrets"));
            }
            tags.push(hmac::sign(&key, line));
        }
        if tags.is_empty() {
            return Err(format!(
                "holds no secret (one per line, {MIN_SECRET} to {MAX_SECRET} bytes of \
                 printable ASCII without spaces)"
            ));
        }
        Ok(SecretSet { key, tags })
    }

    /// Read and check `--auth-file PATH`; errors name the flag and the path.
    pub fn read_file(path: &Path) -> Result<SecretSet, String> {
        let shown = path.display();
        let file = std::fs::File::open(path)
            .map_err(|e| format!("--auth-file {shown}: cannot open it: {e}"))?;
        let mut contents = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, MAX_AUTH_FILE as u64 + 1),
            &mut contents,
        )
        .map_err(|e| format!("--auth-file {shown}: cannot read it: {e}"))?;
        if contents.len() > MAX_AUTH_FILE {
            return Err(format!("--auth-file {shown}: over {MAX_AUTH_FILE} bytes"));
        }
        SecretSet::from_file_contents(&contents).map_err(|e| format!("--auth-file {shown}: {e}"))
    }

    /// How many secrets the set holds.
    pub fn len(&self) -> usize {
        self.tags.len()
    }

    /// Never true: a set holds at least one secret.
    pub fn is_empty(&self) -> bool {
        self.tags.is_empty()
    }

    /// Whether `offered` is one of the secrets. Every stored tag is compared
    /// in full, whatever matches.
    pub fn accepts(&self, offered: &[u8]) -> bool {
        let tag = hmac::sign(&self.key, offered);
        let mut matched = false;
        for stored in &self.tags {
            matched |= equal_in_constant_time(tag.as_ref(), stored.as_ref());
        }
        matched
    }
}

/// Byte-wise equality whose time depends on the lengths only.
fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// A node's client authentication: its `--auth-file` and the set read from
/// it last.
#[derive(Debug)]
pub struct ClientAuth {
    path: PathBuf,
    secrets: RwLock<SecretSet>,
}

impl ClientAuth {
    /// Authentication with `secrets`, read from `path` (reloaded from there).
    pub fn new(path: PathBuf, secrets: SecretSet) -> ClientAuth {
        ClientAuth {
            path,
            secrets: RwLock::new(secrets),
        }
    }

    /// Whether `offered` is one of the current secrets.
    pub fn accepts(&self, offered: &[u8]) -> bool {
        self.secrets.read().accepts(offered)
    }

    /// Read the file again: on success the new set replaces the old one
    /// (connections already authenticated stay so) and the number of
    /// secrets is returned; on error the old set stays and the error says
    /// why.
    pub fn reload(&self) -> Result<usize, String> {
        let fresh = SecretSet::read_file(&self.path)?;
        let count = fresh.len();
        *self.secrets.write() = fresh;
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "alpha-secret-0123456789";
    const B: &str = "bravo-secret-0123456789";

    fn set(text: &str) -> Result<SecretSet, String> {
        SecretSet::from_file_contents(text.as_bytes())
    }

    #[test]
    fn every_secret_of_the_file_is_accepted_and_nothing_else() {
        let secrets = set(&format!("{A}\n{B}\n")).expect("valid");
        assert_eq!(secrets.len(), 2);
        assert!(secrets.accepts(A.as_bytes()));
        assert!(secrets.accepts(B.as_bytes()));
        for wrong in [
            "",
            "alpha",
            "alpha-secret-012345678",
            "alpha-secret-01234567890",
        ] {
            assert!(!secrets.accepts(wrong.as_bytes()), "{wrong:?}");
        }
    }

    #[test]
    fn blank_and_comment_lines_are_ignored_and_whitespace_trimmed() {
        let text = format!("# rotated 2026-12\n\n   \n  {A}  \r\n\t# old: none\n{B}");
        let secrets = set(&text).expect("valid");
        assert_eq!(secrets.len(), 2);
        assert!(secrets.accepts(A.as_bytes()));
        assert!(secrets.accepts(B.as_bytes()));
    }

    #[test]
    fn a_bad_line_is_named_by_number_and_never_shown() {
        let cases = [
            ("short-secret", 2),
            ("has a space in it 0123456789", 2),
            (&"x".repeat(129), 2),
            ("café-secret-0123456789", 2),
        ];
        for (bad, line) in cases {
            let err = set(&format!("{A}\n{bad}\n")).expect_err("refused");
            assert!(err.starts_with(&format!("line {line}:")), "{err}");
            assert!(err.contains("16 to 128 bytes"), "{err}");
            assert!(!err.contains(bad), "the secret is shown: {err}");
        }
    }

    #[test]
    fn a_file_without_secrets_is_refused() {
        for text in ["", "\n\n", "# nothing here\n"] {
            let err = set(text).expect_err("empty");
            assert!(err.contains("holds no secret"), "{err}");
        }
    }

    #[test]
    fn too_many_secrets_are_refused() {
        let text: String = (0..=MAX_SECRETS)
            .map(|i| format!("secret-number-{i:06}\n"))
            .collect();
        let err = set(&text).expect_err("too many");
        assert!(err.contains("more than 256"), "{err}");
    }

    #[test]
    fn debug_output_counts_secrets_and_shows_none() {
        let auth = ClientAuth::new(PathBuf::from("/x"), set(A).expect("valid"));
        let shown = format!("{auth:?}");
        assert!(shown.contains("1 secrets"), "{shown}");
        assert!(!shown.contains(A), "{shown}");
    }

    #[test]
    fn reload_replaces_the_set_and_a_bad_file_keeps_the_old_one() {
        let dir = std::env::temp_dir().join(format!("baton-auth-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("secrets");
        std::fs::write(&path, format!("{A}\n")).expect("write");
        let auth = ClientAuth::new(path.clone(), SecretSet::read_file(&path).expect("read"));
        std::fs::write(&path, format!("{B}\n")).expect("write");
        assert_eq!(auth.reload(), Ok(1));
        assert!(auth.accepts(B.as_bytes()) && !auth.accepts(A.as_bytes()));
        std::fs::write(&path, "too-short\n").expect("write");
        let err = auth.reload().expect_err("bad file");
        assert!(err.starts_with("--auth-file "), "{err}");
        assert!(!err.contains("too-short"), "{err}");
        assert!(auth.accepts(B.as_bytes()), "the old secrets stay");
        std::fs::remove_file(&path).expect("remove");
        assert!(auth.reload().expect_err("gone").contains("cannot open"));
        assert!(auth.accepts(B.as_bytes()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn constant_time_equality_is_equality() {
        assert!(equal_in_constant_time(b"abc", b"abc"));
        assert!(!equal_in_constant_time(b"abc", b"abd"));
        assert!(!equal_in_constant_time(b"abc", b"ab"));
        assert!(equal_in_constant_time(b"", b""));
    }
}
