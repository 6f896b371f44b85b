//! `[ha]`: the defaults (one instance that always acts), a full lock
//! table, and each mistake reported at its place.

use std::path::PathBuf;
use std::time::Duration;

use super::*;

const HEAD: &str = "control_socket = \"/s\"\n[[endpoint]]\nname = \"a\"\nlisten = \"127.0.0.1:0\"\n";

fn parsed(ha: &str) -> Result<Config, String> {
    parse("o.toml", &format!("{HEAD}{ha}")).map_err(|e| e.to_string())
}

#[test]
fn without_the_table_the_instance_is_alone_and_named_after_its_host() {
    let c = parsed("").unwrap();
    assert_eq!(c.ha, HaSettings { instance: host_name(), lock: None });
    assert!(!c.ha.instance.is_empty());
    let none = parsed("[ha]\ninstance = \"svc-1\"\nlock = \"none\"\n").unwrap();
    assert_eq!(none.ha, HaSettings { instance: "svc-1".into(), lock: None });
}

#[test]
fn a_mariadb_lock_reads_every_key_and_takes_the_defaults_for_the_rest() {
    let c = parsed(
        "[ha]\nlock = \"mariadb\"\ndatabase = \"db1.site:3307\"\nuser = \"onepool\"\n\
         password_file = \"/etc/onepool/ha.password\"\nca_file = \"/etc/onepool/db-ca.pem\"\n\
         lock_name = \"onepoold.site\"\ncheck_interval = \"500ms\"\nlost_after = \"4s\"\n",
    )
    .unwrap();
    let l = c.ha.lock.unwrap();
    assert_eq!(
        l,
        LockSettings {
            host: "db1.site".into(),
            port: 3307,
            user: "onepool".into(),
            password_file: PathBuf::from("/etc/onepool/ha.password"),
            ca_file: Some(PathBuf::from("/etc/onepool/db-ca.pem")),
            lock_name: Some("onepoold.site".into()),
            check_interval: Duration::from_millis(500),
            lost_after: Duration::from_secs(4),
        }
    );
    assert_eq!(l.fence(), Duration::from_millis(3500), "lost_after less one check interval");
    let d = parsed("[ha]\nlock = \"mariadb\"\ndatabase = \"10.0.0.1\"\nuser = \"u\"\npassword_file = \"/p\"\n")
        .unwrap()
        .ha
        .lock
        .unwrap();
    assert_eq!((d.host.as_str(), d.port, d.lock_name, d.ca_file), ("10.0.0.1", 3306, None, None));
    assert_eq!((d.check_interval, d.lost_after), (Duration::from_secs(1), Duration::from_secs(3)));
    let v6 = parsed("[ha]\nlock = \"mariadb\"\ndatabase = \"[::1]:3306\"\nuser = \"u\"\npassword_file = \"/p\"\n");
    assert_eq!(v6.unwrap().ha.lock.unwrap().host, "::1");
}

#[test]
fn each_mistake_in_ha_is_reported_at_its_place_with_what_to_write() {
    let e = parsed(
        "[ha]\ninstance = \"two words\"\nlock = \"mariadb\"\ndatabase = \"db:x\"\nuser = \"u\"\n\
         password_file = \"relative\"\nlost_after = \"2500ms\"\ncheck_interval = \"2s\"\n",
    )
    .unwrap_err();
    for want in [
        "o.toml:6:12: error: [ha] instance = \"two words\"",
        "o.toml:8:12: error: [ha] database = \"db:x\": expected HOST:PORT",
        "o.toml:10:17: error: [ha] password_file \"relative\" must be an absolute path",
        "o.toml:11:14: error: [ha] lost_after = \"2500ms\": whole seconds",
        "o.toml:12:18: error: [ha] check_interval = 2000 ms must be from 100 ms to half of lost_after",
    ] {
        assert!(e.contains(want), "{want:?} not in:\n{e}");
    }
    let e = parsed("[ha]\nlock = \"mariadb\"\n").unwrap_err();
    for want in ["needs database", "needs user", "needs password_file"] {
        assert!(e.contains(want) && e.contains("o.toml:5:1"), "{want:?} not in:\n{e}");
    }
    let e = parsed("[ha]\nlock = \"etcd\"\n").unwrap_err();
    assert!(e.contains("o.toml:6:8: error: [ha] lock = \"etcd\": expected \"mariadb\""), "{e}");
    let e = parsed("[ha]\ndatabase = \"db:3306\"\n").unwrap_err();
    assert!(e.contains("[ha] sets database but no lock: add lock = \"mariadb\""), "{e}");
    let e =
        parsed("[ha]\nlock = \"mariadb\"\ndatabase = \"db\"\nuser = \"u\"\npassword_file = \"/p\"\npassword = \"x\"\n")
            .unwrap_err();
    assert!(e.contains("unknown field `password`"), "a password never sits in the file: {e}");
}

#[test]
fn a_lock_in_clear_across_a_network_is_warned_about_and_one_on_loopback_or_pinned_is_not() {
    let warn = |db: &str, ca: &str| {
        let c = parsed(&format!(
            "[ha]\nlock = \"mariadb\"\ndatabase = \"{db}\"\nuser = \"u\"\npassword_file = \"/p\"\n{ca}"
        ))
        .unwrap();
        crate::leader::warnings(&c)
    };
    let w = warn("10.0.0.1:3306", "");
    assert!(w.len() == 1 && w[0].contains("not encrypted") && w[0].contains("ca_file"), "{w:?}");
    assert!(warn("10.0.0.1:3306", "ca_file = \"/ca.pem\"\n").is_empty());
    assert!(warn("127.0.0.1:3306", "").is_empty());
    assert!(warn("localhost", "").is_empty());
}
