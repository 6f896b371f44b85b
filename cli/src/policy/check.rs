//! `onepool policy check`: every diagnostic, then one summary line.

use std::process::ExitCode;

use onepool_decisions::policy::{load, Loaded};

use super::source::Source;

pub fn run(src: &Source) -> anyhow::Result<ExitCode> {
    let loaded = load(&src.text);
    for line in loaded.render(&src.name, &src.text) {
        println!("{line}");
    }
    println!("{}", summary(&src.name, &loaded));
    Ok(if loaded.errors().next().is_some() { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// `FILE: 2 errors, 1 warning` or `FILE: ok (5 classes, 16 GPUs, 4 reserved)`.
pub fn summary(name: &str, loaded: &Loaded) -> String {
    let errors = loaded.errors().count();
    let warnings = loaded.diagnostics.len() - errors;
    let warned = if warnings > 0 { format!(", {}", count(warnings, "warning")) } else { String::new() };
    match &loaded.policy {
        Some(p) if errors == 0 => format!(
            "{name}: ok{warned} ({}, {} GPUs, {} reserved)",
            count(p.classes.len(), "class"),
            p.pool.total_gpus,
            p.reserved_gpus()
        ),
        _ => format!("{name}: {}{warned}", count(errors, "error")),
    }
}

fn count(n: usize, what: &str) -> String {
    match (n, what.ends_with('s')) {
        (1, _) => format!("1 {what}"),
        (_, true) => format!("{n} {what}es"),
        _ => format!("{n} {what}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = include_str!("../../../etc/onepool.toml");

    #[test]
    fn summaries() {
        assert_eq!(summary("p.toml", &load(SAMPLE)), "p.toml: ok (5 classes, 16 GPUs, 4 reserved)");
        let warned = SAMPLE.replace("accounts = [], users = [\"onepool\"]", "accounts = [], users = []");
        assert_eq!(summary("p.toml", &load(&warned)), "p.toml: ok, 1 warning (5 classes, 16 GPUs, 4 reserved)");
        let broken = warned.replace("rank = 3", "rank = 2");
        assert_eq!(summary("p.toml", &load(&broken)), "p.toml: 1 error, 1 warning");
        let broken = broken.replace("reclaim = \"immediate\"", "reclaim = \"soon\"");
        assert_eq!(summary("p.toml", &load(&broken)), "p.toml: 2 errors, 1 warning");
        assert_eq!(summary("p.toml", &load("x")), "p.toml: 1 error");
    }
}
