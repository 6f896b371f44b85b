//! Who may use the class QOS. With `AccountingStorageEnforce=qos` (which
//! the render sets) Slurm refuses every job whose QOS is not in its
//! association's QOS list — "Invalid qos specification", measured on 22.05 —
//! so creating the class QOS is not enough: the associations must list them.
//! The render adds them to the root account's association, which every
//! association without a list of its own inherits; `--against-live` also
//! names the associations that keep their own list and lack them.

use super::qos::QosSpec;
use crate::policy::FLEXIBLE_CAP_QOS;

/// The QOS jobs are given (the class QOS; not the flexible partition's
/// cap, which Slurm applies as a partition QOS without any grant).
pub fn job_qos<'a>(all: impl Iterator<Item = &'a QosSpec>) -> Vec<String> {
    all.map(|q| q.name.clone()).filter(|n| n != FLEXIBLE_CAP_QOS).collect()
}

/// An association, as `sacctmgr show assoc` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Association {
    pub account: String,
    /// `None`: the account's own association.
    pub user: Option<String>,
}

impl Association {
    pub fn root() -> Association {
        Association { account: "root".into(), user: None }
    }

    fn is_root(&self) -> bool {
        self.account == "root" && self.user.is_none()
    }

    fn describe(&self) -> String {
        match &self.user {
            Some(u) => format!("user {u} in account {}", self.account),
            None => format!("account {}", self.account),
        }
    }
}

/// QOS to add to one association's list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub to: Association,
    pub qos: Vec<String>,
}

impl Grant {
    /// `sacctmgr -i modify ... set qos+=...`: adds, never replaces, the
    /// site's own QOS stay in the list.
    pub fn command(&self) -> Vec<String> {
        let mut argv: Vec<String> = ["sacctmgr", "-i", "modify"].map(String::from).to_vec();
        // An account's own association is `account where name=`: `where
        // account=` would match every user in it instead.
        match &self.to.user {
            Some(u) => argv.extend([
                "user".into(),
                "where".into(),
                format!("name={u}"),
                format!("account={}", self.to.account),
            ]),
            None => argv.extend(["account".into(), "where".into(), format!("name={}", self.to.account)]),
        }
        argv.extend(["set".into(), format!("qos+={}", self.qos.join(","))]);
        argv
    }

    /// The command for a person, under a comment saying why.
    pub fn text(&self) -> String {
        format!("# {}\n{}\n", self.why(), super::qos::shell_line(&self.command()))
    }

    pub fn why(&self) -> String {
        if self.to.is_root() {
            format!(
                "with AccountingStorageEnforce=qos Slurm refuses a job whose QOS its association does not list: \
                 lets every association that inherits root's list use {}",
                self.qos.join(", ")
            )
        } else {
            format!(
                "{} has a QOS list of its own without {}: its jobs in those classes would be refused",
                self.to.describe(),
                self.qos.join(", ")
            )
        }
    }
}

/// An association and its QOS list as `sacctmgr show assoc` prints it
/// (inherited QOS included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveAssociation {
    pub assoc: Association,
    pub qos: Vec<String>,
}

/// The grants that let every association use `wanted`: the root account's
/// when it lacks some (the associations that inherit follow it, and those
/// with a list of their own show up on the next run), else each
/// association that lacks some.
pub fn grants(wanted: &[String], live: &[LiveAssociation]) -> Vec<Grant> {
    let missing = |a: &LiveAssociation| -> Vec<String> {
        wanted.iter().filter(|w| !a.qos.iter().any(|q| q.eq_ignore_ascii_case(w))).cloned().collect()
    };
    let root = live.iter().find(|a| a.assoc.is_root());
    match root.map(missing) {
        Some(m) if !m.is_empty() => vec![Grant { to: Association::root(), qos: m }],
        // A cluster without a root association is not one sacctmgr made;
        // grant at the root all the same, it is where Slurm looks last.
        None if !wanted.is_empty() => vec![Grant { to: Association::root(), qos: wanted.to_vec() }],
        _ => live
            .iter()
            .filter(|a| !a.assoc.is_root())
            .filter_map(|a| {
                let m = missing(a);
                (!m.is_empty()).then(|| Grant { to: a.assoc.clone(), qos: m })
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(account: &str, user: Option<&str>, qos: &str) -> LiveAssociation {
        LiveAssociation {
            assoc: Association { account: account.into(), user: user.map(str::to_string) },
            qos: qos.split(',').filter(|q| !q.is_empty()).map(str::to_string).collect(),
        }
    }

    fn wanted() -> Vec<String> {
        vec!["op-training".into(), "op-agents".into()]
    }

    #[test]
    fn a_root_without_the_class_qos_gets_them_and_nobody_else_is_named() {
        let g = grants(&wanted(), &[live("root", None, "normal"), live("research", Some("ann"), "normal")]);
        assert_eq!(g, vec![Grant { to: Association::root(), qos: wanted() }]);
        assert_eq!(
            g[0].command().join(" "),
            "sacctmgr -i modify account where name=root set qos+=op-training,op-agents"
        );
    }

    #[test]
    fn only_the_missing_qos_are_added() {
        let g = grants(&wanted(), &[live("root", None, "normal,op-agents")]);
        assert_eq!(g[0].qos, ["op-training"]);
    }

    #[test]
    fn once_root_has_them_an_association_with_its_own_list_is_named() {
        let g = grants(
            &wanted(),
            &[
                live("root", None, "normal,op-training,op-agents"),
                live("research", None, "normal,op-training,op-agents"),
                live("research", Some("ann"), "normal,op-training,op-agents"),
                live("physics", Some("bob"), "physics-qos,OP-TRAINING"),
            ],
        );
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].to, Association { account: "physics".into(), user: Some("bob".into()) });
        assert_eq!(g[0].qos, ["op-agents"]);
        assert_eq!(
            g[0].command().join(" "),
            "sacctmgr -i modify user where name=bob account=physics set qos+=op-agents"
        );
        assert!(g[0].why().contains("user bob in account physics"), "{}", g[0].why());
    }

    #[test]
    fn an_account_association_is_modified_by_its_name() {
        let g = Grant { to: Association { account: "physics".into(), user: None }, qos: vec!["op-agents".into()] };
        assert_eq!(g.command().join(" "), "sacctmgr -i modify account where name=physics set qos+=op-agents");
    }

    #[test]
    fn nothing_to_grant_when_every_association_lists_them() {
        assert!(grants(&wanted(), &[live("root", None, "op-agents,op-training")]).is_empty());
        assert!(grants(&[], &[]).is_empty());
    }

    #[test]
    fn no_root_association_still_grants_at_the_root() {
        assert_eq!(grants(&wanted(), &[])[0].to, Association::root());
    }
}
