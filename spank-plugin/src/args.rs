//! plugstack.conf arguments: `required /path/spank_onepool.so KEY=VALUE...`.

use onepool_decisions::names;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PluginArgs {
    /// Class given to jobs submitted without `--workload` (else the
    /// slurmctld plugin's policy default applies).
    pub default_workload: Option<String>,
}

pub const KNOWN: &str = "default_workload=CLASS";

pub fn parse<'a>(args: impl IntoIterator<Item = &'a str>) -> Result<PluginArgs, Vec<String>> {
    let mut out = PluginArgs::default();
    let mut errors = Vec::new();
    for a in args {
        match a.split_once('=') {
            Some(("default_workload", v)) => match names::check_class(v) {
                Ok(()) => out.default_workload = Some(v.to_string()),
                Err(e) => errors.push(format!("plugstack.conf argument {a:?}: {e}")),
            },
            _ => errors.push(format!("plugstack.conf argument {a:?} is not recognised; known arguments: {KNOWN}")),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_reports_every_bad_argument() {
        assert_eq!(parse(["default_workload=agents"]).unwrap().default_workload.as_deref(), Some("agents"));
        assert_eq!(parse([]).unwrap(), PluginArgs::default());
        let e = parse(["default_workload=Bad", "colour=blue"]).unwrap_err();
        assert_eq!(e.len(), 2);
        assert!(e[0].contains("invalid workload class name \"Bad\""), "{}", e[0]);
        assert!(e[1].contains("\"colour=blue\" is not recognised"), "{}", e[1]);
    }
}
