//! Where a launcher listens (issue #36): on its node's address as Slurm
//! knows it (the node's `NodeAddr`), the one onepoold reads from Slurm's
//! node list and routes to. A launcher on 0.0.0.0 also answered on every
//! other address of the node (a second network, loopback for every
//! process on the node); one on loopback could not be reached from
//! onepoold's host at all. The model server stays on the node's loopback.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use tokio::process::Command;

/// `--listen`: an address, or `node:PORT` for this node's address as
/// Slurm knows it (what onepoold asks for; port 0: the kernel's choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    At(SocketAddr),
    Node(u16),
}

impl FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Listen, String> {
        if let Some(port) = s.strip_prefix("node:") {
            return port
                .parse()
                .map(Listen::Node)
                .map_err(|_| format!("{s:?}: the port after \"node:\" is not a port"));
        }
        s.parse()
            .map(Listen::At)
            .map_err(|_| format!("{s:?} is neither IP:PORT nor node:PORT (this node's address as Slurm knows it)"))
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::At(a) => write!(f, "{a}"),
            Listen::Node(p) => write!(f, "node:{p}"),
        }
    }
}

/// How long `scontrol show node` may take (slurmctld busy).
const SCONTROL_TIMEOUT: Duration = Duration::from_secs(30);

/// The address to bind for `listen`: `node:PORT` asks slurmctld for this
/// node's NodeAddr (`SLURMD_NODENAME`, which Slurm sets in every job and
/// step) and resolves it when it is a name.
pub async fn resolve(listen: Listen, scontrol: &str) -> Result<SocketAddr, String> {
    let port = match listen {
        Listen::At(a) => return Ok(a),
        Listen::Node(p) => p,
    };
    let node = std::env::var("SLURMD_NODENAME")
        .map_err(|_| "--listen node:PORT runs in a Slurm job: SLURMD_NODENAME is not set".to_string())?;
    let out = Command::new(scontrol).args(["-o", "show", "node", &node]).kill_on_drop(true).output();
    let out = match tokio::time::timeout(SCONTROL_TIMEOUT, out).await {
        Ok(Ok(o)) if o.status.success() => o,
        Ok(Ok(o)) => {
            return Err(format!(
                "{scontrol} show node {node}: {}: {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
        Ok(Err(e)) => return Err(format!("cannot run {scontrol}: {e}")),
        Err(_) => {
            return Err(format!("{scontrol} show node {node} did not answer in {} s", SCONTROL_TIMEOUT.as_secs()))
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let addr = node_addr(&text, &node)
        .ok_or_else(|| format!("{scontrol} show node {node} gave no NodeAddr for it: {:?}", text.trim()))?;
    if let Ok(ip) = addr.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    // A name: what this node's resolver says, as onepoold's does for it.
    let mut found = tokio::net::lookup_host((addr, port))
        .await
        .map_err(|e| format!("node {node}'s NodeAddr {addr:?} does not resolve: {e}"))?;
    found.next().ok_or_else(|| format!("node {node}'s NodeAddr {addr:?} resolves to no address"))
}

/// `NodeAddr` of `node` in `scontrol -o show node` output (one line per
/// node, `Key=Value` words).
pub fn node_addr<'a>(text: &'a str, node: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let mut words = line.split_ascii_whitespace();
        if words.clone().next()? != format!("NodeName={node}") {
            return None;
        }
        words.find_map(|w| w.strip_prefix("NodeAddr=")).filter(|a| !a.is_empty() && !a.contains(['=', '"']))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_takes_an_address_or_the_node_s() {
        assert_eq!("node:0".parse(), Ok(Listen::Node(0)));
        assert_eq!("10.0.0.5:8000".parse(), Ok(Listen::At("10.0.0.5:8000".parse().unwrap())));
        assert_eq!(Listen::Node(0).to_string(), "node:0");
        for bad in ["node:x", "node", "gpu01:80", "node:70000"] {
            assert!(bad.parse::<Listen>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_node_s_own_line_gives_its_address() {
        let text = "NodeName=node1 Arch=x86_64 NodeAddr=10.1.0.1 NodeHostName=gpu-a\n\
                    NodeName=node2 Arch=x86_64 NodeAddr=gpu-b.site NodeHostName=gpu-b\n";
        assert_eq!(node_addr(text, "node1"), Some("10.1.0.1"));
        assert_eq!(node_addr(text, "node2"), Some("gpu-b.site"));
        assert_eq!(node_addr(text, "node"), None);
        assert_eq!(node_addr("NodeName=node1 NodeAddr= x", "node1"), None);
    }

    #[tokio::test]
    async fn an_address_is_bound_as_given_and_node_needs_slurm() {
        let at: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert_eq!(resolve(Listen::At(at), "/nonexistent/scontrol").await, Ok(at));
        // Without scontrol (or outside a job) the launcher refuses to start
        // rather than listen somewhere Slurm does not route.
        assert!(resolve(Listen::Node(0), "/nonexistent/scontrol").await.is_err());
    }
}
