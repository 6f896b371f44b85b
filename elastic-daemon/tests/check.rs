//! `onepoold --check` applies every rule the start applies to the files
//! it reads its secrets from (issue #42: it said "fits" for a password
//! file of mode 0644 that the start refused), so that `onepool doctor`'s
//! "fits" means onepoold will start.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("onepoold-check-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn file(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The user running the test: the owner of the files it writes.
fn me() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `onepoold --check --user USER --config DIR/onepoold.toml`: (exit code, stdout).
fn check(d: &Path, user: &str) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_onepoold"))
        .args(["--check", "--user", user, "--config"])
        .arg(d.join("onepoold.toml"))
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn check_refuses_the_secret_files_the_start_would_refuse() {
    let d = dir("secrets");
    let config = format!(
        "control_socket = \"{0}/onepoold.sock\"\nreplica_key_file = \"{0}/replica.key\"\n\n[ha]\nlock = \"mariadb\"\n\
         database = \"db.example:3306\"\nuser = \"onepool\"\npassword_file = \"{0}/ha.password\"\nlock_name = \"site\"\n\n\
         [[endpoint]]\nname = \"chat\"\nlisten = \"127.0.0.1:8000\"\n",
        d.display()
    );
    file(&d.join("onepoold.toml"), &config, 0o644);
    let me = me();

    // The password readable by others: the start refuses it, so must --check.
    file(&d.join("ha.password"), "s3cret\n", 0o644);
    let (code, out) = check(&d, &me);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("password_file") && out.contains("mode 0644") && out.contains("chmod 600"), "{out}");
    assert!(out.contains("onepoold would not start"), "{out}");

    // No replica key yet: the start makes one, so that is no error.
    file(&d.join("ha.password"), "s3cret\n", 0o600);
    let (code, out) = check(&d, &me);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("fits"), "{out}");
    // An endpoint with no replicas' command: its answers continue by text.
    assert!(out.contains("resume: endpoint chat: answers continue on another replica by text"), "{out}");

    // A key others may read, then a short one.
    file(&d.join("replica.key"), &format!("{}\n", "k".repeat(64)), 0o640);
    let (code, out) = check(&d, &me);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("replica_key_file") && out.contains("mode 0640"), "{out}");
    file(&d.join("replica.key"), "short\n", 0o600);
    let (code, out) = check(&d, &me);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("5 characters"), "{out}");
    file(&d.join("replica.key"), &format!("{}\n", "k".repeat(64)), 0o600);
    assert_eq!(check(&d, &me).0, Some(0));

    // Checked for another user, the files are not theirs.
    let (code, out) = check(&d, "nobody");
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("not by onepoold's user"), "{out}");
    let (code, out) = check(&d, "no-such-user-onepool-test");
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("no such user"), "{out}");

    // A CA file without a certificate.
    let with_ca = config.replace("lock_name", &format!("ca_file = \"{}/ca.pem\"\nlock_name", d.display()));
    file(&d.join("onepoold.toml"), &with_ca, 0o644);
    file(&d.join("ca.pem"), "not a certificate\n", 0o644);
    let (code, out) = check(&d, &me);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("ca_file") && out.contains("holds no PEM certificate"), "{out}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Issue #44: `--check` says each endpoint's request classes and the class
/// of the replicas only lower classes ask for, and refuses a key naming a
/// class the policy lacks, at its line.
#[test]
fn check_says_the_request_classes_and_refuses_a_key_s_unknown_class_at_its_line() {
    let d = dir("classes");
    let policy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc/onepool.toml");
    let config = format!(
        "control_socket = \"{0}/onepoold.sock\"\nreplica_key_file = \"{0}/replica.key\"\npolicy = \"{1}\"\n\n\
         [[endpoint]]\nname = \"chat\"\nlisten = \"127.0.0.1:8000\"\n\n[endpoint.auth]\nbearer_tokens_file = \"{0}/keys\"\n\n\
         [endpoint.replicas]\ncommand = \"llama-server\"\n",
        d.display(),
        policy.display()
    );
    file(&d.join("onepoold.toml"), &config, 0o644);
    file(&d.join("keys"), "live-key-0123456789abcdef\nagents-key-0123456789abcdef agents\n", 0o600);
    let (code, out) = check(&d, &me());
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("classes: endpoint \"chat\": a request whose key names no class is inference; replicas only lower classes ask for: class agents"),
        "{out}"
    );
    file(&d.join("keys"), "live-key-0123456789abcdef\nagents-key-0123456789abcdef gold\n", 0o600);
    let (code, out) = check(&d, &me());
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("keys:2: request class \"gold\" is not a class of the policy"), "{out}");
    let _ = std::fs::remove_dir_all(&d);
}
