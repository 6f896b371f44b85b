//! The hosts mode (`up --hosts`): each slurmd node, a head host
//! (slurmctld, slurmdbd, MariaDB), two service hosts (onepoold, and a
//! second onepoold for the HA scenario of docs/ha.md) and a client host in
//! a network namespace of its own, each with its own address on one
//! bridge, so that every hop the cluster makes crosses a network interface
//! as it would between machines. Munge's socket, the file system and the
//! fake GPUs stay shared: they are files.
//!
//! The bridge lives in the root namespace, which has an address on it too
//! (the "admin" host). That keeps every Slurm command of the harness, of an
//! admin's shell and of a test's in-process onepoold working unchanged: the
//! root namespace reaches each host by its address, as a login node would.
//! A "switch" namespace would isolate the root namespace from the cluster
//! but make every one of those commands need a wrapper.
//!
//! Each cluster takes one /24 of 10.251.0.0/16 (chosen at its first `up`,
//! kept in cluster.json) and names its bridge, veths and namespaces after
//! that subnet, so two hosts-mode clusters on one machine never share one.

use std::fs;
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::process;

/// The /16 every hosts-mode cluster takes its /24 from.
const NET: [u8; 2] = [10, 251];

/// Where /etc/hosts of a namespace comes from: `ip netns exec` mounts
/// `/etc/netns/NAME/hosts` over /etc/hosts, so names resolve in every
/// namespace without touching the machine's own file.
const NETNS_ETC: &str = "/etc/netns";

/// A hosts-mode cluster's network: its subnet, `10.251.SUBNET.0/24`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostsNet {
    pub subnet: u8,
}

/// One host of the cluster: a network namespace with one address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// The host's name, resolvable in every namespace of the cluster.
    pub name: String,
    /// The network namespace (`ip netns`) the host is.
    pub namespace: String,
    pub address: Ipv4Addr,
    /// The root namespace's end of the host's veth pair (on the bridge).
    veth: String,
}

impl HostsNet {
    fn address(&self, last: u8) -> Ipv4Addr {
        Ipv4Addr::new(NET[0], NET[1], self.subnet, last)
    }

    /// The subnet in CIDR notation.
    pub fn cidr(&self) -> String {
        format!("{}/24", self.address(0))
    }

    /// The bridge every host's veth is on (in the root namespace).
    pub fn bridge(&self) -> String {
        format!("op{}br", self.subnet)
    }

    /// The root namespace's address on the bridge.
    pub fn admin_address(&self) -> Ipv4Addr {
        self.address(254)
    }

    fn host(&self, name: &str, last: u8, short: &str) -> Host {
        Host {
            name: name.to_string(),
            namespace: format!("op{}-{name}", self.subnet),
            address: self.address(last),
            // Interface names stop at 15 bytes: "op255-n200" is 10.
            veth: format!("op{}-{short}", self.subnet),
        }
    }

    /// slurmctld, slurmdbd and MariaDB.
    pub fn head(&self) -> Host {
        self.host("head", 1, "h")
    }

    /// onepoold.
    pub fn service(&self) -> Host {
        self.host("service", 2, "s")
    }

    /// A second onepoold host (docs/ha.md: two instances, one acting),
    /// so that killing one instance's host leaves the other's network up.
    pub fn service2(&self) -> Host {
        self.host("service2", 4, "s2")
    }

    /// The load: clients of onepoold's endpoints.
    pub fn client(&self) -> Host {
        self.host("client", 3, "c")
    }

    /// The slurmd of node `i` (1-based), at `.10 + i`.
    pub fn node(&self, i: u32) -> Host {
        let last = u8::try_from(10 + i).unwrap_or(u8::MAX);
        self.host(&format!("node{i}"), last, &format!("n{i}"))
    }

    /// Every host of a cluster of `nodes` nodes.
    pub fn hosts(&self, nodes: u32) -> Vec<Host> {
        let mut v = vec![self.head(), self.service(), self.client(), self.service2()];
        v.extend((1..=nodes).map(|i| self.node(i)));
        v
    }

    /// The node named `name` (`nodeN`), if a cluster of `nodes` nodes has it.
    pub fn node_named(&self, nodes: u32, name: &str) -> Option<Host> {
        (1..=nodes).map(|i| self.node(i)).find(|h| h.name == name)
    }

