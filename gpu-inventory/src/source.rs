//! The interface every source implements, and choosing one from a setting.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::{FakeSource, GpuDevice, GpuError, NvmlSource};

/// Something that can list the GPUs of this host and who holds them.
pub trait GpuSource {
    /// Every GPU, sorted by minor number, each with its processes. Asks
    /// afresh on every call.
    fn devices(&mut self) -> Result<Vec<GpuDevice>, GpuError>;

    /// Which source this is, for logs and messages (e.g. `nvml (driver
    /// 550.54.15)`).
    fn describe(&self) -> String;
}

/// Which source to use, as written in plugstack.conf or on a command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceSpec {
    /// `nvml`: the NVIDIA driver.
    Nvml,
    /// `fake:/absolute/path`: a fake GPU file (see [`crate::fake`]).
    Fake(PathBuf),
    /// `none`: GPU checks are turned off; [`open`] gives no source.
    None,
}

impl SourceSpec {
    pub fn parse(given: &str) -> Result<SourceSpec, GpuError> {
        let bad = |problem: &str| GpuError::BadSourceSpec { given: given.to_string(), problem: problem.to_string() };
        match given {
            "nvml" => Ok(SourceSpec::Nvml),
            "none" => Ok(SourceSpec::None),
            _ => match given.strip_prefix("fake:") {
                Some("") => Err(bad("`fake:` needs the path of the fake GPU file after the colon")),
                // slurmstepd runs in the job's working directory, so a
                // relative path would be looked up somewhere different for
                // every job.
                Some(path) if !path.starts_with('/') => {
                    Err(bad("the fake GPU file's path must be absolute (start with /)"))
                }
                Some(path) => Ok(SourceSpec::Fake(PathBuf::from(path))),
                None => Err(bad("unknown source")),
            },
        }
    }
}

impl FromStr for SourceSpec {
    type Err = GpuError;

    fn from_str(s: &str) -> Result<SourceSpec, GpuError> {
        SourceSpec::parse(s)
    }
}

/// The setting as it would be written, so that `parse(spec.to_string())`
/// gives `spec` back.
impl fmt::Display for SourceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceSpec::Nvml => f.write_str("nvml"),
            SourceSpec::Fake(path) => write!(f, "fake:{}", path.display()),
            SourceSpec::None => f.write_str("none"),
        }
    }
}

/// Opens the source `spec` names; `None` for `none`, so that "checks are
/// off" is not mistaken for "this node has no GPUs". For `nvml` this loads
/// the driver's library, so on a host without the driver it fails with
/// [`GpuError::NoDriver`]; a fake file is read at each
/// [`GpuSource::devices`] call, not here.
pub fn open(spec: &SourceSpec) -> Result<Option<Box<dyn GpuSource>>, GpuError> {
    Ok(match spec {
        SourceSpec::Nvml => Some(Box::new(NvmlSource::open()?)),
        SourceSpec::Fake(path) => Some(Box::new(FakeSource::new(path.clone()))),
        SourceSpec::None => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(given: &str) -> String {
        SourceSpec::parse(given).unwrap_err().to_string()
    }

    #[test]
    fn the_three_forms_parse_and_print_back() {
        for (given, spec) in [
            ("nvml", SourceSpec::Nvml),
            ("none", SourceSpec::None),
            ("fake:/var/lib/onepool/gpus.txt", SourceSpec::Fake(PathBuf::from("/var/lib/onepool/gpus.txt"))),
        ] {
            assert_eq!(SourceSpec::parse(given).unwrap(), spec);
            assert_eq!(spec.to_string(), given);
            assert_eq!(given.parse::<SourceSpec>().unwrap(), spec);
        }
    }

    #[test]
    fn an_unknown_source_lists_the_accepted_forms() {
        assert_eq!(
            error("NVML"),
            "invalid GPU source `NVML`: unknown source; write `nvml`, `fake:/absolute/path/to/file` or `none`"
        );
        assert_eq!(
            error(""),
            "invalid GPU source ``: unknown source; write `nvml`, `fake:/absolute/path/to/file` or `none`"
        );
        assert_eq!(
            error("fake"),
            "invalid GPU source `fake`: unknown source; write `nvml`, `fake:/absolute/path/to/file` or `none`"
        );
    }

    #[test]
    fn a_fake_source_needs_an_absolute_path() {
        assert_eq!(
            error("fake:"),
            "invalid GPU source `fake:`: `fake:` needs the path of the fake GPU file after the colon; \
             write `nvml`, `fake:/absolute/path/to/file` or `none`"
        );
        assert_eq!(
            error("fake:gpus.txt"),
            "invalid GPU source `fake:gpus.txt`: the fake GPU file's path must be absolute (start with /); \
             write `nvml`, `fake:/absolute/path/to/file` or `none`"
        );
    }

    #[test]
    fn none_opens_no_source_and_fake_opens_without_reading_the_file() {
        assert!(open(&SourceSpec::None).unwrap().is_none());
        let source = open(&SourceSpec::Fake(PathBuf::from("/nonexistent/gpus.txt"))).unwrap().unwrap();
        assert!(source.describe().starts_with("fake:/nonexistent/gpus.txt "), "{}", source.describe());
    }
}
