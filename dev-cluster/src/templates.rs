//! The config samples in etc/dev-cluster, compiled in so the launcher always
//! renders exactly what the repository ships (no drifting copies).

pub const SLURM_CONF: &str = include_str!("../../etc/dev-cluster/slurm.conf.in");
pub const SLURMDBD_CONF: &str = include_str!("../../etc/dev-cluster/slurmdbd.conf.in");
pub const GRES_CONF: &str = include_str!("../../etc/dev-cluster/gres.conf.in");
pub const PLUGSTACK_CONF: &str = include_str!("../../etc/dev-cluster/plugstack.conf.in");
pub const PACKAGES: &str = include_str!("../../etc/dev-cluster/packages.txt");
/// The sample policy; the dev cluster runs on it unless `up --policy` names another.
pub const POLICY: &str = include_str!("../../etc/onepool.toml");
/// The dev cluster's stand-in for a site's own job_submit plugin.
pub const JOB_SUBMIT_LUA: &str = include_str!("../../etc/dev-cluster/job_submit.lua");

/// Replaces every `@KEY@` with its value; an unknown placeholder is an error
/// so a template and the launcher can't silently disagree.
pub fn render(template: &str, vars: &[(&str, String)]) -> Result<String, String> {
    let mut out = String::with_capacity(template.len() + 256);
    let mut rest = template;
    while let Some(start) = rest.find('@') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let Some(end) = after.find('@') else {
            out.push_str(&rest[start..]);
            rest = "";
            break;
        };
        let key = &after[..end];
        let is_key = !key.is_empty() && key.chars().all(|c| c.is_ascii_uppercase() || c == '_');
        if !is_key {
            out.push('@');
            rest = after;
            continue;
        }
        match vars.iter().find(|(k, _)| *k == key) {
            Some((_, v)) => out.push_str(v),
            None => return Err(format!("template placeholder @{key}@ has no value")),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Package names from packages.txt (comments and blank lines dropped).
pub fn packages() -> Vec<&'static str> {
    PACKAGES.lines().map(|l| l.split('#').next().unwrap_or("").trim()).filter(|l| !l.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_placeholders_and_refuses_unknown_ones() {
        let v = [("A", "1".to_string()), ("B_C", "x".into())];
        assert_eq!(render("a=@A@ b=@B_C@ mail@host", &v).unwrap(), "a=1 b=x mail@host");
        assert!(render("@NOPE@", &v).unwrap_err().contains("@NOPE@"));
    }

    #[test]
    fn shipped_templates_have_no_unknown_placeholders() {
        let keys = [
            "DIR",
            "CLUSTER",
            "CTLD_PORT",
            "DBD_PORT",
            "DB_PORT",
            "DB_PASSWORD",
            "MUNGE_SOCKET",
            "NODES",
            "PARTITION",
            "SLURM_PLUGIN_DIR",
            "GPU_LINES",
        ];
        let vars: Vec<(&str, String)> = keys.iter().map(|k| (*k, String::new())).collect();
        for t in [SLURM_CONF, SLURMDBD_CONF, GRES_CONF, PLUGSTACK_CONF] {
            render(t, &vars).unwrap();
        }
    }

    #[test]
    fn package_list_has_the_daemons() {
        let p = packages();
        for needed in ["slurmctld", "slurmd", "slurmdbd", "munge", "mariadb-server", "libclang-dev"] {
            assert!(p.contains(&needed), "{needed} missing from packages.txt");
        }
    }
}
