//! The node's configuration: every `batond` flag, its default, and its check.
//!
//! Owns: turning command-line arguments into a [`Config`], with a clear error
//! for a bad flag (one given twice included); reading and checking the
//! cluster key and client secrets files; and saying which flags a node
//! without `--peers` does not use ([`Config::unused_without_peers`]), for
//! the warnings `batond` gives. Runs once on the main thread before
//! anything starts (the secrets file again on SIGHUP).
//!
//! Never does: I/O beyond reading the arguments it is given and the files
//! they name.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use crate::server::trust::client_auth::{ClientAuth, SecretSet};
use crate::server::trust::peer_auth::{ClusterKey, MAX_KEY_FILE};

/// Default client port.
pub const DEFAULT_PORT: u16 = 7373;
/// Default maximum lease and wait, in seconds.
pub const DEFAULT_MAX_LEASE_SECS: u64 = 86_400;
/// Default maximum number of client connections.
pub const DEFAULT_MAX_CONNS: usize = 10_000;
/// Default maximum number of requests one connection may have waiting.
pub const DEFAULT_MAX_WAITING: u32 = 4096;
/// `--max-watches` by default: keys one connection may watch at once.
pub const DEFAULT_MAX_WATCHES: usize = 1024;
/// The most `--max-watches` allows.
pub const MAX_WATCHES: usize = 1 << 20;
/// Default maximum number of keys held at once.
pub const DEFAULT_MAX_KEYS: usize = 10_000_000;
/// Default failure-detection time of a cluster, in milliseconds.
pub const DEFAULT_DETECT_MS: u64 = 1000;
/// Default longest busy-polling window of an idle thread, in microseconds.
pub const DEFAULT_BUSY_POLL_US: u64 = 500;
/// The largest `--busy-poll-us` accepted (10 ms).
const MAX_BUSY_POLL_US: u64 = 10_000;
/// The shortest `--detect` accepted, in milliseconds.
const MIN_DETECT_MS: u64 = 20;
/// The longest `--detect` accepted, in seconds (an hour).
const MAX_DETECT_SECS: u64 = 3600;
/// The longest `--max-lease` and `--promotion-grace` accepted, in seconds
/// (a year): far past any real use, and far from overflowing a deadline.
const MAX_FLAG_SECS: u64 = 365 * 86_400;

// What each flag accepts, as its error message says it.
const EXPECT_BIND: &str = "an IP address to listen on, like 0.0.0.0, 127.0.0.1 or ::";
const EXPECT_PORT: &str = "a port number 0-65535";
const EXPECT_PEERS: &str = "a comma-separated list of host:port";
const EXPECT_ADVERTISE: &str = "this node's host:port entry of --peers";
const EXPECT_THREADS: &str = "a number of I/O loops 1-64";
const EXPECT_MAX_LEASE: &str =
    "seconds above 0 and at most 31536000, with up to 3 decimals (like 86400 or 0.5)";
const EXPECT_MAX_CONNS: &str = "a whole number of connections, 1 or more";
const EXPECT_MAX_WAITING: &str = "a whole number of requests 1-4294967295";
const EXPECT_MAX_WATCHES: &str = "a whole number of keys 1-1048576";
const EXPECT_MAX_KEYS: &str = "a whole number of keys, 1 or more";
const EXPECT_DETECT: &str = "seconds 0.02-3600, with up to 3 decimals (like 1 or 0.25)";
const EXPECT_PROMOTION_GRACE: &str =
    "seconds 0-31536000, with up to 3 decimals (like 30 or 0.5; 0 is off)";
const EXPECT_BUSY_POLL_US: &str = "microseconds 0-10000";
const EXPECT_METRICS: &str = "an address and port to serve metrics on, like 127.0.0.1:9100";

/// Every flag `batond` reads but `--help` and `--version` (which end the
/// parse at once). Each may be given once: a second one is an error that
/// names it.
pub const FLAGS: [&str; 22] = [
    "--bind",
    "--port",
    "--peers",
    "--advertise",
    "--threads",
    "--max-lease",
    "--max-conns",
    "--max-waiting",
    "--max-keys",
    "--max-watches",
    "--detect",
    "--promotion-grace",
    "--busy-poll-us",
    "--cluster-key-file",
    "--insecure-peers",
    "--auth-file",
    "--tls-cert",
    "--tls-key",
    "--tls-client-ca",
    "--tls-ca",
    "--metrics",
    "--echo",
];

/// The help text of `batond --help`.
pub const HELP: &str = "\
batond: the baton lock server

USAGE:
  batond [--bind ADDR] [--port PORT] [--peers H:P,H:P,...] [--advertise H:P]
         [--threads N] [--max-lease SECS] [--max-conns N]
         [--max-waiting N] [--max-keys N] [--max-watches N] [--detect SECS]
         [--promotion-grace SECS] [--busy-poll-us N]
         [--cluster-key-file PATH | --insecure-peers] [--auth-file PATH]
         [--tls-cert PATH --tls-key PATH [--tls-client-ca PATH] [--tls-ca PATH]]
         [--metrics ADDR:PORT]

