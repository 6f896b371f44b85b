//! Generates bindings over the Slurm headers installed on this machine.
//!
//! Only types and constants are bound: no Slurm function is declared to the
//! linker. Plugins resolve Slurm's functions from the host process at run
//! time (see `src/host.rs`), so a symbol that only some hosts carry can never
//! stop a plugin from loading in the others.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

const HEADERS_PACKAGE: &str = "libslurm-dev";
const LIBCLANG_PACKAGE: &str = "libclang-dev";

fn main() {
    println!("cargo:rerun-if-env-changed=SLURM_INCLUDE_DIR");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-check-cfg=cfg(slurm_22_05)");
    println!("cargo:rustc-check-cfg=cfg(slurm_ge_23_02)");
    println!("cargo:rustc-check-cfg=cfg(slurm_ge_23_11)");
    println!("cargo:rustc-check-cfg=cfg(slurm_ge_24_05)");
    println!("cargo:rustc-check-cfg=cfg(slurm_ge_24_11)");
    println!("cargo:rustc-check-cfg=cfg(slurm_ge_26_05)");

    let include = find_include_dir().unwrap_or_else(|searched| {
        fail(&format!(
            "Slurm headers not found (looked for slurm/slurm.h in: {searched}).\n\
             Install them with `apt-get install {HEADERS_PACKAGE}`, or point \
             SLURM_INCLUDE_DIR at the folder that contains slurm/slurm.h."
        ))
    });
    for h in ["slurm.h", "spank.h", "slurm_errno.h", "slurm_version.h"] {
        println!("cargo:rerun-if-changed={}", include.join("slurm").join(h).display());
    }

    let version = read_version(&include);
    emit_release_cfgs(version);
    println!("cargo:version_number={version}");
    println!("cargo:include={}", include.display());
    println!("cargo:rustc-env=SLURM_SYS_INCLUDE={}", include.display());
    // libslurm's API number (its SONAME, libslurm.so.N) beside the headers:
    // what a running Slurm reports through slurm_api_version(), so that a
    // plugin can tell at load time that it meets another release.
    println!("cargo:rustc-env=SLURM_SYS_API={}", api_number(&include).map(|n| n.to_string()).unwrap_or_default());

    let wrapper = "#include <slurm/slurm.h>\n#include <slurm/slurm_errno.h>\n#include <slurm/spank.h>\n";
    let builder = bindgen::Builder::default()
        .header_contents("onepool_slurm_wrapper.h", wrapper)
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_type("job_desc_msg_t")
        .allowlist_type("update_node_msg_t")
        .allowlist_type("submit_response_msg_t")
        .allowlist_type("spank_t")
        .allowlist_type("spank_option")
        .allowlist_type("spank_item_t")
        .allowlist_type("spank_err_t")
        .allowlist_type("spank_context_t")
        .allowlist_type("spank_opt_cb_f")
        .allowlist_type("slurm_err_t")
        .allowlist_var("SLURM_VERSION_NUMBER")
        .allowlist_var("SLURM_SUCCESS")
        .allowlist_var("SLURM_ERROR")
        .allowlist_var("ESPANK_.*")
        .allowlist_var("NO_VAL.*")
        .allowlist_var("INFINITE.*")
        .allowlist_var("NODE_STATE_.*")
        .allowlist_var("NODE_RESUME")
        .allowlist_var("JOB_SHARED_.*")
        .allowlist_var("SPANK_OPTION_.*")
        .allowlist_var("ESLURM_.*")
        .allowlist_type("slurm_err_t")
        .allowlist_type("spank_item")
        .allowlist_type("spank_context")
        .constified_enum_module("spank_context")
        .constified_enum_module("slurm_err_t")
        .constified_enum_module("spank_item")
        .constified_enum_module("spank_err")
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false);

    // bindgen panics when it cannot load libclang; turn that into the same
    // kind of actionable message as a missing header.
    let generated = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || builder.generate()));
    let bindings = match generated {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => fail(&format!("bindgen could not parse the Slurm headers in {}: {e}", include.display())),
        Err(_) => fail(&format!(
            "bindgen could not load libclang. Install it with \
             `apt-get install {LIBCLANG_PACKAGE}` (or set LIBCLANG_PATH)."
        )),
    };
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings.write_to_file(out.join("bindings.rs")).unwrap_or_else(|e| fail(&format!("cannot write bindings: {e}")));
}

