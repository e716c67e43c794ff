//! The TLS rows of lockbench: what TLS costs per request, baton and Redis.
//!
//! Owns: the `--baton-tls`, `--redis-tls`, `--redis-tls-plain`, `--tls-ca`
//! and `--tls-note` options, the `--make-certs DIR` helper (a CA and a
//! certificate for 127.0.0.1, made with rcgen, for scripts/bench.sh), the
//! schedule of the TLS rows (each row against plain and TLS servers,
//! interleaved, the order reversed every other round) and their Markdown
//! table, printed after the main tables.
//!
//! Never does: start a server, or measure handshakes (every connection's
//! handshake is done before its run starts: the rows are the steady-state
//! cost per request).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::engine::{self, Outcome, RunSpec, Workload};
use crate::wire::Proto;

/// Where the TLS servers are.
pub struct TlsOptions {
    pub baton_tls: SocketAddr,
    pub redis_tls: Option<SocketAddr>,
    /// The same Redis on a plain port (the release script is loaded there).
    pub redis_tls_plain: Option<SocketAddr>,
    pub ca: PathBuf,
    pub note: Option<String>,
}

/// The TLS options, if `--baton-tls` is given.
pub fn parse(args: &mut pico_args::Arguments) -> Result<Option<TlsOptions>, String> {
    let err = |e: pico_args::Error| e.to_string();
    let baton_tls: Option<SocketAddr> = args.opt_value_from_str("--baton-tls").map_err(err)?;
    let redis_tls = args.opt_value_from_str("--redis-tls").map_err(err)?;
    let redis_tls_plain = args.opt_value_from_str("--redis-tls-plain").map_err(err)?;
    let ca: Option<PathBuf> = args
        .opt_value_from_os_str("--tls-ca", |s| {
            Ok::<_, std::convert::Infallible>(PathBuf::from(s))
        })
        .map_err(err)?;
    let note = args.opt_value_from_str("--tls-note").map_err(err)?;
    let Some(baton_tls) = baton_tls else {
        return Ok(None);
    };
    let ca = ca.ok_or("--baton-tls needs --tls-ca")?;
    if redis_tls.is_some() != redis_tls_plain.is_some() {
        return Err("--redis-tls and --redis-tls-plain go together".into());
    }
    Ok(Some(TlsOptions {
        baton_tls,
        redis_tls,
        redis_tls_plain,
        ca,
        note,
    }))
}

/// `--make-certs DIR`: write ca.pem, node.pem and node.key (for 127.0.0.1).
pub fn make_certs(dir: &Path) -> Result<(), String> {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let e = |e: rcgen::Error| e.to_string();
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "lockbench CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().map_err(e)?).map_err(e)?;
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).map_err(e)?;
    params.distinguished_name.push(DnType::CommonName, "node");
    let key = KeyPair::generate().map_err(e)?;
    let cert = params.signed_by(&key, &ca).map_err(e)?;
    let write = |name: &str, text: String| {
        std::fs::write(dir.join(name), text).map_err(|e| format!("{name}: {e}"))
    };
    write("ca.pem", ca.pem())?;
    write("node.pem", cert.pem())?;
    write("node.key", key.serialize_pem())
}

/// One TLS row: connections and pipeline depth.
const ROWS: [(usize, usize); 3] = [(1, 1), (50, 1), (50, 16)];

/// What the TLS rows need from the main options.
pub struct Shape {
    pub warmup: Duration,
    pub measure: Duration,
    pub rounds: usize,
    pub threads: usize,
    pub seed: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sys {
    Baton,
    BatonTls,
    Redis,
    RedisTls,
}

impl Sys {
    fn name(self) -> &'static str {
        match self {
            Sys::Baton => "baton",
            Sys::BatonTls => "baton TLS",
            Sys::Redis => "redis",
            Sys::RedisTls => "redis TLS",
        }
    }
}