FLAGS:
  --bind ADDR        address to listen on (default 0.0.0.0, in protected
                     mode: only loopback clients are served unless --bind,
                     --auth-file, --tls-client-ca, or --peers with
                     --cluster-key-file is given)
  --port PORT        client port (default 7373)
  --peers LIST       ordered client addresses of every node of the cluster,
                     the same on every node; first is highest priority
                     (default: none, a single node)
  --advertise H:P    this node's entry in --peers (default: the one entry
                     with this node's port)
  --cluster-key-file PATH
                     the secret every node of the cluster shares (at least
                     32 bytes; surrounding whitespace ignored): a peer link
                     is acted on only once it has proved it knows it.
                     Required with --peers
  --insecure-peers   run --peers without a cluster key: anyone who can reach
                     the port can pose as a peer (warned at start and every
                     minute)
  --auth-file PATH   client authentication: one secret per line (16 to 128
                     bytes of printable ASCII without spaces; blank and '#'
                     lines ignored). Every client connection must then
                     begin with `U <secret>`. Read again on SIGHUP
  --tls-cert PATH    this node's certificate chain (PEM): every connection
                     on the port, client or peer, must then speak TLS (1.3,
                     or 1.2); plain text is refused. Reloaded on SIGHUP
  --tls-key PATH     the private key of --tls-cert (PEM)
  --tls-client-ca PATH
                     clients must present a certificate signed by a CA in
                     this PEM file (mutual TLS; on a cluster node, one
                     signed by a --tls-ca CA is accepted too)
  --tls-ca PATH      the CAs (PEM) peer certificates are checked against,
                     on links this node dials and links dialed to it
                     (default: the system's); a peer's certificate must
                     name the host of its --peers entry (a DNS name, or an
                     IP address SAN)
  --threads N        I/O loops (default: one per core but one, which is left
                     to the lock owner; at least 1)
  --max-lease SECS   largest lease and wait a client may ask for
                     (default 86400)
  --max-conns N      client connections at once (default 10000)
  --max-waiting N    requests one connection may have waiting in line
                     (default 4096)
  --max-keys N       keys held at once (default 10000000)
  --max-watches N    keys one connection may watch at once (W; default
                     1024)
  --detect SECS      cluster failure detection: a peer silent this long
                     after its next heartbeat was due (plus one heartbeat
                     period: 1.25 x SECS of silence in all) is dead
                     (default 1; heartbeats go 8 times as often)
  --promotion-grace SECS
                     after a failover, the new active makes acquires of keys
                     it does not know as held wait this long, so grants the
                     old active made but never replicated run out first
                     (default 0: off; set it to the longest lease you use)
  --busy-poll-us N   a thread (I/O loop, lock owner) that runs out of work
                     polls for more for up to N microseconds before it
                     sleeps, when work has been coming at shorter
                     intervals than that: lower latency for some CPU
                     (default 500; 0: always sleep at once, least CPU)
  --metrics ADDR:PORT
                     serve GET /metrics (Prometheus text format) over HTTP
                     on this address (default: none, no metrics port)
  --echo             benchmark floor: answer every line with itself, through
                     the same I/O loops, without the lock table
  -h, --help         print this help
  -V, --version      print the version

Logs go to stderr; RUST_LOG sets the level (error, warn, info, debug).
Ctrl+C or SIGTERM stops the node gracefully; SIGHUP reads --auth-file and
the TLS files again (a bad new file keeps the old ones, and says why in the
log).
";

/// Everything a node needs to know to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub bind: IpAddr,
    /// `--bind` was given: the operator chose the address, so clients
    /// from any address that reaches it are served (no protected mode:
    /// see [`Config::protected_mode`]).
    pub bind_given: bool,
    pub port: u16,
    pub peers: Vec<String>,
    pub advertise: Option<String>,
    pub threads: usize,
    pub max_lease_ms: u64,
    pub max_conns: usize,
    pub max_waiting: u32,
    pub max_keys: usize,
    /// `--max-watches`: keys one connection may watch at once.
    pub max_watches: usize,
    pub detect_ms: u64,
    /// Benchmark floor: echo every line instead of serving locks.
    pub echo: bool,
    /// After a failover, grants of keys not known as held wait this long.
    pub promotion_grace_ms: u64,
    /// The longest an idle I/O loop or lock owner busy-polls before it sleeps.
    pub busy_poll_us: u64,
    /// `--cluster-key-file`: where the cluster key is read from at start.
    pub cluster_key_file: Option<PathBuf>,
    /// `--insecure-peers`: peers without a cluster key.
    pub insecure_peers: bool,
    /// `--auth-file`: client secrets, read at start and on SIGHUP.
    pub auth_file: Option<PathBuf>,
    /// `--metrics`: where to serve `GET /metrics` (None: nowhere).
    pub metrics: Option<SocketAddr>,
    /// `--tls-cert`, `--tls-key`: TLS on every connection.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// `--tls-client-ca`: clients must present a certificate it signed.
    pub tls_client_ca: Option<PathBuf>,
    /// `--tls-ca`: what peer certificates are checked against.
    pub tls_ca: Option<PathBuf>,
    /// The flags given that only a cluster uses and that leave no other
    /// trace in the config (`--detect`, `--promotion-grace`: their values
    /// may be the defaults), for [`Config::unused_without_peers`].
    pub cluster_flags_given: Vec<&'static str>,
}

/// The most I/O loops `--threads` allows.
pub const MAX_THREADS: usize = 64;

/// `--threads` by default on a machine with `cores` cores: one I/O loop per
/// core but one, at least one. The lock owner is a thread of its own that
/// busy-polls under load (busy_poll.rs); with as many loops as cores, the
/// loops and the owner take turns on every core, and each turn is a context
/// switch on a request's path. With one core left to it, a request crosses
/// threads that are each already running. Never more than `--threads`
/// allows.
pub fn default_threads(cores: usize) -> usize {
    cores.saturating_sub(1).clamp(1, MAX_THREADS)
}