    /// What every namespace's /etc/hosts says.
    pub fn hosts_file(&self, nodes: u32) -> String {
        let mut s = String::from(
            "# Written by `onepool-devcluster up --hosts`: the cluster's hosts on its bridge.\n127.0.0.1 localhost\n",
        );
        s.push_str(&format!("{} admin\n", self.admin_address()));
        for h in self.hosts(nodes) {
            s.push_str(&format!("{} {}\n", h.address, h.name));
        }
        s
    }
}

/// The largest cluster the subnet's numbering holds (`.11` up to `.253`).
pub const MAX_NODES: u32 = 243;

/// Picks a free /24 for a new cluster: the one its name hashes to, else the
/// next one no interface of this machine has a route to.
pub fn choose(cluster: &str) -> Result<HostsNet> {
    let routes =
        process::run(Command::new("ip").args(["-4", "route", "show", "table", "all"]), Duration::from_secs(10))?;
    let links = process::run(Command::new("ip").args(["-o", "link", "show"]), Duration::from_secs(10))?;
    let start = cluster.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b))) % 250;
    for k in 0..250 {
        let net = HostsNet { subnet: ((start + k) % 250 + 1) as u8 };
        let cidr = net.cidr();
        let prefix = format!("{}.{}.{}.", NET[0], NET[1], net.subnet);
        let taken = routes.lines().any(|l| l.starts_with(&cidr) || l.contains(&prefix))
            || links.contains(&format!(" {}:", net.bridge()))
            || links.contains(&format!(" {}@", net.head().veth));
        if !taken {
            return Ok(net);
        }
    }
    Err(Error::Setup(format!("every /24 of {}.{}.0.0/16 is in use on this machine", NET[0], NET[1])))
}

/// Runs `ip ARGS`.
fn ip(args: &[&str]) -> Result<String> {
    process::run(Command::new("ip").args(args), Duration::from_secs(20))
}

fn namespaces() -> Result<Vec<String>> {
    let out = ip(&["netns", "list"])?;
    // `ip netns list` prints "NAME" or "NAME (id: N)".
    Ok(out.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect())
}

fn link_exists(name: &str) -> bool {
    ip(&["link", "show", name]).is_ok()
}

/// Whether `host`'s namespace is there with its address on its veth.
fn host_is_wired(host: &Host, have: &[String]) -> bool {
    have.contains(&host.namespace)
        && link_exists(&host.veth)
        && ip(&["-n", &host.namespace, "-4", "-o", "addr", "show", "dev", "eth0", "up"])
            .is_ok_and(|o| o.contains(&format!("inet {}/24", host.address)))
}

/// Makes the bridge, each host's namespace, veth pair, address and hosts
/// file, keeping what is already right (a namespace that lost its wiring is
/// made again). Returns the names of the hosts made (again): what still
/// runs from an earlier namespace of theirs is off the network.
pub fn ensure(net: &HostsNet, nodes: u32, progress: &mut dyn FnMut(&str)) -> Result<Vec<String>> {
    if onepool_os::geteuid() != 0 {
        return Err(Error::Setup("the hosts mode makes network namespaces: run it as root".into()));
    }
    let bridge = net.bridge();
    if !link_exists(&bridge) {
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        progress(&format!("made bridge {bridge} for {}", net.cidr()));
    }
    let admin = format!("{}/24", net.admin_address());
    if !ip(&["-4", "-o", "addr", "show", "dev", &bridge])?.contains(&format!("inet {admin}")) {
        ip(&["addr", "add", &admin, "dev", &bridge])?;
    }
    ip(&["link", "set", &bridge, "up"])?;
    let have = namespaces()?;
    let hosts_file = net.hosts_file(nodes);
    let mut made = Vec::new();
    for host in net.hosts(nodes) {
        if host_is_wired(&host, &have) {
            write_hosts_file(&host.namespace, &hosts_file)?;
            continue;
        }
        remove_host(&host, &have);
        let ns = host.namespace.as_str();
        ip(&["netns", "add", ns])?;
        ip(&["link", "add", &host.veth, "type", "veth", "peer", "name", "eth0", "netns", ns])?;
        ip(&["link", "set", &host.veth, "master", &bridge, "up"])?;
        ip(&["-n", ns, "addr", "add", &format!("{}/24", host.address), "dev", "eth0"])?;
        ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        // After remove_host, which takes the old one with the namespace.
        write_hosts_file(ns, &hosts_file)?;
        progress(&format!("made host {} ({}) in namespace {ns}", host.name, host.address));
        made.push(host.name);
    }
    Ok(made)
}

