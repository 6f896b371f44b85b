//! The fleet: groups of identical nodes (GPUs per node, GPU type). A job or
//! replica that needs N GPUs on one node only fits on a node of its type
//! with N free GPUs, so the opportunity depends on topology, not only on
//! GPU counts.

use serde::{Deserialize, Serialize};

/// Most GPUs one node may have (a node's GPUs are a 64-bit mask).
pub const MAX_GPUS_PER_NODE: u32 = 64;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeGroup {
    pub count: u32,
    pub gpus_per_node: u32,
    #[serde(default)]
    pub gpu_type: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fleet {
    pub groups: Vec<NodeGroup>,
}

impl Fleet {
    pub fn uniform(nodes: u32, gpus_per_node: u32) -> Fleet {
        Fleet { groups: vec![NodeGroup { count: nodes, gpus_per_node, gpu_type: None }] }
    }

    pub fn check(&self) -> Result<(), String> {
        if self.groups.is_empty() {
            return Err("the fleet has no node groups".into());
        }
        for g in &self.groups {
            if g.gpus_per_node == 0 || g.gpus_per_node > MAX_GPUS_PER_NODE {
                return Err(format!("gpus_per_node must be 1..={MAX_GPUS_PER_NODE}, not {}", g.gpus_per_node));
            }
        }
        Ok(())
    }

    pub fn nodes(&self) -> u32 {
        self.groups.iter().map(|g| g.count).sum()
    }

    pub fn gpus(&self) -> u64 {
        self.groups.iter().map(|g| u64::from(g.count) * u64::from(g.gpus_per_node)).sum()
    }

    /// Every node in order: (GPUs, type).
    pub fn node_list(&self) -> Vec<(u32, Option<&str>)> {
        self.groups.iter().flat_map(|g| (0..g.count).map(move |_| (g.gpus_per_node, g.gpu_type.as_deref()))).collect()
    }

    /// The same mix of node groups with `nodes` nodes in all (largest
    /// remainder rounding; a group with a share keeps at least one node
    /// when there are enough nodes). Used by the fleet-size search.
    pub fn scaled(&self, nodes: u32) -> Fleet {
        let total = self.nodes().max(1);
        let mut counts: Vec<(u32, f64, usize)> = self
            .groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let exact = f64::from(g.count) * f64::from(nodes) / f64::from(total);
                (exact.floor() as u32, exact - exact.floor(), i)
            })
            .collect();
        let mut left = nodes - counts.iter().map(|c| c.0).sum::<u32>();
        let mut order: Vec<usize> = (0..counts.len()).collect();
        order.sort_by(|&a, &b| counts[b].1.total_cmp(&counts[a].1).then(a.cmp(&b)));
        for i in order {
            if left == 0 {
                break;
            }
            counts[i].0 += 1;
            left -= 1;
        }
        Fleet {
            groups: self
                .groups
                .iter()
                .zip(counts)
                .map(|(g, (c, _, _))| NodeGroup { count: c, ..g.clone() })
                .filter(|g| g.count > 0)
                .collect(),
        }
    }

    /// This fleet's nodes, then `other`'s.
    pub fn concat(&self, other: &Fleet) -> Fleet {
        Fleet { groups: self.groups.iter().chain(&other.groups).cloned().collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_keeps_the_mix() {
        let f = Fleet {
            groups: vec![
                NodeGroup { count: 6, gpus_per_node: 8, gpu_type: Some("a100".into()) },
                NodeGroup { count: 2, gpus_per_node: 4, gpu_type: Some("l4".into()) },
            ],
        };
        assert_eq!((f.nodes(), f.gpus()), (8, 56));
        let s = f.scaled(4);
        assert_eq!(s.groups.iter().map(|g| g.count).collect::<Vec<_>>(), [3, 1]);
        assert_eq!(f.scaled(1).nodes(), 1);
        assert_eq!(f.node_list()[7], (4, Some("l4")));
    }
}