impl Default for Config {
    fn default() -> Self {
        Config {
            bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            bind_given: false,
            port: DEFAULT_PORT,
            peers: Vec::new(),
            advertise: None,
            threads: default_threads(std::thread::available_parallelism().map_or(1, |n| n.get())),
            max_lease_ms: DEFAULT_MAX_LEASE_SECS * 1000,
            max_conns: DEFAULT_MAX_CONNS,
            max_waiting: DEFAULT_MAX_WAITING,
            max_keys: DEFAULT_MAX_KEYS,
            max_watches: DEFAULT_MAX_WATCHES,
            detect_ms: DEFAULT_DETECT_MS,
            echo: false,
            promotion_grace_ms: 0,
            busy_poll_us: DEFAULT_BUSY_POLL_US,
            cluster_key_file: None,
            insecure_peers: false,
            auth_file: None,
            metrics: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            tls_ca: None,
            cluster_flags_given: Vec::new(),
        }
    }
}

/// What the command line asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Run(Box<Config>),
    Help,
    /// `-V`, `--version`: print `batond <version>`.
    Version,
}

impl Config {
    /// Parse `batond`'s arguments (without the program name). Flags are
    /// read in a fixed order (the first bad one is the one reported).
    pub fn from_args(args: Vec<std::ffi::OsString>) -> Result<Command, String> {
        let mut args = pico_args::Arguments::from_vec(args);
        if args.contains(["-h", "--help"]) {
            return Ok(Command::Help);
        }
        if args.contains(["-V", "--version"]) {
            return Ok(Command::Version);
        }
        let mut config = Config {
            echo: args.contains("--echo"),
            insecure_peers: args.contains("--insecure-peers"),
            ..Config::default()
        };
        config.read_placement_flags(&mut args)?;
        config.read_limit_flags(&mut args)?;
        config.read_timing_flags(&mut args)?;
        config.read_file_flags(&mut args)?;
        config.metrics = flag(&mut args, "--metrics", EXPECT_METRICS, |v| v.parse().ok())?;
        no_word_left(args.finish())?;
        config.check()?;
        Ok(Command::Run(Box::new(config)))
    }

    /// Where the node listens and who its peers are: `--bind`, `--port`,
    /// `--peers`, `--advertise`, and its `--threads`.
    fn read_placement_flags(&mut self, a: &mut pico_args::Arguments) -> Result<(), String> {
        if let Some(bind) = flag(a, "--bind", EXPECT_BIND, |v| v.parse().ok())? {
            self.bind = bind;
            self.bind_given = true;
        }
        if let Some(port) = flag(a, "--port", EXPECT_PORT, |v| v.parse().ok())? {
            self.port = port;
        }
        if let Some(peers) = flag(a, "--peers", EXPECT_PEERS, |v| Some(v.to_string()))? {
            self.peers = parse_peers(&peers)?;
        }
        self.advertise = flag(a, "--advertise", EXPECT_ADVERTISE, |v| Some(v.to_string()))?;
        if let Some(threads) = flag(a, "--threads", EXPECT_THREADS, |v| {
            v.parse().ok().filter(|n| (1..=MAX_THREADS).contains(n))
        })? {
            self.threads = threads;
        }
        Ok(())
    }

    /// The limits: `--max-lease`, `--max-conns`, `--max-waiting`,
    /// `--max-keys`, `--max-watches`.
    fn read_limit_flags(&mut self, a: &mut pico_args::Arguments) -> Result<(), String> {
        if let Some(ms) = flag(a, "--max-lease", EXPECT_MAX_LEASE, |v| {
            seconds(v).filter(|ms| (1..=MAX_FLAG_SECS * 1000).contains(ms))
        })? {
            self.max_lease_ms = ms;
        }
        if let Some(n) = flag(a, "--max-conns", EXPECT_MAX_CONNS, |v| {
            v.parse().ok().filter(|&n| n >= 1)
        })? {
            self.max_conns = n;
        }
        if let Some(n) = flag(a, "--max-waiting", EXPECT_MAX_WAITING, |v| {
            v.parse().ok().filter(|&n| n >= 1)
        })? {
            self.max_waiting = n;
        }
        if let Some(n) = flag(a, "--max-keys", EXPECT_MAX_KEYS, |v| {
            v.parse().ok().filter(|&n| n >= 1)
        })? {
            self.max_keys = n;
        }
        if let Some(n) = flag(a, "--max-watches", EXPECT_MAX_WATCHES, |v| {
            v.parse().ok().filter(|&n| (1..=MAX_WATCHES).contains(&n))
        })? {
            self.max_watches = n;
        }
        Ok(())
    }

    /// The times: `--detect`, `--promotion-grace` (both noted as cluster
    /// flags given) and `--busy-poll-us`.
    fn read_timing_flags(&mut self, a: &mut pico_args::Arguments) -> Result<(), String> {
        if let Some(ms) = flag(a, "--detect", EXPECT_DETECT, |v| {
            seconds(v).filter(|ms| (MIN_DETECT_MS..=MAX_DETECT_SECS * 1000).contains(ms))
        })? {
            self.detect_ms = ms;
            self.cluster_flags_given.push("--detect");
        }
        if let Some(ms) = flag(a, "--promotion-grace", EXPECT_PROMOTION_GRACE, |v| {
            seconds(v).filter(|&ms| ms <= MAX_FLAG_SECS * 1000)
        })? {
            self.promotion_grace_ms = ms;
            self.cluster_flags_given.push("--promotion-grace");
        }
        if let Some(us) = flag(a, "--busy-poll-us", EXPECT_BUSY_POLL_US, |v| {
            v.parse().ok().filter(|&us| us <= MAX_BUSY_POLL_US)
        })? {
            self.busy_poll_us = us;
        }
        Ok(())
    }

