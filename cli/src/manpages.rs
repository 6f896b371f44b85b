//! `onepool man DIR` (hidden): the manual pages the packages install,
//! made from what cannot drift from them: onepool(1) and a page per
//! subcommand from the clap definitions the command parses with, and
//! onepool.toml(5) from the commented sample policy that `onepool policy
//! check` is tested against. onepoold(8) and onepoold.toml(5) are
//! onepoold's own (`onepoold --man DIR`).

use std::path::Path;

use anyhow::Context;

/// The sample policy, the reference the page quotes.
const SAMPLE_POLICY: &str = include_str!("../../etc/onepool.toml");

/// `cmd`: the `onepool` command line, whose pages these are.
pub fn write_all(dir: &Path, cmd: clap::Command) -> anyhow::Result<()> {
    let man1 = dir.join("man1");
    let man5 = dir.join("man5");
    for d in [&man1, &man5] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let cmd = cmd.version(env!("CARGO_PKG_VERSION"));
    clap_mangen::generate_to(cmd, &man1).with_context(|| format!("writing the pages in {}", man1.display()))?;
    let page = onepool_decisions::manpage::config_page(
        "onepool.toml",
        "the onepool policy: the GPU pool's classes and who may use them",
        "/etc/slurm/onepool.toml",
        "The policy names the pool's partitions and GPUs, and its classes: each protected (capacity that is \
         lent but never lost) or flexible (a rank and a reclaim mode: immediate, graceful or requeue), with its QOS \
         and the accounts, users and groups entitled to it. job_submit/onepool reads it at every reconfigure; \
         onepool policy check lints it (every problem as FILE:LINE:COL); onepool policy render prints the sacctmgr \
         commands and slurm.conf lines with which Slurm enforces it. The sample below, installed as the file itself, \
         is the reference: every key with its default and why it exists.",
        SAMPLE_POLICY,
        "onepool(1), onepoold.toml(5), slurm.conf(5), sacctmgr(1)",
    );
    let path = man5.join("onepool.toml.5");
    std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_page_is_written_and_names_its_command() {
        let dir = std::env::temp_dir().join(format!("onepool-man-{}", std::process::id()));
        write_all(&dir, crate::Cli::command()).unwrap();
        let read = |p: &str| std::fs::read_to_string(dir.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        let top = read("man1/onepool.1");
        assert!(
            top.starts_with(".ie \\n(.g .ds Aq") || top.contains(".TH onepool 1"),
            "{}",
            &top[..200.min(top.len())]
        );
        for sub in ["policy", "report", "doctor", "status", "replica", "simulate", "retry", "gpus"] {
            let page = read(&format!("man1/onepool-{sub}.1"));
            assert!(page.contains(&format!(".TH onepool-{sub} 1")), "onepool-{sub}.1");
        }
        assert!(read("man1/onepool-report.1").contains("\\-\\-from"));
        let policy = read("man5/onepool.toml.5");
        assert!(policy.starts_with(".TH \"ONEPOOL.TOML\" 5"), "{policy}");
        // The sample is quoted whole, its keys included.
        assert!(policy.contains("min_runtime_before_reclaim"), "{policy}");
        assert!(!policy.lines().any(|l| l.starts_with('.')
            && !l.starts_with(".TH")
            && !l.starts_with(".SH")
            && !matches!(l, ".nf" | ".fi")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
