//! The hosts mode of the dev cluster (`onepool-devcluster up --hosts`,
//! issue #36): each node, the head, the service and the client host in a
//! network namespace of its own, each with its own address on one bridge.
//! Jobs run in their node's namespace; names resolve in every namespace;
//! `down` leaves no namespace, veth, bridge or hosts file behind.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::Command;

use onepool_dev_cluster::hosts::HostsNet;
use onepool_dev_cluster::{Cluster, UpOptions};
use onepool_tests::{hosts_cluster, output_dir, up_options, Cleanup, Ran};

fn net() -> HostsNet {
    hosts_cluster().hosts().expect("the hosts cluster runs in the hosts mode")
}

/// The network namespace a process is in, by name (`ip netns identify`).
fn namespace_of(pid: i32) -> String {
    let out = Command::new("ip").args(["netns", "identify", &pid.to_string()]).output().expect("ip netns identify");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn namespaces() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split_whitespace().next()).map(String::from).collect()
}

fn link_exists(name: &str) -> bool {
    Command::new("ip").args(["link", "show", name]).output().is_ok_and(|o| o.status.success())
}

#[test]
fn each_node_runs_its_jobs_at_its_own_address_and_every_name_resolves() {
    let c = hosts_cluster();
    let _cleanup = Cleanup(c);
    let net = net();
    let n = c.spec.nodes;
    // One task per node: each prints its node, the address of its
    // namespace's interface and what `head` resolves to there.
    let out = c.ok(
        "srun",
        &[
            &format!("-N{n}"),
            "--ntasks-per-node=1",
            "sh",
            "-c",
            "echo $SLURMD_NODENAME $(ip -4 -o addr show dev eth0 | awk '{print $4}') $(getent hosts head | awk '{print $1}') $(getent hosts node1 | awk '{print $1}')",
        ],
    );
    let seen: BTreeMap<String, Vec<String>> = out
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace().map(String::from);
            Some((w.next()?, w.collect()))
        })
        .collect();
    assert_eq!(seen.len(), n as usize, "one line per node: {out}");
    for i in 1..=n {
        let host = net.node(i);
        let line = seen.get(&host.name).unwrap_or_else(|| panic!("{} printed nothing: {out}", host.name));
        assert_eq!(
            line.first(),
            Some(&format!("{}/24", host.address)),
            "{}'s job is not at its address: {out}",
            host.name
        );
        assert_eq!(line.get(1), Some(&net.head().address.to_string()), "head does not resolve on {}: {out}", host.name);
        assert_eq!(
            line.get(2),
            Some(&net.node(1).address.to_string()),
            "node1 does not resolve on {}: {out}",
            host.name
        );
        // Slurm reaches the node at its address, its hostname a name.
        assert_eq!(c.node_address(&host.name), IpAddr::V4(host.address));
        let node = c.ok("scontrol", &["-o", "show", "node", &host.name]);
        assert!(node.contains(&format!("NodeHostName={} ", host.name)), "{node}");
    }
}

#[test]
fn each_daemon_runs_in_its_host_s_namespace_and_the_service_and_client_hosts_reach_slurmctld() {
    let c = hosts_cluster();
    let net = net();
    let status: BTreeMap<String, Option<i32>> = c.cluster.status().into_iter().collect();
    let pid = |name: &str| status.get(name).copied().flatten().unwrap_or_else(|| panic!("{name} is not running"));
    for daemon in ["slurmctld", "slurmdbd", "mariadbd"] {
        assert_eq!(namespace_of(pid(daemon)), net.head().namespace, "{daemon}");
    }
    for i in 1..=c.spec.nodes {
        let host = net.node(i);
        assert_eq!(namespace_of(pid(&format!("slurmd-{}", host.name))), host.namespace);
    }
    // munged serves every namespace through its socket file.
    assert_eq!(namespace_of(pid("munged")), "");
    for host in ["service", "client"] {
        let r: Ran = c.on_host(host, "scontrol").arg("ping").output().expect("scontrol ping").into();
        assert!(r.ok && r.stdout.contains("UP"), "slurmctld from the {host} host: {r:?}");
        let r: Ran = c.on_host(host, "sinfo").args(["-h", "-N", "-o", "%t"]).output().expect("sinfo").into();
        assert!(r.ok && r.stdout.lines().count() >= c.spec.nodes as usize, "sinfo from the {host} host: {r:?}");
    }
    // slurmctld's port answers at the head's address, and not on the
    // client host's loopback, which is its own.
    let connects = |ip: String| -> Ran {
        let probe = format!("exec 3<>/dev/tcp/{ip}/{}", c.spec.ctld_port);
        c.on_host("client", "bash").args(["-c", &probe]).output().expect("bash").into()
    };
    let r = connects(net.head().address.to_string());
    assert!(r.ok, "slurmctld's port from the client host: {r:?}");
    let r = connects("127.0.0.1".into());
    assert!(!r.ok, "slurmctld's port answers on the client host's loopback: {r:?}");
}

#[test]
fn down_leaves_no_namespace_veth_bridge_or_hosts_file_and_up_makes_them_again() {
    let main = net();
    let dir = output_dir().join("hosts-cluster-2");
    let second = Cluster::at(&dir).unwrap();
    let opts = UpOptions { nodes: 1, hosts: true, ..up_options() };
    let spec = second.up(&opts, &mut |m| eprintln!("hosts-cluster-2: {m}")).expect("a second hosts cluster up");
    let net = spec.hosts.expect("the hosts mode");
    assert_ne!(net.subnet, main.subnet, "two hosts clusters share a subnet");
    let ours: Vec<String> = net.hosts(1).into_iter().map(|h| h.namespace).collect();
    let have = namespaces();
    assert!(ours.iter().all(|ns| have.contains(ns)), "{ours:?} not all in {have:?}");
    // Idempotent: a second `up` keeps the same daemons in the same namespaces.
    let before = second.status();
    second.up(&opts, &mut |_| {}).unwrap();
    assert_eq!(second.status(), before);
    // A namespace that lost its wiring is made again, its daemon restarted.
    let node = net.node(1);
    assert!(Command::new("ip").args(["netns", "delete", &node.namespace]).status().unwrap().success());
    second.up(&opts, &mut |m| eprintln!("hosts-cluster-2: {m}")).expect("up after a namespace was deleted");
    let out = second.run("srun", &["-N1", "sh", "-c", "ip -4 -o addr show dev eth0"]).unwrap();
    assert!(out.contains(&format!("inet {}/24", node.address)), "{out}");
    second.down(&mut |_| {}).unwrap();
    let have = namespaces();
    for ns in &ours {
        assert!(!have.contains(ns), "namespace {ns} outlived down");
        assert!(!std::path::Path::new("/etc/netns").join(ns).exists(), "/etc/netns/{ns} outlived down");
    }
    assert!(!link_exists(&net.bridge()), "bridge {} outlived down", net.bridge());
    let links = String::from_utf8_lossy(&Command::new("ip").args(["-o", "link"]).output().unwrap().stdout).into_owned();
    assert!(!links.contains(&format!("op{}-", net.subnet)), "a veth outlived down: {links}");
    // The main cluster's network is untouched.
    assert!(link_exists(&main.bridge()));
    assert!(second.status().iter().all(|(_, p)| p.is_none()));
}