    /// The files, as paths (read later, by [`Config::read_cluster_key`]
    /// and the rest): `--cluster-key-file`, `--tls-cert`, `--tls-key`,
    /// `--tls-client-ca`, `--tls-ca`, `--auth-file`.
    fn read_file_flags(&mut self, args: &mut pico_args::Arguments) -> Result<(), String> {
        let mut path_flag = |name: &'static str| {
            args.opt_value_from_os_str(name, |s| {
                Ok::<_, std::convert::Infallible>(PathBuf::from(s))
            })
            .map_err(flag_error)
        };
        self.cluster_key_file = path_flag("--cluster-key-file")?;
        self.tls_cert = path_flag("--tls-cert")?;
        self.tls_key = path_flag("--tls-key")?;
        self.tls_client_ca = path_flag("--tls-client-ca")?;
        self.tls_ca = path_flag("--tls-ca")?;
        self.auth_file = path_flag("--auth-file")?;
        Ok(())
    }

    fn check(&self) -> Result<(), String> {
        if self.threads == 0 || self.threads > MAX_THREADS {
            return Err("--threads must be 1 to 64".into());
        }
        if self.max_lease_ms == 0 {
            return Err("--max-lease must be above 0".into());
        }
        if self.max_conns == 0 || self.max_waiting == 0 || self.max_keys == 0 {
            return Err("--max-conns, --max-waiting and --max-keys must be above 0".into());
        }
        if self.busy_poll_us > MAX_BUSY_POLL_US {
            return Err(format!("--busy-poll-us must be 0 to {MAX_BUSY_POLL_US}"));
        }
        if self.advertise.is_some() && self.peers.is_empty() {
            return Err("--advertise names an entry of --peers, which is not given".into());
        }
        if !self.peers.is_empty() && self.cluster_key_file.is_none() && !self.insecure_peers {
            return Err(
                "--peers needs --cluster-key-file PATH (a secret of at least 32 bytes \
                        that every node shares), or --insecure-peers to run without peer \
                        authentication"
                    .into(),
            );
        }
        if self.cluster_key_file.is_some() && self.insecure_peers {
            return Err("--cluster-key-file and --insecure-peers exclude each other".into());
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err("--tls-cert and --tls-key go together".into());
        }
        if self.tls_cert.is_none() && (self.tls_client_ca.is_some() || self.tls_ca.is_some()) {
            return Err("--tls-client-ca and --tls-ca need --tls-cert and --tls-key".into());
        }
        if let Some(metrics) = self.metrics
            && self.port != 0
            && metrics.port() == self.port
            && (metrics.ip() == self.bind
                || metrics.ip().is_unspecified()
                || self.bind.is_unspecified())
        {
            return Err(format!(
                "--metrics: expected an address and port other than the client's, got '{metrics}', \
                 where --bind {} --port {} listens",
                self.bind, self.port
            ));
        }
        if self.peers.len() > crate::server::core::tokens::MAX_NODES {
            return Err(format!(
                "--peers lists {} nodes; at most {} are supported",
                self.peers.len(),
                crate::server::core::tokens::MAX_NODES
            ));
        }
        self.node_index().map(|_| ())
    }

    /// Protected mode: the node listens on the default address (0.0.0.0)
    /// but serves only clients that connect from loopback (127.0.0.0/8,
    /// ::1); any other gets `E - - protected-mode` and is closed at its
    /// first line. On unless the operator said the node is meant to be
    /// reached: `--bind` given (any address, 0.0.0.0 included), clients
    /// authenticated (`--auth-file`, or `--tls-client-ca`), or `--peers`
    /// with a `--cluster-key-file` (a cluster is run to be reached from
    /// other machines). Peer links are never refused by it: a `P HELLO`
    /// goes to the cluster-key handshake as before.
    pub fn protected_mode(&self) -> bool {
        let cluster = !self.peers.is_empty() && self.cluster_key_file.is_some();
        !(self.bind_given || self.auth_file.is_some() || self.tls_client_ca.is_some() || cluster)
    }

    /// The flags given that a node without `--peers` does not use, in the
    /// order of `--help` (none on a cluster node): `batond` warns about
    /// each at start. A file among them is read and checked all the same,
    /// so a wrong path fails at start rather than when `--peers` is added.
    pub fn unused_without_peers(&self) -> Vec<&'static str> {
        if !self.peers.is_empty() {
            return Vec::new();
        }
        let mut unused = self.cluster_flags_given.clone();
        if self.cluster_key_file.is_some() {
            unused.push("--cluster-key-file");
        }
        if self.insecure_peers {
            unused.push("--insecure-peers");
        }
        if self.tls_ca.is_some() {
            unused.push("--tls-ca");
        }
        unused
    }

    /// The key peer links prove: read from `--cluster-key-file`, the public
    /// stand-in of `--insecure-peers`, or None for a single node (whose
    /// `--cluster-key-file`, if given, is read and checked all the same,
    /// then not used). Errors name the flag.
    pub fn read_cluster_key(&self) -> Result<Option<ClusterKey>, String> {
        let Some(path) = &self.cluster_key_file else {
            return Ok((!self.peers.is_empty()).then(ClusterKey::insecure));
        };
        let shown = path.display();
        let file = std::fs::File::open(path)
            .map_err(|e| format!("--cluster-key-file {shown}: cannot open it: {e}"))?;
        let mut contents = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, MAX_KEY_FILE as u64 + 1),
            &mut contents,
        )
        .map_err(|e| format!("--cluster-key-file {shown}: cannot read it: {e}"))?;
        if contents.len() > MAX_KEY_FILE {
            return Err(format!(
                "--cluster-key-file {shown}: over {MAX_KEY_FILE} bytes; it holds one secret"
            ));
        }
        let key = ClusterKey::from_file_contents(&contents)
            .map_err(|e| format!("--cluster-key-file {shown}: {e}"))?;
        Ok((!self.peers.is_empty()).then_some(key))
    }

    /// Client authentication from `--auth-file` (None without the flag);
    /// errors name the flag and the file, never a secret.
    pub fn read_client_auth(&self) -> Result<Option<ClientAuth>, String> {
        let Some(path) = &self.auth_file else {
            return Ok(None);
        };
        let secrets = SecretSet::read_file(path)?;
        Ok(Some(ClientAuth::new(path.clone(), secrets)))
    }

    /// This node's position in `--peers` (0 without peers).
    pub fn node_index(&self) -> Result<usize, String> {
        if self.peers.is_empty() {
            return Ok(0);
        }
        if let Some(me) = &self.advertise {
            return self
                .peers
                .iter()
                .position(|p| p == me)
                .ok_or_else(|| format!("--advertise {me} is not in --peers"));
        }
        let port = format!(":{}", self.port);
        let mine: Vec<usize> = (0..self.peers.len())
            .filter(|&i| self.peers[i].ends_with(&port))
            .collect();
        match mine.as_slice() {
            [i] => Ok(*i),
            [] => Err(format!(
                "no --peers entry has port {}; use --advertise",
                self.port
            )),
            _ => Err(format!(
                "several --peers entries have port {}; use --advertise",
                self.port
            )),
        }
    }

    /// The address this node gives as `node=` in `I`: its peers entry, or
    /// bind:port for a single node.
    pub fn node_name(&self) -> String {
        match self.node_index() {
            Ok(i) if !self.peers.is_empty() => self.peers[i].clone(),
            _ => std::net::SocketAddr::new(self.bind, self.port).to_string(),
        }
    }
}

