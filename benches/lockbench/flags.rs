//! Flags the rows share: a comma-separated list of a set length, and a
//! cluster named by its addresses and, in the same order, their PIDs
//! (`--join` with `--join-pids`, `--failover` with `--failover-pids`, the
//! etcd rows' clusters).

use std::net::SocketAddr;

/// A cluster's node addresses and their PIDs, in the same order.
pub type Nodes = (Vec<SocketAddr>, Vec<u32>);
/// A 2-node cluster's: the active first, then its standby.
pub type Pair = ([SocketAddr; 2], [u32; 2]);

/// `text`, given to `flag`: exactly `want` comma-separated items.
pub fn list<T: std::str::FromStr>(flag: &str, text: &str, want: usize) -> Result<Vec<T>, String> {
    let items = text
        .split(',')
        .map(|s| s.trim().parse::<T>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| format!("{flag}: cannot read {text:?}"))?;
    if items.len() != want {
        return Err(format!("{flag}: {want} items wanted"));
    }
    Ok(items)
}

/// A cluster of `n` nodes given as `flag` (their addresses) and `pid_flag`
/// (their PIDs, in the same order), both or neither (then None).
pub fn cluster(
    args: &mut pico_args::Arguments,
    flag: &'static str,
    pid_flag: &'static str,
    n: usize,
) -> Result<Option<Nodes>, String> {
    let err = |e: pico_args::Error| e.to_string();
    let addrs: Option<String> = args.opt_value_from_str(flag).map_err(err)?;
    let pids: Option<String> = args.opt_value_from_str(pid_flag).map_err(err)?;
    match (addrs, pids) {
        (Some(a), Some(p)) => Ok(Some((list(flag, &a, n)?, list(pid_flag, &p, n)?))),
        (None, None) => Ok(None),
        _ => Err(format!("{flag} and {pid_flag} go together")),
    }
}

/// [`cluster`] of 2 nodes (the active first, then its standby).
pub fn pair(
    args: &mut pico_args::Arguments,
    flag: &'static str,
    pid_flag: &'static str,
) -> Result<Option<Pair>, String> {
    Ok(cluster(args, flag, pid_flag, 2)?.map(|(a, p)| ([a[0], a[1]], [p[0], p[1]])))
}