fn fail(msg: &str) -> ! {
    // cargo shows build-script stderr on failure; `error:` lines stand out.
    for line in msg.lines() {
        eprintln!("error: {line}");
    }
    std::process::exit(1);
}

/// SLURM_INCLUDE_DIR, then pkg-config's `slurm` module, then /usr/include.
fn find_include_dir() -> Result<PathBuf, String> {
    let mut candidates = Vec::new();
    if let Ok(dir) = env::var("SLURM_INCLUDE_DIR") {
        candidates.push(PathBuf::from(dir));
    }
    if let Ok(out) = std::process::Command::new("pkg-config").args(["--variable=includedir", "slurm"]).output() {
        if out.status.success() {
            let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !dir.is_empty() {
                candidates.push(PathBuf::from(dir));
            }
        }
    }
    candidates.push(PathBuf::from("/usr/include"));
    candidates.push(PathBuf::from("/usr/local/include"));
    for dir in &candidates {
        if dir.join("slurm").join("slurm.h").is_file() && dir.join("slurm").join("spank.h").is_file() {
            return Ok(dir.clone());
        }
    }
    Err(candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))
}

/// N of `libslurm.so.N` in the library folders next to `include`
/// (`<prefix>/include` -> `<prefix>/lib`, `lib64`, `lib/<multiarch>`).
fn api_number(include: &Path) -> Option<u32> {
    let prefix = include.parent()?;
    let mut dirs = vec![prefix.join("lib"), prefix.join("lib64")];
    if let Ok(entries) = fs::read_dir(prefix.join("lib")) {
        dirs.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    dirs.iter().filter_map(|d| fs::read_dir(d).ok()).flatten().flatten().find_map(|e| {
        let name = e.file_name().into_string().ok()?;
        name.strip_prefix("libslurm.so.")?.parse().ok()
    })
}

fn read_version(include: &Path) -> u32 {
    let path = include.join("slurm").join("slurm_version.h");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", path.display())));
    text.lines()
        .find_map(|l| {
            let rest = l.trim().strip_prefix("#define SLURM_VERSION_NUMBER")?;
            let hex = rest.trim().trim_start_matches("0x");
            u32::from_str_radix(hex, 16).ok()
        })
        .unwrap_or_else(|| fail(&format!("no SLURM_VERSION_NUMBER in {}", path.display())))
}

fn emit_release_cfgs(version: u32) {
    let (major, minor) = (version >> 16, (version >> 8) & 0xff);
    let at_least = |ma: u32, mi: u32| (major, minor) >= (ma, mi);
    if (major, minor) == (22, 5) {
        println!("cargo:rustc-cfg=slurm_22_05");
    }
    if at_least(23, 2) {
        println!("cargo:rustc-cfg=slurm_ge_23_02");
    }
    if at_least(23, 11) {
        println!("cargo:rustc-cfg=slurm_ge_23_11");
    }
    if at_least(24, 5) {
        println!("cargo:rustc-cfg=slurm_ge_24_05");
    }
    if at_least(24, 11) {
        println!("cargo:rustc-cfg=slurm_ge_24_11");
    }
    // 26.05: job_desc_msg_t and submit_response_msg_t carry the job id in a
    // slurm_step_id_t, update_node_msg_t lost reason_uid (see src/compat.rs).
    if at_least(26, 5) {
        println!("cargo:rustc-cfg=slurm_ge_26_05");
    }
    if !at_least(22, 5) {
        println!("cargo:warning=Slurm {major}.{minor} is older than 22.05, the oldest release onepool is tested on");
    }
}
