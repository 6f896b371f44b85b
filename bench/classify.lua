-- The benchmark's Lua equivalent of job_submit/onepool on etc/onepool.toml:
-- what a site would write by hand to get the same classification, routing
-- and refusals (the policy's values copied into tables). Used only by
-- bench/admission.sh, as the "job_submit/lua doing the same work" variant.

local classes = {
    ["critical-training"] = { qos = "op-critical-training", protected = true, accounts = { ["core-ml"] = true },
                              users = {}, max_gpus = 8, time_required = true, max_time = 7 * 24 * 60 },
    ["inference-baseline"] = { qos = "op-inference-baseline", protected = true, accounts = {},
                               users = { root = true }, max_gpus = 4, default_time = 30 * 24 * 60 },
    training = { qos = "op-training", max_gpus = 12, default_time = 24 * 60, reclaim = "requeue", drain = "2m" },
    inference = { qos = "op-inference", max_gpus = 4, default_time = 24 * 60, reclaim = "graceful", drain = "1m" },
    agents = { qos = "op-agents", max_gpus = 4, default_time = 4 * 60, reclaim = "immediate" },
}
local by_qos = {}
for name, c in pairs(classes) do by_qos[c.qos] = name end

local NO_VAL = 4294967294

local function gpus(tres)
    if tres == nil then return 0 end
    local n = string.match(tres, "gpu:[%w_-]*:?(%d+)") or string.match(tres, "gpu=(%d+)")
    return tonumber(n or 0)
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    local workload
    if job_desc.spank_job_env ~= nil then
        -- Slurm fills this table from index 0, which ipairs would skip.
        for _, e in pairs(job_desc.spank_job_env) do
            local k, v = string.match(e, "^([^=]+)=(.*)$")
            if k == "ONEPOOL_WORKLOAD" or k == "SLURM_SPANK_ONEPOOL_WORKLOAD" then workload = v end
        end
    end
    local name = workload or (job_desc.qos and by_qos[job_desc.qos]) or "agents"
    local c = classes[name]
    if c == nil then
        slurm.log_user("onepool: --workload=%s is not a workload class here", name)
        return slurm.ERROR
    end
    if c.protected and submit_uid ~= 0 and not (job_desc.account and c.accounts[job_desc.account]) then
        slurm.log_user("onepool: class %s is protected and uid %d is not entitled to it", name, submit_uid)
        return slurm.ERROR
    end
    local n = gpus(job_desc.tres_per_job)
    if n > c.max_gpus then
        slurm.log_user("onepool: class %s allows at most %d GPUs per job and this job asks for %d", name, c.max_gpus, n)
        return slurm.ERROR
    end
    if job_desc.time_limit == nil or job_desc.time_limit == NO_VAL then
        if c.time_required then
            slurm.log_user("onepool: class %s requires a time limit", name)
            return slurm.ERROR
        end
        job_desc.time_limit = c.default_time
    elseif c.max_time ~= nil and job_desc.time_limit > c.max_time then
        slurm.log_user("onepool: class %s allows a time limit of at most %d minutes", name, c.max_time)
        return slurm.ERROR
    end
    job_desc.qos = c.qos
    local record = "onepool:class=" .. name
    if c.protected then
        record = record .. ";tier=protected"
    else
        job_desc.partition = "gpu-flex"
        record = record .. ";tier=flexible;reclaim=" .. c.reclaim
        if c.drain ~= nil then record = record .. ";drain=" .. c.drain end
    end
    job_desc.admin_comment = record
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end

return slurm.SUCCESS