fn write_hosts_file(namespace: &str, text: &str) -> Result<()> {
    let dir = std::path::Path::new(NETNS_ETC).join(namespace);
    fs::create_dir_all(&dir).ctx(|| format!("creating {}", dir.display()))?;
    let path = dir.join("hosts");
    if fs::read_to_string(&path).ok().as_deref() != Some(text) {
        fs::write(&path, text).ctx(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The veth goes first, by name: deleting one end deletes the pair at
/// once, while a deleted namespace takes its end (and with it the
/// bridge's) only later, when the kernel gets to it (measured: the bridge's
/// end still listed after `ip netns delete` returned).
fn remove_host(host: &Host, have: &[String]) {
    if link_exists(&host.veth) {
        let _ = ip(&["link", "delete", &host.veth]);
    }
    if have.contains(&host.namespace) {
        let _ = ip(&["netns", "delete", &host.namespace]);
    }
    let _ = fs::remove_dir_all(std::path::Path::new(NETNS_ETC).join(&host.namespace));
}

/// Removes every namespace, veth, hosts file and the bridge of the cluster
/// (after `down` stopped what ran in them).
pub fn remove(net: &HostsNet, nodes: u32, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let have = namespaces()?;
    for host in net.hosts(nodes) {
        remove_host(&host, &have);
    }
    if link_exists(&net.bridge()) {
        ip(&["link", "delete", &net.bridge()])?;
    }
    // The folder too once no cluster has a hosts file there (it fails
    // while another one has).
    let _ = fs::remove_dir(NETNS_ETC);
    progress(&format!("removed the hosts' namespaces and bridge {}", net.bridge()));
    Ok(())
}

/// `cmd` run on `host`: in its network namespace, with the host's hosts
/// file over /etc/hosts (a mount namespace of its own) and its name as the
/// hostname (a UTS namespace of its own), with the same arguments,
/// environment and working folder. Every step execs the next, so the PID
/// is the program's.
///
/// Not `ip netns exec`: it mounts a sysfs of its own, without
/// /sys/fs/cgroup, and slurmd 22.05 then stops ("No filesystem mounted on
/// /sys/fs/cgroup", measured). The hostname is what slurmctld and slurmdbd
/// check against SlurmctldHost and DbdHost before they start, and what a
/// job on a node sees, as on a real one.
pub fn in_namespace(cmd: &Command, host: &Host) -> Command {
    let mut c = Command::new("nsenter");
    let hosts = std::path::Path::new(NETNS_ETC).join(&host.namespace).join("hosts");
    c.arg(format!("--net=/run/netns/{}", host.namespace))
        .args(["--", "unshare", "--mount", "--uts", "--", "sh", "-c", ENTER_HOST, &host.name])
        .arg(hosts)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    if let Some(d) = cmd.get_current_dir() {
        c.current_dir(d);
    }
    c
}

/// Mounts `$1` over /etc/hosts and sets the hostname to `$0` (in the new
/// mount and UTS namespaces: `unshare --mount` keeps its mounts private),
/// then execs the rest.
const ENTER_HOST: &str =
    "mount --bind \"$1\" /etc/hosts && echo \"$0\" > /proc/sys/kernel/hostname && shift && exec \"$@\"";

/// The settings slurm.conf takes in the hosts mode: slurmctld and slurmdbd
/// on the head host's address; each daemon binds every address of its own
/// namespace (the single-namespace mode's NoInAddrAny kept several slurmd
/// on one loopback apart; here each has a namespace of its own).
pub fn slurm_conf(site: &str, net: &HostsNet) -> Result<String> {
    const LOOPBACK: &str = "# Everything stays on loopback.\nCommunicationParameters=NoInAddrAny,NoCtldInAddrAny\n";
    if !site.contains(LOOPBACK) {
        return Err(Error::Setup(
            "slurm.conf.in no longer says CommunicationParameters=NoInAddrAny,NoCtldInAddrAny as the hosts mode expects"
                .into(),
        ));
    }
    let head = net.head();
    let site = site.replace(LOOPBACK, "# Each host binds the addresses of its own network namespace.\n");
    let extra = format!("SlurmctldHost={}({})\nAccountingStorageHost={}\n", head.name, head.address, head.address);
    Ok(crate::policy_conf::override_settings(&site, &extra))
}

/// slurmdbd.conf's settings in the hosts mode: slurmdbd and MariaDB on the
/// head host's address.
pub fn slurmdbd_conf(text: &str, net: &HostsNet) -> String {
    let head = net.head();
    let extra = format!("DbdHost={}\nDbdAddr={}\nStorageHost={}\n", head.name, head.address, head.address);
    crate::policy_conf::override_settings(text, &extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_linux_and_addresses_differ() {
        let net = HostsNet { subnet: 250 };
        let hosts = net.hosts(MAX_NODES);
        for h in &hosts {
            assert!(h.veth.len() <= 15, "{} is longer than an interface name may be", h.veth);
        }
        let mut addrs: Vec<Ipv4Addr> = hosts.iter().map(|h| h.address).collect();
        addrs.push(net.admin_address());
        let n = addrs.len();
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), n, "two hosts share an address");
        assert!(net.bridge().len() <= 15);
        assert_eq!(net.node(4).address, Ipv4Addr::new(10, 251, 250, 14));
        assert_eq!(net.node(4).namespace, "op250-node4");
    }

    #[test]
    fn hosts_file_names_every_host() {
        let net = HostsNet { subnet: 7 };
        let f = net.hosts_file(2);
        for line in [
            "10.251.7.1 head",
            "10.251.7.2 service",
            "10.251.7.3 client",
            "10.251.7.4 service2",
            "10.251.7.12 node2",
            "10.251.7.254 admin",
        ] {
            assert!(f.lines().any(|l| l == line), "{line} missing from\n{f}");
        }
        assert!(!f.contains("node3"));
    }

    #[test]
    fn the_second_service_host_has_its_own_namespace_veth_and_address_and_down_removes_it() {
        let net = HostsNet { subnet: 12 };
        let (s1, s2) = (net.service(), net.service2());
        assert_eq!(s2.address, Ipv4Addr::new(10, 251, 12, 4));
        assert_eq!(s2.namespace, "op12-service2");
        assert_ne!(s2.veth, s1.veth);
        assert_ne!(s2.namespace, s1.namespace);
        // `remove` (down) and `ensure` (up) walk the same list.
        assert!(net.hosts(0).contains(&s2), "service2 is not among the hosts up makes and down removes");
        // Below the first node's address whatever the cluster's size.
        assert!(s2.address < net.node(1).address);
    }

    #[test]
    fn slurm_conf_moves_the_controller_to_the_head_host() {
        let net = HostsNet { subnet: 9 };
        let site = "SlurmctldHost=localhost(127.0.0.1)\n# Everything stays on loopback.\nCommunicationParameters=NoInAddrAny,NoCtldInAddrAny\nAccountingStorageHost=localhost\nInclude x\n";
        let conf = slurm_conf(site, &net).unwrap();
        assert!(conf.contains("SlurmctldHost=head(10.251.9.1)\n"), "{conf}");
        assert!(conf.contains("AccountingStorageHost=10.251.9.1\n"), "{conf}");
        assert!(!conf.contains("CommunicationParameters"), "{conf}");
        assert!(!conf.contains("127.0.0.1"), "{conf}");
        assert!(slurm_conf("SlurmctldHost=x\n", &net).is_err(), "a template without the loopback lines is refused");
    }

    #[test]
    fn the_wrapper_sets_the_hostname_and_execs_the_program_with_its_arguments() {
        let out = Command::new("sh")
            .args([
                "-c",
                &ENTER_HOST
                    .replace("mount --bind \"$1\" /etc/hosts", "test -f \"$1\"")
                    .replace("/proc/sys/kernel/hostname", "/dev/null"),
                "node7",
                "/etc/hostname",
                "echo",
                "a b",
                "c",
            ])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "a b c\n");
    }

    #[test]
    fn a_wrapped_command_keeps_its_arguments_and_environment() {
        let mut c = Command::new("slurmd");
        c.args(["-D", "-N", "node1"]).env("SLURM_CONF", "/x");
        let w = in_namespace(&c, &HostsNet { subnet: 1 }.node(1));
        assert_eq!(w.get_program(), "nsenter");
        let args: Vec<_> = w.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        let want = [
            "--net=/run/netns/op1-node1",
            "--",
            "unshare",
            "--mount",
            "--uts",
            "--",
            "sh",
            "-c",
            ENTER_HOST,
            "node1",
            "/etc/netns/op1-node1/hosts",
            "slurmd",
            "-D",
            "-N",
            "node1",
        ];
        assert_eq!(args, want);
        assert!(w.get_envs().any(|(k, v)| k == "SLURM_CONF" && v == Some("/x".as_ref())));
    }
}