/// Read `name`'s value, if given, with `parse` (None: not accepted). Every
/// error names the flag, what it accepts and what it got, on one line:
/// `--port: expected a port number 0-65535, got 'abc'`.
fn flag<T>(
    args: &mut pico_args::Arguments,
    name: &'static str,
    expected: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Option<T>, String> {
    let raw = args
        .opt_value_from_os_str(name, |v| {
            Ok::<_, std::convert::Infallible>(v.to_os_string())
        })
        .map_err(|_| format!("{name}: expected {expected}, got nothing"))?;
    let Some(raw) = raw else {
        return Ok(None);
    };
    let got = raw.to_string_lossy();
    raw.to_str()
        .and_then(&parse)
        .map(Some)
        .ok_or_else(|| format!("{name}: expected {expected}, got '{got}'"))
}

/// pico_args's error for a path flag, in this file's words.
fn flag_error(e: pico_args::Error) -> String {
    match e {
        pico_args::Error::OptionWithoutAValue(name) => {
            format!("{name}: expected a value, got nothing")
        }
        e => e.to_string(),
    }
}

/// What is left once every flag was read must be nothing: each flag read
/// took its first occurrence, so a flag still left was given again, and
/// any other word is an unknown flag or not a flag at all.
fn no_word_left(rest: Vec<std::ffi::OsString>) -> Result<(), String> {
    if let Some(again) = rest.iter().find(|word| FLAGS.iter().any(|f| *word == *f)) {
        return Err(format!(
            "{}: given more than once; give it once",
            again.to_string_lossy()
        ));
    }
    if let Some(word) = rest.first() {
        let word = word.to_string_lossy();
        if word.len() > 1 && word.starts_with('-') {
            return Err(format!(
                "unknown flag {word}; accepted: {}, -h/--help, -V/--version",
                FLAGS.join(", ")
            ));
        }
        return Err(format!(
            "unexpected argument '{word}': batond takes only flags (see --help)"
        ));
    }
    Ok(())
}

/// Seconds with up to 3 decimals, as milliseconds.
fn seconds(text: &str) -> Option<u64> {
    crate::protocol::parse_seconds(text.as_bytes())
}

fn parse_peers(list: &str) -> Result<Vec<String>, String> {
    let peers: Vec<String> = list.split(',').map(|p| p.trim().to_string()).collect();
    for peer in &peers {
        let ok = peer
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !ok {
            return Err(format!("--peers: '{peer}' is not host:port"));
        }
    }
    for (i, peer) in peers.iter().enumerate() {
        if peers[..i].contains(peer) {
            return Err(format!("--peers: '{peer}' is listed twice"));
        }
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, String> {
        Config::from_args(args.iter().map(Into::into).collect())
    }

    fn config(args: &[&str]) -> Config {
        match parse(args) {
            Ok(Command::Run(config)) => *config,
            other => panic!("expected a config, got {other:?}"),
        }
    }

    #[test]
    fn defaults_match_the_readme() {
        let c = config(&[]);
        assert_eq!(c.bind.to_string(), "0.0.0.0");
        assert_eq!(c.port, 7373);
        assert!(c.peers.is_empty());
        assert_eq!(c.max_lease_ms, 86_400_000);
        assert!(c.threads >= 1);
    }

    #[test]
    fn protected_mode_is_on_by_default_and_off_once_the_node_is_meant_to_be_reached() {
        assert!(config(&[]).protected_mode());
        assert!(config(&["--port", "7400", "--metrics", "127.0.0.1:9400"]).protected_mode());
        // --insecure-peers proves nothing: its clients stay on loopback
        // unless --bind says otherwise (its peer links still link).
        assert!(
            config(&[
                "--peers",
                "127.0.0.1:7373,127.0.0.1:7374",
                "--insecure-peers"
            ])
            .protected_mode()
        );
        for open in [
            &["--bind", "0.0.0.0"][..],
            &["--bind", "127.0.0.1"],
            &["--auth-file", "/secrets"],
            &["--tls-cert", "c", "--tls-key", "k", "--tls-client-ca", "ca"],
            &[
                "--peers",
                "127.0.0.1:7373,127.0.0.1:7374",
                "--cluster-key-file",
                "/key",
            ],
        ] {
            assert!(!config(open).protected_mode(), "{open:?}");
        }
        assert!(config(&["--bind", "0.0.0.0"]).bind_given);
        assert!(!config(&[]).bind_given);
    }

    #[test]
    fn default_threads_leave_a_core_to_the_lock_owner() {
        let got: Vec<_> = [0, 1, 2, 3, 4, 8, 64, 200]
            .into_iter()
            .map(default_threads)
            .collect();
        assert_eq!(got, [1, 1, 1, 2, 3, 7, 63, 64]);
    }

    #[test]
    fn every_flag_is_read() {
        let c = config(&[
            "--bind",
            "127.0.0.1",
            "--port",
            "9000",
            "--threads",
            "3",
            "--max-lease",
            "1.5",
            "--max-conns",
            "7",
            "--max-waiting",
            "8",
            "--max-keys",
            "9",
            "--detect",
            "0.25",
            "--promotion-grace",
            "2.5",
            "--busy-poll-us",
            "0",
            "--auth-file",
            "/secrets",
            "--metrics",
            "127.0.0.1:9100",
        ]);
        assert_eq!(c.auth_file, Some(PathBuf::from("/secrets")));
        assert_eq!(c.busy_poll_us, 0);
        assert_eq!(c.metrics, Some("127.0.0.1:9100".parse().expect("addr")));
        assert_eq!(config(&[]).metrics, None, "no metrics port by default");
        assert_eq!(c.detect_ms, 250);
        assert_eq!(c.promotion_grace_ms, 2500);
        assert_eq!(c.bind.to_string(), "127.0.0.1");
        assert_eq!((c.port, c.threads, c.max_lease_ms), (9000, 3, 1500));
        assert_eq!((c.max_conns, c.max_waiting, c.max_keys), (7, 8, 9));
    }

    #[test]
    fn help_is_recognised() {
        assert_eq!(parse(&["--help"]), Ok(Command::Help));
        assert!(HELP.contains("--max-conns"));
    }

    #[test]
    fn version_is_recognised() {
        assert_eq!(parse(&["--version"]), Ok(Command::Version));
        assert_eq!(parse(&["-V", "--port", "1"]), Ok(Command::Version));
        assert!(HELP.contains("--version"));
    }

    #[test]
    fn every_flag_error_names_the_flag_what_it_accepts_and_what_it_got() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--bind", "nowhere"],
                "--bind: expected an IP address to listen on, like 0.0.0.0, 127.0.0.1 or ::, got 'nowhere'",
            ),
            (
                &["--port", "abc"],
                "--port: expected a port number 0-65535, got 'abc'",
            ),
            (
                &["--port", "65536"],
                "--port: expected a port number 0-65535, got '65536'",
            ),
            (
                &["--port", "-1"],
                "--port: expected a port number 0-65535, got '-1'",
            ),
            (
                &["--port"],
                "--port: expected a port number 0-65535, got nothing",
            ),
            (
                &["--threads", "0"],
                "--threads: expected a number of I/O loops 1-64, got '0'",
            ),
            (
                &["--threads", "65"],
                "--threads: expected a number of I/O loops 1-64, got '65'",
            ),
            (
                &["--max-lease", "0"],
                "--max-lease: expected seconds above 0 and at most 31536000, with up to 3 decimals (like 86400 or 0.5), got '0'",
            ),
            (
                &["--max-lease", "1.2345"],
                "--max-lease: expected seconds above 0 and at most 31536000, with up to 3 decimals (like 86400 or 0.5), got '1.2345'",
            ),
            (
                &["--max-lease", "31536001"],
                "--max-lease: expected seconds above 0 and at most 31536000, with up to 3 decimals (like 86400 or 0.5), got '31536001'",
            ),
            (
                &["--max-lease", "99999999999999999999"],
                "--max-lease: expected seconds above 0 and at most 31536000, with up to 3 decimals (like 86400 or 0.5), got '99999999999999999999'",
            ),
            (
                &["--max-lease", "18446744073709551.616"],
                "--max-lease: expected seconds above 0 and at most 31536000, with up to 3 decimals (like 86400 or 0.5), got '18446744073709551.616'",
            ),
            (
                &["--max-conns", "0"],
                "--max-conns: expected a whole number of connections, 1 or more, got '0'",
            ),
            (
                &["--max-conns", "many"],
                "--max-conns: expected a whole number of connections, 1 or more, got 'many'",
            ),
            (
                &["--max-waiting", "4294967296"],
                "--max-waiting: expected a whole number of requests 1-4294967295, got '4294967296'",
            ),
            (
                &["--max-waiting", "0"],
                "--max-waiting: expected a whole number of requests 1-4294967295, got '0'",
            ),
            (
                &["--max-keys", "1e6"],
                "--max-keys: expected a whole number of keys, 1 or more, got '1e6'",
            ),
            (
                &["--detect", "0.019"],
                "--detect: expected seconds 0.02-3600, with up to 3 decimals (like 1 or 0.25), got '0.019'",
            ),
            (
                &["--detect", "3600.001"],
                "--detect: expected seconds 0.02-3600, with up to 3 decimals (like 1 or 0.25), got '3600.001'",
            ),
            (
                &["--detect", "99999999999999999999"],
                "--detect: expected seconds 0.02-3600, with up to 3 decimals (like 1 or 0.25), got '99999999999999999999'",
            ),
            (
                &["--promotion-grace", "99999999999999999999"],
                "--promotion-grace: expected seconds 0-31536000, with up to 3 decimals (like 30 or 0.5; 0 is off), got '99999999999999999999'",
            ),
            (
                &["--promotion-grace", "soon"],
                "--promotion-grace: expected seconds 0-31536000, with up to 3 decimals (like 30 or 0.5; 0 is off), got 'soon'",
            ),
            (
                &["--busy-poll-us", "10001"],
                "--busy-poll-us: expected microseconds 0-10000, got '10001'",
            ),
            (
                &["--busy-poll-us", "-1"],
                "--busy-poll-us: expected microseconds 0-10000, got '-1'",
            ),
            (
                &["--peers"],
                "--peers: expected a comma-separated list of host:port, got nothing",
            ),
            (
                &["--advertise"],
                "--advertise: expected this node's host:port entry of --peers, got nothing",
            ),
            (
                &["--cluster-key-file"],
                "--cluster-key-file: expected a value, got nothing",
            ),
            (
                &["stray"],
                "unexpected argument 'stray': batond takes only flags (see --help)",
            ),
            (&["--peers", "a:1,a:1"], "--peers: 'a:1' is listed twice"),
            (&["--peers", "nope"], "--peers: 'nope' is not host:port"),
        ];
        for (args, expected) in cases {
            assert_eq!(parse(args).as_ref(), Err(&expected.to_string()), "{args:?}");
        }
        // The edges of each range are accepted.
        let c = config(&["--port", "65535", "--threads", "64", "--detect", "3600"]);
        assert_eq!((c.port, c.threads, c.detect_ms), (65535, 64, 3_600_000));
        let c = config(&["--max-lease", "31536000", "--promotion-grace", "0"]);
        assert_eq!((c.max_lease_ms, c.promotion_grace_ms), (31_536_000_000, 0));
        let c = config(&["--max-waiting", "4294967295", "--busy-poll-us", "10000"]);
        assert_eq!((c.max_waiting, c.busy_poll_us), (u32::MAX, 10_000));
        assert_eq!(
            parse(&["--metrics", "9100"]),
            Err("--metrics: expected an address and port to serve metrics on, like 127.0.0.1:9100, got '9100'".to_string())
        );
        assert!(parse(&["--metrics", "localhost"]).is_err());
        // Not on the client port (the node would find it taken by itself).
        for (bind, metrics) in [
            ("0.0.0.0", "127.0.0.1:7373"),
            ("127.0.0.1", "127.0.0.1:7373"),
            ("127.0.0.1", "0.0.0.0:7373"),
        ] {
            let err = parse(&["--bind", bind, "--metrics", metrics]).expect_err(metrics);
            assert!(
                err.starts_with("--metrics: expected an address and port other than the client's"),
                "{err}"
            );
        }
        let c = config(&["--bind", "127.0.0.1", "--metrics", "127.0.0.2:7373"]);
        assert_eq!(c.metrics, Some("127.0.0.2:7373".parse().expect("addr")));
        assert!(parse(&["--port", "0", "--metrics", "127.0.0.1:0"]).is_ok());
    }

    #[test]
    fn an_unknown_flag_is_named_with_every_flag_that_is_accepted() {
        for unknown in ["--bogus", "-x", "--port=1"] {
            let err = parse(&["--port", "1", unknown]).expect_err(unknown);
            let accepted = format!("unknown flag {unknown}; accepted: --bind, --port, --peers, ");
            assert!(err.starts_with(&accepted), "{err}");
            assert!(err.ends_with(", --echo, -h/--help, -V/--version"), "{err}");
            for flag in FLAGS {
                assert!(err.contains(&format!(" {flag},")), "{flag}: {err}");
            }
        }
    }

    #[test]
    fn a_flag_given_twice_is_an_error_that_names_it() {
        // A value each flag accepts, so that only the repeat is wrong.
        let value = |flag: &str| match flag {
            "--bind" => Some("127.0.0.1"),
            "--peers" => Some("h:1,h:2"),
            "--advertise" => Some("h:1"),
            "--metrics" => Some("127.0.0.1:9100"),
            "--insecure-peers" | "--echo" => None,
            f if f.starts_with("--tls") || f.ends_with("-file") => Some("/f"),
            _ => Some("1"),
        };
        for flag in FLAGS {
            let mut args = vec![flag];
            args.extend(value(flag));
            let once = args.clone();
            args.extend(once.iter().copied());
            let err = parse(&args).expect_err("twice");
            assert_eq!(err, format!("{flag}: given more than once; give it once"));
            assert!(HELP.contains(flag), "--help lists {flag}");
        }
        assert_eq!(
            parse(&["--port", "1", "--bind", "::1", "--port", "2"]),
            Err("--port: given more than once; give it once".to_string())
        );
        assert_eq!(
            parse(&["--port", "1", "--port"]),
            Err("--port: given more than once; give it once".to_string())
        );
    }

    #[test]
    fn a_node_finds_itself_in_peers_by_port_or_advertise() {
        let c = config(&["--port", "2", "--peers", "h:1,h:2,h:3", "--insecure-peers"]);
        assert_eq!(c.node_index(), Ok(1));
        assert_eq!(c.node_name(), "h:2");
        let c = config(&[
            "--port",
            "1",
            "--peers",
            "a:1,b:1",
            "--advertise",
            "b:1",
            "--insecure-peers",
        ]);
        assert_eq!(c.node_index(), Ok(1));
        let insecure = ["--insecure-peers"];
        assert!(parse(&[&["--port", "1", "--peers", "a:1,b:1"][..], &insecure].concat()).is_err());
        assert!(parse(&[&["--port", "5", "--peers", "a:1,b:2"][..], &insecure].concat()).is_err());
    }

    #[test]
    fn tls_flags_go_together() {
        let c = config(&[
            "--tls-cert",
            "/c",
            "--tls-key",
            "/k",
            "--tls-client-ca",
            "/cca",
        ]);
        assert_eq!(c.tls_cert, Some(PathBuf::from("/c")));
        assert_eq!(c.tls_key, Some(PathBuf::from("/k")));
        assert_eq!(c.tls_client_ca, Some(PathBuf::from("/cca")));
        assert_eq!(c.tls_ca, None);
        for (args, flag) in [
            (&["--tls-cert", "/c"][..], "--tls-key"),
            (&["--tls-key", "/k"][..], "--tls-cert"),
            (&["--tls-client-ca", "/c"][..], "--tls-cert"),
            (&["--tls-ca", "/c"][..], "--tls-cert"),
        ] {
            let err = parse(args).expect_err("refused");
            assert!(err.contains(flag), "{args:?}: {err}");
        }
    }

    #[test]
    fn peers_need_a_cluster_key_file_or_insecure_peers() {
        let err = parse(&["--port", "1", "--peers", "h:1,h:2"]).expect_err("refused");
        assert!(err.contains("--cluster-key-file"), "{err}");
        assert!(err.contains("--insecure-peers"), "{err}");
        let c = config(&["--port", "1", "--peers", "h:1,h:2", "--insecure-peers"]);
        assert!(c.insecure_peers);
        let key = config(&[
            "--port",
            "1",
            "--peers",
            "h:1,h:2",
            "--cluster-key-file",
            "/k",
        ]);
        assert_eq!(key.cluster_key_file, Some(PathBuf::from("/k")));
        assert!(
            parse(&[
                "--port",
                "1",
                "--peers",
                "h:1,h:2",
                "--cluster-key-file",
                "/k",
                "--insecure-peers"
            ])
            .is_err()
        );
        // A single node needs neither.
        assert_eq!(config(&[]).read_cluster_key(), Ok(None));
    }

    #[test]
    fn the_cluster_key_file_is_read_and_checked_with_the_flag_named() {
        let dir = std::env::temp_dir().join(format!("baton-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let short = dir.join("short");
        std::fs::write(&short, "too short\n").expect("write");
        let good = dir.join("good");
        std::fs::write(&good, format!("  {}\n", "s".repeat(40))).expect("write");
        let with = |path: &std::path::Path| Config {
            peers: vec!["h:1".into(), "h:2".into()],
            cluster_key_file: Some(path.to_path_buf()),
            ..Config::default()
        };
        let err = with(&short).read_cluster_key().expect_err("short");
        assert!(err.starts_with("--cluster-key-file"), "{err}");
        assert!(err.contains("at least 32"), "{err}");
        let err = with(&dir.join("missing"))
            .read_cluster_key()
            .expect_err("gone");
        assert!(err.contains("cannot open"), "{err}");
        let key = with(&good).read_cluster_key().expect("ok").expect("a key");
        assert!(!key.is_insecure());
        let insecure = Config {
            peers: vec!["h:1".into(), "h:2".into()],
            insecure_peers: true,
            ..Config::default()
        };
        assert!(
            insecure
                .read_cluster_key()
                .expect("ok")
                .expect("key")
                .is_insecure()
        );
        // Without --peers the file is not used, but it is checked.
        let single = |path: &std::path::Path| Config {
            cluster_key_file: Some(path.to_path_buf()),
            ..Config::default()
        };
        assert_eq!(single(&good).read_cluster_key(), Ok(None));
        let err = single(&dir.join("missing"))
            .read_cluster_key()
            .expect_err("gone");
        assert!(err.starts_with("--cluster-key-file"), "{err}");
        assert!(err.contains("cannot open"), "{err}");
        let err = single(&short).read_cluster_key().expect_err("short");
        assert!(err.contains("at least 32"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_node_without_peers_names_the_flags_it_does_not_use() {
        let c = config(&[
            "--detect",
            "1",
            "--promotion-grace",
            "0",
            "--cluster-key-file",
            "/k",
            "--tls-cert",
            "/c",
            "--tls-key",
            "/k",
            "--tls-ca",
            "/ca",
            "--tls-client-ca",
            "/cca",
            "--auth-file",
            "/a",
        ]);
        assert_eq!(
            c.unused_without_peers(),
            [
                "--detect",
                "--promotion-grace",
                "--cluster-key-file",
                "--tls-ca"
            ]
        );
        let c = config(&["--insecure-peers"]);
        assert_eq!(c.unused_without_peers(), ["--insecure-peers"]);
        assert!(config(&[]).unused_without_peers().is_empty());
        let cluster = config(&[
            "--port",
            "1",
            "--peers",
            "h:1,h:2",
            "--insecure-peers",
            "--detect",
            "2",
        ]);
        assert!(cluster.unused_without_peers().is_empty());
    }
}
