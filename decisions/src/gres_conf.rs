//! Which device files back a node's GPUs, from gres.conf: Slurm numbers a
//! node's GPUs 0, 1, ... in the order of their `File=` entries, and
//! `SLURM_JOB_GPUS` carries those numbers, not device minors.

use crate::hostlist;

/// The GPU device files of `node`, in Slurm's index order. Lines without
/// `NodeName=` apply to every node. An empty list means gres.conf names no
/// GPU files for the node (e.g. `AutoDetect=nvml`).
pub fn gpu_files(gres_conf: &str, node: &str) -> Result<Vec<String>, String> {
    let mut files = Vec::new();
    for (n, raw) in gres_conf.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let field = |key: &str| {
            line.split_whitespace().find_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                k.eq_ignore_ascii_case(key).then_some(v)
            })
        };
        if field("Name").is_none_or(|name| name != "gpu") {
            continue;
        }
        if let Some(nodes) = field("NodeName") {
            if !hostlist::expand(nodes)
                .map_err(|e| format!("gres.conf line {}: NodeName {e}", n + 1))?
                .iter()
                .any(|h| h == node)
            {
                continue;
            }
        }
        if let Some(list) = field("File") {
            files.extend(hostlist::expand(list).map_err(|e| format!("gres.conf line {}: File {e}", n + 1))?);
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONF: &str = "AutoDetect=off\n# comment\nNodeName=node[1-2] Name=gpu File=/d/nvidia[0-1]\nNodeName=node3 Name=gpu File=/d/nvidia[4-5],/d/nvidia7\nName=mps Count=100\n";

    #[test]
    fn files_in_index_order() {
        assert_eq!(gpu_files(CONF, "node2").unwrap(), ["/d/nvidia0", "/d/nvidia1"]);
        assert_eq!(gpu_files(CONF, "node3").unwrap(), ["/d/nvidia4", "/d/nvidia5", "/d/nvidia7"]);
        assert!(gpu_files(CONF, "node9").unwrap().is_empty());
        assert!(gpu_files("Name=gpu File=/d/nvidia[1-", "x").unwrap_err().starts_with("gres.conf line 1: File"));
    }
}
