//! Node updates through slurmctld (`slurm_update_node`), as a process
//! Slurm started (the spank job_script context) can make them.

use std::ffi::{c_int, CString, NulError};

use crate::bindings::update_node_msg_t;
use crate::{host, NODE_STATE_DRAIN};

/// Why a node was not drained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateNodeError {
    /// The process does not export `slurm_init_update_node_msg` and
    /// `slurm_update_node`.
    Unavailable,
    /// The node name holds a NUL.
    NodeName(NulError),
    /// `slurm_update_node` answered this.
    Failed(c_int),
}

impl std::fmt::Display for UpdateNodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpdateNodeError::Unavailable => f.write_str("this process cannot update nodes (no slurm_update_node)"),
            UpdateNodeError::NodeName(e) => write!(f, "{e}"),
            UpdateNodeError::Failed(rc) => write!(f, "slurm_update_node returned {rc}"),
        }
    }
}

impl std::error::Error for UpdateNodeError {}

/// Sets `node` (a node name or hostlist) DRAIN with `reason`, recorded as
/// set by this process's user where the release records it.
pub fn drain(node: &str, reason: &str) -> Result<(), UpdateNodeError> {
    let (Some(init), Some(update)) = (host::slurm_init_update_node_msg(), host::slurm_update_node()) else {
        return Err(UpdateNodeError::Unavailable);
    };
    host::ensure_api_ready();
    let names = CString::new(node).map_err(UpdateNodeError::NodeName)?;
    let why = crate::log::to_cstring_lossy(reason);
    let mut msg = update_node_msg_t::default();
    // SAFETY: Slurm initialises the message it is given.
    unsafe { init(&mut msg) };
    msg.node_names = names.as_ptr().cast_mut();
    msg.node_state = NODE_STATE_DRAIN;
    msg.reason = why.as_ptr().cast_mut();
    crate::compat::set_update_node_reason_uid(&mut msg, crate::os::getuid());
    // SAFETY: an initialised message whose strings outlive the call and
    // are not freed by slurm_update_node.
    let rc = unsafe { update(&mut msg) };
    if rc == 0 {
        Ok(())
    } else {
        Err(UpdateNodeError::Failed(rc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_slurm_no_node_is_updated() {
        let e = drain("node1", "why").unwrap_err();
        assert_eq!(e.to_string(), "this process cannot update nodes (no slurm_update_node)");
        assert_eq!(UpdateNodeError::Failed(-1).to_string(), "slurm_update_node returned -1");
        let nul = CString::new("a\0b").unwrap_err();
        assert_eq!(UpdateNodeError::NodeName(nul.clone()).to_string(), nul.to_string());
    }
}