/// Run the TLS rows; their Markdown section.
pub fn run(
    tls: &TlsOptions,
    shape: &Shape,
    baton: Option<SocketAddr>,
    redis: Option<SocketAddr>,
    script_load: fn(SocketAddr) -> Result<Vec<u8>, String>,
) -> Result<String, String> {
    let roots = baton::tls::roots_from_file(&tls.ca)?;
    let config = rustls::ClientConfig::builder_with_provider(baton::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let config = Arc::new(config);
    // The release script, loaded into each Redis (the same SHA1).
    let mut sha = Vec::new();
    for addr in [redis, tls.redis_tls_plain].into_iter().flatten() {
        sha = script_load(addr)?;
    }
    let mut systems: Vec<(Sys, SocketAddr)> = Vec::new();
    if let Some(addr) = baton {
        systems.push((Sys::Baton, addr));
    }
    systems.push((Sys::BatonTls, tls.baton_tls));
    if let Some(addr) = redis {
        systems.push((Sys::Redis, addr));
    }
    if let Some(addr) = tls.redis_tls {
        systems.push((Sys::RedisTls, addr));
    }
    let mut outcomes: Vec<Vec<Option<Outcome>>> = vec![vec![None; systems.len()]; ROWS.len()];
    let mut run_no = 1_000_000u64;
    for round in 0..shape.rounds {
        for (r, &(conns, depth)) in ROWS.iter().enumerate() {
            let mut order: Vec<usize> = (0..systems.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let (sys, addr) = systems[i];
                run_no += 1;
                eprintln!(
                    "round {} tls C={conns} depth={depth}: {}",
                    round + 1,
                    sys.name()
                );
                let spec = RunSpec {
                    addr,
                    proto: match sys {
                        Sys::Baton | Sys::BatonTls => Proto::Baton,
                        Sys::Redis | Sys::RedisTls => Proto::RedisLock,
                    },
                    conns,
                    workload: Workload::Uncontended { depth },
                    lease_ms: 10_000,
                    wait_ms: 30_000,
                    warmup: shape.warmup,
                    measure: shape.measure,
                    drain: Duration::from_secs(3),
                    key_prefix: format!("t{run_no}:"),
                    threads: shape.threads,
                    sha: sha.clone(),
                    seed: shape.seed ^ run_no.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    tls: matches!(sys, Sys::BatonTls | Sys::RedisTls).then(|| config.clone()),
                    cpu_pids: Vec::new(),
                    split: None,
                    limit: None,
                    changes: None,
                };
                let outcome = engine::run(&spec)
                    .map_err(|e| format!("tls C={conns} depth={depth} {}: {e}", sys.name()))?;
                let slot = &mut outcomes[r][i];
                match slot {
                    Some(so_far) => so_far.merge(&outcome, false),
                    None => *slot = Some(outcome),
                }
            }
        }
    }
    Ok(render(tls, &systems, &outcomes))
}

fn render(
    tls: &TlsOptions,
    systems: &[(Sys, SocketAddr)],
    outcomes: &[Vec<Option<Outcome>>],
) -> String {
    let mut out = String::new();
    out.push_str("\n### TLS: cost per request (uncontended acquire + release, random keys)\n\n");
    out.push_str("| C × depth | system | pairs/s | acquire p50 µs | p99 µs | errors |\n");
    out.push_str("|---|---|---:|---:|---:|---:|\n");
    let rate = |o: &Outcome| o.pairs as f64 / o.secs.max(1e-9);
    let us = |o: &Outcome, q: f64| o.acquire.value_at_quantile(q) as f64 / 1000.0;
    for (r, &(conns, depth)) in ROWS.iter().enumerate() {
        for (i, (sys, _)) in systems.iter().enumerate() {
            if let Some(o) = &outcomes[r][i] {
                out.push_str(&format!(
                    "| {conns} × {depth} | {} | {:.0} | {:.1} | {:.1} | {} |\n",
                    sys.name(),
                    rate(o),
                    us(o, 0.5),
                    us(o, 0.99),
                    o.errors + o.timeouts + o.not_held
                ));
            }
        }
    }
    out.push_str(
        "\nTLS cost as a ratio (time per request with TLS ÷ without: plain pairs/s ÷ TLS pairs/s; \
         and acquire p50 with TLS ÷ without):\n\n",
    );
    out.push_str(
        "| C × depth | baton: time/request | baton: p50 | redis: time/request | redis: p50 |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|\n");
    let find = |r: usize, want: Sys| {
        systems
            .iter()
            .position(|(s, _)| *s == want)
            .and_then(|i| outcomes[r][i].as_ref())
    };
    let ratio = |plain: Option<&Outcome>, with: Option<&Outcome>| match (plain, with) {
        (Some(p), Some(t)) => (
            format!("{:.2}×", rate(p) / rate(t).max(1e-9)),
            format!("{:.2}×", us(t, 0.5) / us(p, 0.5).max(1e-9)),
        ),
        _ => ("—".into(), "—".into()),
    };
    for (r, &(conns, depth)) in ROWS.iter().enumerate() {
        let (bt, bp) = ratio(find(r, Sys::Baton), find(r, Sys::BatonTls));
        let (rt, rp) = ratio(find(r, Sys::Redis), find(r, Sys::RedisTls));
        out.push_str(&format!(
            "| {conns} × {depth} | {bt} | {bp} | {rt} | {rp} |\n"
        ));
    }
    if let Some(note) = &tls.note {
        out.push_str(&format!("\n{note}\n"));
    }
    out.push_str(
        "\nEvery connection's handshake is done before its run: these are steady-state \
         costs (TLS 1.3, AES-GCM or ChaCha20 as negotiated, rustls with ring for baton).\n",
    );
    out
}
