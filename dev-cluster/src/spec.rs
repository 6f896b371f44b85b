//! What one cluster is: its name, size and ports, chosen at the first `up`
//! and kept in cluster.json so later `up`s reuse them.

use std::fs;
use std::net::TcpListener;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::hosts::HostsNet;
use crate::layout::Layout;
use crate::options::UpOptions;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Spec {
    pub cluster: String,
    pub partition: String,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub cpus_per_node: u32,
    pub memory_mb_per_node: u32,
    pub ctld_port: u16,
    pub dbd_port: u16,
    pub db_port: u16,
    pub slurmd_ports: Vec<u16>,
    pub db_password: String,
    /// The hosts mode's network (`up --hosts`); absent in the
    /// single-namespace mode, whose cluster.json is unchanged by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<HostsNet>,
}

impl Spec {
    pub fn node_names(&self) -> Vec<String> {
        (1..=self.nodes).map(|i| format!("node{i}")).collect()
    }

    pub fn load(path: &Path) -> Result<Option<Spec>> {
        match fs::read_to_string(path) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| Error::Setup(format!("{}: {e} (delete the folder to start over)", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::Io { what: format!("reading {}", path.display()), source: e }),
        }
    }

    pub fn load_or_create(layout: &Layout, opts: &UpOptions) -> Result<Spec> {
        if let Some(s) = Spec::load(&layout.cluster_json())? {
            if s.nodes != opts.nodes || s.gpus_per_node != opts.gpus_per_node {
                return Err(Error::Setup(format!(
                    "the cluster in {} has {} nodes x {} GPUs; run `down` and delete the folder to change its size",
                    layout.root.display(),
                    s.nodes,
                    s.gpus_per_node
                )));
            }
            if s.hosts.is_some() != opts.hosts {
                let mode = |hosts: bool| if hosts { "the hosts mode (--hosts)" } else { "one network namespace" };
                return Err(Error::Setup(format!(
                    "the cluster in {} runs in {}; run `down` and delete the folder to change its mode",
                    layout.root.display(),
                    mode(s.hosts.is_some())
                )));
            }
            return Ok(s);
        }
        if opts.hosts && opts.nodes > crate::hosts::MAX_NODES {
            return Err(Error::Setup(format!("the hosts mode numbers at most {} nodes", crate::hosts::MAX_NODES)));
        }
        let ports = free_ports(3 + opts.nodes as usize)?;
        let cluster = cluster_name(&layout.root);
        let hosts = if opts.hosts { Some(crate::hosts::choose(&cluster)?) } else { None };
        let spec = Spec {
            cluster,
            partition: "gpu".into(),
            nodes: opts.nodes,
            gpus_per_node: opts.gpus_per_node,
            cpus_per_node: 16,
            memory_mb_per_node: 64_000,
            ctld_port: ports[0],
            dbd_port: ports[1],
            db_port: ports[2],
            slurmd_ports: ports[3..].to_vec(),
            db_password: random_hex(12)?,
            hosts,
        };
        let text = serde_json::to_string_pretty(&spec).expect("spec serializes");
        fs::write(layout.cluster_json(), text).ctx(|| "writing cluster.json".into())?;
        Ok(spec)
    }
}

/// A cluster name derived from the folder, so two folders never share one
/// (Slurm wants lowercase; slurmdbd keys its tables by it).
fn cluster_name(root: &Path) -> String {
    // FNV-1a: stable across Rust releases, unlike DefaultHasher.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in root.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("op{:08x}", h as u32)
}

/// Distinct loopback ports free right now (held open together while chosen
/// so they differ from one another).
fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners: Vec<TcpListener> =
        (0..n).map(|_| TcpListener::bind("127.0.0.1:0").ctx(|| "finding a free port".into())).collect::<Result<_>>()?;
    listeners.iter().map(|l| Ok(l.local_addr().ctx(|| "local_addr".into())?.port())).collect()
}

fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    use std::io::Read;
    fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)).ctx(|| "reading /dev/urandom".into())?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_differ_per_folder_and_are_stable() {
        let a = cluster_name(Path::new("/a/b"));
        assert_eq!(a, cluster_name(Path::new("/a/b")));
        assert_ne!(a, cluster_name(Path::new("/a/c")));
        assert!(a.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
    }

    #[test]
    fn ports_are_distinct() {
        let p = free_ports(8).unwrap();
        let mut q = p.clone();
        q.sort();
        q.dedup();
        assert_eq!(q.len(), 8);
    }
}
