//! `--format json`: the rendered configuration and the changes as data for
//! configuration-management tools (argv lists, no shell quoting).

use onepool_decisions::policy::{Diagnostic, Severity};
use onepool_decisions::render::grant::Grant;
use onepool_decisions::render::live::{AccessChange, Changes, ConfChange, PartitionChange, QosChange};
use onepool_decisions::render::{ConfLine, FlexiblePartition, PartitionAccess, QosSpec, Rendered, ServiceAccount};
use serde_json::{json, Map, Value};

/// Which parts to include.
#[derive(Clone, Copy)]
pub struct Parts {
    pub sacctmgr: bool,
    pub slurm_conf: bool,
}

pub fn rendered(policy: &str, r: &Rendered, parts: Parts) -> Value {
    let mut out = Map::new();
    out.insert("policy".into(), json!(policy));
    if parts.sacctmgr {
        out.insert("sacctmgr".into(), json!(r.sacctmgr_commands()));
        out.insert("qos".into(), r.all_qos().map(qos).collect());
        out.insert("site_qos".into(), r.site_qos.iter().map(|s| json!({"class": s.class, "qos": s.qos})).collect());
        out.insert("grants".into(), json!([grant(&r.root_grant())]));
        out.insert("service".into(), service(&r.service));
    }
    if parts.slurm_conf {
        out.insert("slurm_conf".into(), r.slurm_conf.iter().map(conf_line).collect());
        out.insert("flexible_partition".into(), r.flexible_partition.as_ref().map_or(Value::Null, partition));
        out.insert("partition_access".into(), r.partition_access.iter().map(access).collect());
    }
    Value::Object(out)
}

pub fn changes(policy: &str, c: &Changes, parts: Parts) -> Value {
    let mut out = Map::new();
    out.insert("policy".into(), json!(policy));
    out.insert("up_to_date".into(), json!(c.is_empty()));
    if parts.sacctmgr {
        out.insert("sacctmgr".into(), json!(c.sacctmgr_commands()));
        out.insert("qos".into(), c.qos.iter().map(qos_change).collect());
        out.insert("grants".into(), c.grants.iter().map(grant).collect());
        out.insert("service".into(), c.service.as_ref().map_or(Value::Null, service));
    }
    if parts.slurm_conf {
        out.insert("slurm_conf".into(), c.slurm_conf.iter().map(conf_change).collect());
        out.insert("partition".into(), c.partition.as_ref().map_or(Value::Null, partition_change));
        out.insert("partition_access".into(), c.access.iter().map(access_change).collect());
    }
    out.insert("problems".into(), c.problems.iter().map(problem).collect());
    Value::Object(out)
}

fn grant(g: &Grant) -> Value {
    json!({
        "account": g.to.account,
        "user": g.to.user,
        "qos": g.qos,
        "why": g.why(),
        "command": g.command(),
    })
}

fn service(s: &ServiceAccount) -> Value {
    json!({
        "user": s.user,
        "account": s.account,
        "protected_classes": s.protected_classes,
        "why": s.why(),
        "commands": s.commands(),
    })
}

fn qos(q: &QosSpec) -> Value {
    json!({
        "name": q.name,
        "class": q.class,
        "why": q.why,
        "priority": q.priority,
        "preempt": q.preempt,
        "preempt_mode": q.preempt_mode.map(|m| m.as_str()),
        "grace_time_s": q.grace_time.as_secs(),
        "grp_gpus": q.grp_gpus,
        "max_gpus_per_job": q.max_gpus_per_job,
        "max_wall_s": q.max_wall.map(|d| d.as_secs()),
        "deny_on_limit": q.deny_on_limit,
    })
}

fn conf_line(l: &ConfLine) -> Value {
    json!({"key": l.key, "value": l.value, "why": l.why})
}

fn partition(p: &FlexiblePartition) -> Value {
    json!({"name": p.name, "nodes": p.nodes, "qos": p.qos.name, "allow_qos": p.allow_qos, "line": p.line()})
}

fn access(a: &PartitionAccess) -> Value {
    json!({"name": a.name, "allow_qos": a.allow_qos, "why": a.why, "command": a.scontrol_command()})
}

fn access_change(c: &AccessChange) -> Value {
    let mut v = access(&c.want);
    v["live_allow_qos"] = json!(c.live);
    v
}

fn qos_change(c: &QosChange) -> Value {
    let action = match c {
        QosChange::Add(_) => "add",
        QosChange::Modify { .. } => "modify",
    };
    json!({"action": action, "name": c.name(), "why": c.why(), "command": c.command()})
}

fn conf_change(c: &ConfChange) -> Value {
    json!({"key": c.key, "live": c.live, "value": c.value, "why": c.why})
}

fn partition_change(c: &PartitionChange) -> Value {
    match c {
        PartitionChange::Missing { line, why } => json!({"change": "create", "line": line, "why": why}),
        PartitionChange::WrongQos { name, live_qos, qos } => {
            json!({"change": "set_qos", "name": name, "live_qos": live_qos, "qos": qos})
        }
    }
}

fn problem(d: &Diagnostic) -> Value {
    let severity = match d.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    json!({"severity": severity, "message": d.message, "help": d.help})
}
