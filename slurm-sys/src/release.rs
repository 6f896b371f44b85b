//! Which Slurm release a plugin was built for, against the one that loads it.

use crate::{host, SLURM_VERSION_NUMBER};

/// libslurm's API number of the release this plugin was built against
/// (`libslurm.so.N` beside its headers), when the build found it.
fn built_api() -> Option<u32> {
    env!("SLURM_SYS_API").parse().ok()
}

/// Releases by libslurm API number, as measured on Debian's packages.
fn release_of(api: u32) -> String {
    match api {
        38 => "22.05".into(),
        42 => "24.11".into(),
        45 => "26.05".into(),
        n => format!("of libslurm API {n}"),
    }
}

fn show(v: u32) -> String {
    format!("{}.{:02}.{}", v >> 16, (v >> 8) & 0xff, v & 0xff)
}

/// The line an admin reads when the plugin meets another release (another
/// libslurm API), or `None` when the releases agree. Slurm itself then
/// refuses the plugin (plugin_version), with a line that says less.
pub fn mismatch(plugin_type: &str, built: u32, built_api: u32, host_api: u32) -> Option<String> {
    (built_api != host_api).then(|| {
        format!(
            "{plugin_type}: this onepool plugin was built for Slurm {} but is loaded by Slurm {}, which will refuse it; \
             rebuild it against this release's headers (SLURM_INCLUDE_DIR=<folder holding slurm/slurm.h> \
             cargo build --release -p onepool-priority-plugin -p onepool-spank-plugin) and install the new .so",
            show(built),
            release_of(host_api)
        )
    })
}

/// Logs [`mismatch`] through the host's logger; silent in a process that
/// is not Slurm (no `slurm_api_version` to ask) or when the build did not
/// find libslurm's API number.
pub fn check_host(plugin_type: &str) {
    let (Some(api_version), Some(built)) = (host::slurm_api_version(), built_api()) else { return };
    // SAFETY: `long slurm_api_version(void)` has no preconditions; it
    // returns the API number in bits 16 and up.
    let host = (unsafe { api_version() } >> 16) as u32;
    if let Some(line) = mismatch(plugin_type, SLURM_VERSION_NUMBER, built, host) {
        crate::log::error(&line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_release_is_named_with_what_to_do() {
        assert_eq!(mismatch("job_submit/onepool", 0x16_05_08, 38, 38), None);
        let line = mismatch("job_submit/onepool", 0x16_05_08, 38, 42).unwrap();
        assert!(
            line.starts_with(
                "job_submit/onepool: this onepool plugin was built for Slurm 22.05.8 but is loaded by Slurm 24.11, which will refuse it"
            ),
            "{line}"
        );
        assert!(line.contains("SLURM_INCLUDE_DIR="), "{line}");
        let line = mismatch("spank", 0x1a_05_05, 45, 43).unwrap();
        assert!(line.contains("built for Slurm 26.05.5 but is loaded by Slurm of libslurm API 43"), "{line}");
    }

    /// The headers this crate was built against sit beside their libslurm.
    #[test]
    fn the_build_found_libslurm_s_api_number() {
        assert!(built_api().is_some_and(|n| n >= 38), "{:?}", env!("SLURM_SYS_API"));
    }

    #[test]
    fn outside_slurm_there_is_nothing_to_check() {
        check_host("job_submit/onepool");
    }
}
