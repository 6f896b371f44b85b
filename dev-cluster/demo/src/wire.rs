//! The hosts mode's network as the demo uses it (issue #36): onepoold's
//! front speaks TLS with a certificate made for the service host's
//! address, and a capture of the bridge must show neither the replica key
//! nor a prompt in clear, while it does show Slurm's own RPCs (which are
//! not encrypted: the proof that the capture sees clear text at all).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;
use onepool_dev_cluster::capture::{Capture, Flows};

use crate::demo::{step, Paths};

/// Texts of every prompt the load sends: the JSON field of a chat request,
/// and words that most of the demo's prompts hold
/// ([`onepool_loadgen::ChatShape::body`]).
const PROMPT_TEXTS: [&str; 2] = ["\"messages\"", "its GPUs between training"];
/// What Slurm's own RPCs carry in clear: the replica jobs' names, in
/// onepoold's sbatch requests to slurmctld.
const SLURM_TEXT: &str = "onepool-chat-";

/// The front's certificate and key, written where onepoold's config names
/// them (the key readable by onepoold's user alone, as it requires).
pub(crate) struct Front {
    pub(crate) cert_file: PathBuf,
    pub(crate) key_file: PathBuf,
    pub(crate) pem: String,
}

/// A self-signed certificate for `ip`, made for this run.
pub(crate) fn front_certificate(dir: &Path, ip: std::net::Ipv4Addr, owner: (u32, u32)) -> anyhow::Result<Front> {
    use std::os::unix::fs::PermissionsExt;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.subject_alt_names.push(rcgen::SanType::IpAddress(ip.into()));
    let key = rcgen::KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    let (cert_file, key_file) = (dir.join("front.crt"), dir.join("front.key"));
    fs::write(&cert_file, cert.pem()).with_context(|| format!("writing {}", cert_file.display()))?;
    fs::write(&key_file, key.serialize_pem()).with_context(|| format!("writing {}", key_file.display()))?;
    fs::set_permissions(&key_file, fs::Permissions::from_mode(0o600))?;
    std::os::unix::fs::chown(&key_file, Some(owner.0), Some(owner.1))
        .with_context(|| format!("handing {} to onepoold's user", key_file.display()))?;
    Ok(Front { cert_file, key_file, pem: cert.pem() })
}

/// Starts capturing the bridge, in the hosts mode only.
pub(crate) fn start_capture(paths: &Paths, dir: &Path) -> anyhow::Result<Option<Capture>> {
    let Some(bridge) = &paths.bridge else { return Ok(None) };
    let capture = Capture::start(bridge, &dir.join("bridge.pcap")).map_err(|e| anyhow::anyhow!(e))?;
    Ok(Some(capture))
}

/// Stops the capture and says what crossed the bridge; an error names what
/// crossed it in clear that must not have.
pub(crate) fn what_crossed(capture: Capture, bridge: &str, key_file: &Path) -> anyhow::Result<()> {
    let flows = capture.finish().map_err(|e| anyhow::anyhow!(e))?;
    let key = fs::read_to_string(key_file).with_context(|| format!("reading {}", key_file.display()))?;
    let found = |text: &str| flows.containing(text.as_bytes()).len();
    let slurm = found(SLURM_TEXT);
    let key_in = found(key.trim());
    let prompts: Vec<(&str, usize)> = PROMPT_TEXTS.iter().map(|t| (*t, found(t))).collect();
    step(&format!("What crossed the bridge ({bridge}, tcpdump): {}", summary(&flows)));
    println!("Slurm's own RPCs, in clear: the replica jobs' names ({SLURM_TEXT:?}) in {slurm} TCP stream(s)");
    println!("onepoold's replica key: in {key_in} stream(s)");
    for (t, n) in &prompts {
        println!("a prompt's text {t:?}: in {n} stream(s)");
    }
    let mut problems = Vec::new();
    if slurm == 0 {
        problems.push("the capture shows no Slurm RPC in clear, so it proves nothing".to_string());
    }
    if key_in > 0 {
        problems.push(format!("the replica key crossed the bridge in clear in {key_in} stream(s)"));
    }
    for (t, n) in prompts.iter().filter(|(_, n)| *n > 0) {
        problems.push(format!("a prompt's text {t:?} crossed the bridge in clear in {n} stream(s)"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{}", problems.join("; "))
    }
}

fn summary(f: &Flows) -> String {
    let bytes: usize = f.streams.values().map(Vec::len).sum();
    format!("{} packets, {} TCP streams with {} payload bytes", f.packets, f.streams.len(), bytes)
}
