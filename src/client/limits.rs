//! Sizes the client's connection layers share, named once so that neither
//! layer imports the other for them.
//!
//! Never does: anything; constants only.

/// Bytes the writer puts into one socket write, at most (more if one line
/// alone is longer, which it never is). The TLS layer keeps at most twice
/// this much room for its output between writes.
pub const WRITE_BATCH: usize = 64 * 1024;
