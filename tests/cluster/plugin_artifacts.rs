//! The built plugins, as Slurm will see them: identity symbols, entry
//! points, and no Slurm symbol the loader must resolve up front.

use std::ffi::CString;
use std::process::Command;

use onepool_tests::build_dir;

fn dynamic_symbols(file: &str, extra: &[&str]) -> String {
    let path = build_dir().join(file);
    assert!(path.exists(), "{} missing: run `cargo build --workspace` first", path.display());
    let out = Command::new("nm").arg("-D").args(extra).arg(&path).output().expect("nm");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn defines(symbols: &str, name: &str) -> bool {
    symbols.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() == 3 && f[2] == name && f[1] != "U"
    })
}

fn installed_version_number() -> u32 {
    let h = std::fs::read_to_string("/usr/include/slurm/slurm_version.h").expect("slurm_version.h");
    let line = h.lines().find(|l| l.starts_with("#define SLURM_VERSION_NUMBER")).unwrap();
    u32::from_str_radix(line.split_whitespace().nth(2).unwrap().trim_start_matches("0x"), 16).unwrap()
}

/// dlopen in this process, which has no Slurm library at all: proves the
/// plugin needs nothing of Slurm at load time, and reads plugin_version.
fn loaded_identity(file: &str) -> (String, u32) {
    let path = CString::new(build_dir().join(file).to_str().unwrap()).unwrap();
    // SAFETY: dlopen of our own plugin (its load-time constructor only logs),
    // and reads of the two symbols it exports with these C types.
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null(), "dlopen {file} failed: {:?}", std::ffi::CStr::from_ptr(libc::dlerror()));
        let ty = libc::dlsym(h, c"plugin_type".as_ptr()) as *const i8;
        let ver = libc::dlsym(h, c"plugin_version".as_ptr()) as *const u32;
        assert!(!ty.is_null() && !ver.is_null());
        // plugin_type is an array: the symbol's address is the string itself.
        let out = (std::ffi::CStr::from_ptr(ty).to_string_lossy().into_owned(), *ver);
        libc::dlclose(h);
        out
    }
}

#[test]
fn job_submit_plugin_exports_its_api() {
    let syms = dynamic_symbols("libjob_submit_onepool.so", &[]);
    for s in ["plugin_name", "plugin_type", "plugin_version", "init", "fini", "job_submit", "job_modify"] {
        assert!(defines(&syms, s), "{s} not exported:\n{syms}");
    }
    assert_eq!(
        loaded_identity("libjob_submit_onepool.so"),
        ("job_submit/onepool".to_string(), installed_version_number())
    );
}

#[test]
fn spank_plugin_exports_its_api() {
    let syms = dynamic_symbols("libspank_onepool.so", &[]);
    for s in [
        "plugin_name",
        "plugin_type",
        "plugin_version",
        "slurm_spank_init",
        "slurm_spank_init_post_opt",
        "slurm_spank_user_init",
    ] {
        assert!(defines(&syms, s), "{s} not exported:\n{syms}");
    }
    assert_eq!(loaded_identity("libspank_onepool.so"), ("spank".to_string(), installed_version_number()));
}

#[test]
fn plugins_leave_no_slurm_symbol_for_the_loader() {
    for file in ["libjob_submit_onepool.so", "libspank_onepool.so"] {
        let undefined = dynamic_symbols(file, &["--undefined-only"]);
        let slurm: Vec<&str> = undefined.lines().filter(|l| l.contains("slurm") || l.contains("spank")).collect();
        assert!(slurm.is_empty(), "{file} needs Slurm symbols at load time: {slurm:?}");
        let ldd = Command::new("ldd").arg(build_dir().join(file)).output().unwrap();
        assert!(!String::from_utf8_lossy(&ldd.stdout).contains("libslurm"), "{file} links a Slurm library");
    }
}
