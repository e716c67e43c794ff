//! What a socket must prove before the node acts on it: TLS on every
//! connection (`tls`), the cluster key on peer links (`peer_auth`) and the
//! shared secrets of clients (`client_auth`). Sans-I/O layers: the I/O loops
//! and the replication thread move the bytes, these decide.
//!
//! Rule: no file here imports a thread file or the lock table.

pub mod client_auth;
pub mod peer_auth;
pub mod tls;
