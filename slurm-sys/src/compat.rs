//! Fields that moved between Slurm releases, behind one accessor each, so
//! the plugin crates stay free of release cfgs (which only this crate's
//! build script knows). Each difference was measured by diffing slurm.h of
//! Debian's 22.05.8 (bookworm), 24.11.5 (trixie) and 26.05.5 (sid); see
//! docs/slurm-releases.md.

use crate::bindings::{job_desc_msg_t, submit_response_msg_t, update_node_msg_t};

/// The numeric job id of a job description (NO_VAL on submission and in
/// `scontrol update` by name).
///
/// 26.05: `job_desc_msg_t` has no `uint32_t job_id`; the id lives in its
/// `slurm_step_id_t step_id` (next to the new `sluid`).
pub fn job_desc_job_id(d: &job_desc_msg_t) -> u32 {
    #[cfg(slurm_ge_26_05)]
    {
        d.step_id.job_id
    }
    #[cfg(not(slurm_ge_26_05))]
    {
        d.job_id
    }
}

/// The job id in `slurm_submit_batch_job`'s answer.
///
/// 26.05: `submit_response_msg_t` replaced `uint32_t job_id, step_id` with
/// one `slurm_step_id_t step_id`.
pub fn submit_response_job_id(r: &submit_response_msg_t) -> u32 {
    #[cfg(slurm_ge_26_05)]
    {
        r.step_id.job_id
    }
    #[cfg(not(slurm_ge_26_05))]
    {
        r.job_id
    }
}

/// Records who sets a node's reason, where the message carries it.
///
/// 26.05: `update_node_msg_t` has no `reason_uid` (22.05 and 24.11 do);
/// slurmctld takes the reason's user from the request's credential, so
/// there is nothing to set.
pub fn set_update_node_reason_uid(msg: &mut update_node_msg_t, uid: u32) {
    #[cfg(slurm_ge_26_05)]
    {
        let _ = (msg, uid);
    }
    #[cfg(not(slurm_ge_26_05))]
    {
        msg.reason_uid = uid;
    }
}

/// Whether this release may start a single-node job that asks GPUs per job
/// (`--gpus=N -N1`) with fewer GPUs than it asked, on a node where other
/// jobs hold some. Measured on 26.05.5 (`AllocTRES gres/gpu=3` for
/// `--gpus=4`, no preemption); 22.05.8 and 24.11.5 wait or preempt.
/// job_submit/onepool then asks the same GPUs per node, which 26.05 counts
/// right (tests/cluster/admission.rs fails without it).
pub const GPUS_PER_JOB_SHORT_ON_ONE_NODE: bool = cfg!(slurm_ge_26_05);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_read_where_this_release_keeps_them() {
        // bindgen's Default: all-zero, a valid value of plain C data.
        let mut d = job_desc_msg_t::default();
        let mut r = submit_response_msg_t::default();
        #[cfg(slurm_ge_26_05)]
        {
            d.step_id.job_id = 42;
            r.step_id.job_id = 43;
        }
        #[cfg(not(slurm_ge_26_05))]
        {
            d.job_id = 42;
            r.job_id = 43;
        }
        assert_eq!(job_desc_job_id(&d), 42);
        assert_eq!(submit_response_job_id(&r), 43);
    }

    #[test]
    fn reason_uid_is_set_where_the_message_has_it() {
        let mut m = update_node_msg_t::default();
        set_update_node_reason_uid(&mut m, 7);
        #[cfg(not(slurm_ge_26_05))]
        assert_eq!(m.reason_uid, 7);
    }
}
