//! Parsers for the text `sacctmgr` and `scontrol` print.

use std::time::Duration;

use super::{LiveConfig, LivePartition, LiveQos};
use crate::duration;
use crate::render::conf::list_items;
use crate::render::grant::{Association, LiveAssociation};

/// A line of command output that does not read as expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{command}` output, line {line}: {message}: {text:?}")]
pub struct ParseError {
    pub command: String,
    pub line: usize,
    pub message: String,
    pub text: String,
}

const QOS_FIELDS: usize = 9;

/// Output of [`super::SHOW_QOS`]: `Name|Priority|Preempt|PreemptMode|
/// GraceTime|GrpTRES|MaxTRESPerJob|Flags|MaxWall`, one QOS a line.
pub fn parse_sacctmgr_qos(text: &str) -> Result<Vec<LiveQos>, ParseError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let err = |message: String| ParseError {
            command: super::SHOW_QOS.join(" "),
            line: n + 1,
            message,
            text: line.to_string(),
        };
        let mut fields: Vec<&str> = line.split('|').map(str::trim).collect();
        // `-p` (rather than `-P`) ends every line with a '|'.
        if fields.len() == QOS_FIELDS + 1 && fields[QOS_FIELDS].is_empty() {
            fields.pop();
        }
        let [name, priority, preempt, mode, grace, grp, max, flags, max_wall] = fields[..] else {
            return Err(err(format!(
                "expected {QOS_FIELDS} '|'-separated fields (Name,Priority,Preempt,PreemptMode,GraceTime,GrpTRES,MaxTRESPerJob,Flags,MaxWall), found {}",
                fields.len()
            )));
        };
        if name.is_empty() {
            return Err(err("the QOS name is empty".into()));
        }
        let priority = if priority.is_empty() {
            0
        } else {
            priority.parse().map_err(|_| err(format!("Priority {priority:?} is not a whole number")))?
        };
        let grace_time = if grace.is_empty() {
            Duration::ZERO
        } else {
            duration::parse(grace).map_err(|e| err(format!("GraceTime: {e}")))?
        };
        out.push(LiveQos {
            name: name.to_string(),
            priority,
            preempt: owned(list_items(preempt)),
            preempt_mode: if mode.is_empty() { "cluster".to_string() } else { mode.to_ascii_lowercase() },
            grace_time,
            grp_tres: tres_list(grp).map_err(|m| err(format!("GrpTRES: {m}")))?,
            max_tres_per_job: tres_list(max).map_err(|m| err(format!("MaxTRESPerJob: {m}")))?,
            flags: owned(list_items(flags)),
            max_wall: if max_wall.is_empty() {
                None
            } else {
                Some(duration::parse(max_wall).map_err(|e| err(format!("MaxWall: {e}")))?)
            },
        });
    }
    Ok(out)
}

fn owned(items: Vec<&str>) -> Vec<String> {
    items.into_iter().map(str::to_string).collect()
}

/// `cpu=4,gres/gpu=8` → pairs.
fn tres_list(s: &str) -> Result<Vec<(String, String)>, String> {
    list_items(s)
        .into_iter()
        .map(|item| match item.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(format!("{item:?} is not TRES=LIMIT")),
        })
        .collect()
}

/// Output of [`super::SHOW_CONFIG`]: `Key = value` lines; the header, the
/// section titles and anything else without a one-word key are skipped.
/// When a key repeats (plugin sections), the first value is kept.
pub fn parse_scontrol_config(text: &str) -> LiveConfig {
    let mut config = LiveConfig::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            continue;
        }
        config.values.entry(key.to_string()).or_insert_with(|| value.trim().to_string());
    }
    config
}

/// Output of [`super::SHOW_PARTITIONS`]: `Key=Value` words, one partition a line.
pub fn parse_scontrol_partitions(text: &str) -> Result<Vec<LivePartition>, ParseError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let words: Vec<(&str, &str)> = line.split_whitespace().filter_map(|w| w.split_once('=')).collect();
        let get = |key: &str| words.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v.to_string());
        let Some(name) = get("PartitionName") else {
            return Err(ParseError {
                command: super::SHOW_PARTITIONS.join(" "),
                line: n + 1,
                message: "no PartitionName= on the line".into(),
                text: line.to_string(),
            });
        };
        out.push(LivePartition {
            name,
            nodes: get("Nodes").filter(|v| !v.is_empty() && v != "(null)"),
            qos: get("QoS").filter(|v| !v.is_empty() && v != "N/A" && v != "(null)"),
            allow_qos: get("AllowQos").and_then(|v| allow_list(&v)),
        });
    }
    Ok(out)
}

/// Output of [`super::SHOW_ASSOC`]: `Account|User|QOS`, one association a
/// line (an empty user: the account's own).
pub fn parse_sacctmgr_assoc(text: &str) -> Result<Vec<LiveAssociation>, ParseError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split('|').map(str::trim).collect();
        let [account, user, qos] = fields[..] else {
            return Err(ParseError {
                command: super::SHOW_ASSOC.join(" "),
                line: n + 1,
                message: format!("expected 3 fields (Account|User|QOS), found {}", fields.len()),
                text: line.to_string(),
            });
        };
        out.push(LiveAssociation {
            assoc: Association { account: account.to_string(), user: (!user.is_empty()).then(|| user.to_string()) },
            qos: owned(list_items(qos)),
        });
    }
    Ok(out)
}

/// An `AllowQos` value: `None` for `ALL` (or unset), else the names.
pub fn allow_list(value: &str) -> Option<Vec<String>> {
    let items = list_items(value);
    if items.is_empty() || items.iter().any(|i| i.eq_ignore_ascii_case("ALL")) {
        None
    } else {
        Some(owned(items))
    }
}

/// How [`super::SHOW_QOS`] prints a QOS that has exactly `q`'s settings:
/// the inverse of [`parse_sacctmgr_qos`], for tests and tools that stand in
/// for a cluster already configured by the policy.
pub fn sacctmgr_line(q: &crate::render::QosSpec) -> String {
    use crate::render::slurm_time;
    let gpus = |n: Option<u32>| n.map(|n| format!("gres/gpu={n}")).unwrap_or_default();
    format!(
        "{}|{}|{}|{}|{}|{}|{}|{}|{}",
        q.name,
        q.priority,
        q.preempt.join(","),
        q.preempt_mode.map_or("cluster", |m| m.as_str()),
        slurm_time(q.grace_time),
        gpus(q.grp_gpus),
        gpus(q.max_gpus_per_job),
        if q.deny_on_limit { "DenyOnLimit" } else { "" },
        q.max_wall.map(slurm_time).unwrap_or_default()
    )
}
