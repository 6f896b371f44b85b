-- A site's own job_submit plugin, loaded beside job_submit/onepool in the
-- dev cluster (JobSubmitPlugins=lua,onepool) to prove the two coexist.
-- Its one rule: job names starting with "forbidden" are refused.

function slurm_job_submit(job_desc, part_list, submit_uid)
    if job_desc.name ~= nil and string.sub(job_desc.name, 1, 9) == "forbidden" then
        slurm.log_user("site policy: job names starting with 'forbidden' are not allowed")
        return slurm.ERROR
    end
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end

return slurm.SUCCESS
