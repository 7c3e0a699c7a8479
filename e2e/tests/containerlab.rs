//! The containerlab topology `e2e/lab containerlab` prints (src/containerlab.rs), for several
//! option sets: valid against containerlab's published JSON schema (vendored in
//! e2e/containerlab/, its README says which version), with the lab's address plan, the lab
//! router's configuration, a kind cluster of the right shape and links that mirror the lab's
//! segments and its unnumbered link. Needs no root and no lab. containerlab itself is not run
//! here (docs/containerlab.md says what that leaves untested).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::IpAddr;

use ferrolb_e2e::containerlab::{self, Settings};
use ferrolb_e2e::router;
use ferrolb_e2e::topology::{Families, Host, Options, ProxyMode, Role, Topology};
use serde_json::{Value, json};

/// containerlab's schema, as published in its repository (e2e/containerlab/README.md).
const SCHEMA: &str = include_str!("../containerlab/clab.schema.json");

fn validator() -> jsonschema::Validator {
    let schema: Value = serde_json::from_str(SCHEMA).expect("the vendored schema is JSON");
    assert_eq!(
        schema["$schema"], "http://json-schema.org/draft-07/schema#",
        "the vendored schema changed drafts: validate with that draft"
    );
    jsonschema::draft7::new(&schema).expect("the vendored schema compiles")
}

/// The option sets checked: the default lab, the smallest, an IPv6-only one with nftables and
/// the largest.
fn option_sets() -> Vec<Options> {
    vec![
        Options::default(),
        Options {
            nodes: 1,
            proxy_mode: ProxyMode::Nftables,
            families: Families::V4,
            kubelet: false,
        },
        Options {
            nodes: 5,
            proxy_mode: ProxyMode::Nftables,
            families: Families::V6,
            kubelet: false,
        },
        Options {
            nodes: 60,
            proxy_mode: ProxyMode::Iptables,
            families: Families::Dual,
            kubelet: false,
        },
    ]
}

/// The topology, the YAML printed for it, and that YAML read back.
fn generated(options: Options) -> (Topology, String, Value) {
    let topology = Topology::standard(options);
    let yaml = containerlab::generate(&topology, &Settings::default()).expect("generated");
    let value: Value = serde_saphyr::from_str(&yaml).expect("the output is YAML");
    (topology, yaml, value)
}

/// kind's container names for the cluster's hosts (its naming, written out here on purpose
/// rather than taken from the generator), the lab's names for the others.
fn clab_name(host: &Host) -> String {
    match host.role {
        Role::ControlPlane => "ferrolb-control-plane".into(),
        Role::Node { index: 1, .. } => "ferrolb-worker".into(),
        Role::Node { index, .. } => format!("ferrolb-worker{index}"),
        _ => host.name.clone(),
    }
}

fn node<'v>(value: &'v Value, name: &str) -> &'v Value {
    let node = &value["topology"]["nodes"][name];
    assert!(node.is_object(), "no containerlab node {name}");
    node
}

fn exec(node: &Value) -> Vec<&str> {
    node["exec"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// `(device, address/len)` of every `ip [-6] address add A dev D` command.
fn addresses(exec: &[&str]) -> BTreeSet<(String, String)> {
    exec.iter()
        .filter_map(|c| {
            let words: Vec<&str> = c.split_whitespace().collect();
            let add = words.windows(2).position(|w| w == ["address", "add"])?;
            let dev = words.iter().position(|w| *w == "dev")?;
            Some((words[dev + 1].to_string(), words[add + 2].to_string()))
        })
        .collect()
}

/// `(to, via)` of every `ip [-6] route replace TO via VIA` command.
fn routes(exec: &[&str]) -> BTreeSet<(String, String)> {
    exec.iter()
        .filter_map(|c| {
            let words: Vec<&str> = c.split_whitespace().collect();
            let at = words.windows(2).position(|w| w == ["route", "replace"])?;
            let via = words.iter().position(|w| *w == "via")?;
            Some((words[at + 2].to_string(), words[via + 1].to_string()))
        })
        .collect()
}

fn in_prefix(address: IpAddr, prefix: &str) -> bool {
    let (net, len) = prefix.split_once('/').expect("a prefix");
    let (net, len): (IpAddr, u32) = (net.parse().expect("an address"), len.parse().unwrap());
    match (address, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

fn prefix_len(prefix: &str) -> &str {
    prefix.split_once('/').expect("a prefix").1
}

#[test]
fn every_generated_topology_validates_against_the_schema() {
    let validator = validator();
    for options in option_sets() {
        let (_, yaml, value) = generated(options);
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| format!("{e} (at {})", e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{options:?}: not a valid containerlab topology:\n{}\n{yaml}",
            errors.join("\n")
        );
    }
}

/// The schema check can fail: each of these breaks the default lab's file in one place, as a
/// mistake in the generator could, and each must be rejected.
#[test]
fn a_broken_topology_is_rejected() {
    let validator = validator();
    let (_, _, valid) = generated(Options::default());
    assert!(validator.is_valid(&valid), "the unbroken file must pass");
    type Breakage = fn(&mut Value);
    let breakages: [(&str, Breakage); 6] = [
        ("a kind containerlab does not know", |v| {
            v["topology"]["nodes"]["router"]["kind"] = json!("frr");
        }),
        ("a misspelt node field", |v| {
            v["topology"]["nodes"]["router"]["imagee"] = json!("quay.io/frrouting/frr:10.5.1");
        }),
        ("exec as a string instead of a list", |v| {
            v["topology"]["nodes"]["client"]["exec"] = json!("ip link set eth1 up");
        }),
        ("a node name with a space", |v| {
            let nodes = v["topology"]["nodes"].as_object_mut().unwrap();
            let client = nodes.remove("client").unwrap();
            nodes.insert("lab client".into(), client);
        }),
        ("no lab name", |v| {
            v.as_object_mut().unwrap().remove("name");
        }),
        ("no links", |v| {
            v["topology"]["links"] = json!([]);
        }),
    ];
    for (what, breakage) in breakages {
        let mut broken = valid.clone();
        breakage(&mut broken);
        assert_ne!(broken, valid, "{what}: the breakage changed nothing");
        assert!(
            !validator.is_valid(&broken),
            "{what}: accepted by the schema"
        );
    }
}

#[test]
fn addresses_and_routes_are_the_labs() {
    for options in option_sets() {
        let (topology, _, value) = generated(options);
        let pod_cidrs: BTreeSet<String> = topology
            .nodes()
            .flat_map(|n| match &n.role {
                Role::Node {
                    pod_cidr_v4,
                    pod_cidr_v6,
                    ..
                } => vec![pod_cidr_v4.clone(), pod_cidr_v6.clone()],
                _ => vec![],
            })
            .collect();
        for host in &topology.hosts {
            let exec = exec(node(&value, &clab_name(host)));
            let mut want = BTreeSet::new();
            for (i, iface) in host.interfaces.iter().enumerate() {
                let segment = topology
                    .segments
                    .iter()
                    .find(|s| s.name == iface.segment)
                    .unwrap();
                let dev = format!("eth{}", i + 1);
                want.insert((
                    dev.clone(),
                    format!("{}/{}", iface.ipv4, prefix_len(&segment.ipv4)),
                ));
                want.insert((dev, format!("{}/{}", iface.ipv6, prefix_len(&segment.ipv6))));
            }
            assert_eq!(
                addresses(&exec),
                want,
                "{options:?}: {}'s addresses",
                host.name
            );
            // Pod ranges are kind's CNI's to route; every other route of the lab is kept.
            let want: BTreeSet<(String, String)> = host
                .routes
                .iter()
                .filter(|r| !pod_cidrs.contains(&r.to))
                .map(|r| (r.to.clone(), r.via.to_string()))
                .collect();
            assert_eq!(routes(&exec), want, "{options:?}: {}'s routes", host.name);
        }
        // The plan of docs/lab.md, written out: the lab's addresses, not merely the topology's.
        let plan = [
            ("ferrolb-control-plane", "eth1", "198.18.0.2/16"),
            ("ferrolb-worker", "eth1", "198.18.0.11/16"),
            ("ferrolb-worker", "eth1", "fd00:18::b/64"),
            ("client", "eth1", "198.18.0.100/16"),
            ("router", "eth1", "198.18.0.254/16"),
            ("router", "eth1", "fd00:18::fe/64"),
            ("router", "eth2", "198.19.254.1/24"),
            ("ext", "eth1", "198.19.254.10/24"),
            ("ext", "eth1", "fd00:1a::a/64"),
        ];
        for (name, dev, address) in plan {
            let got = addresses(&exec(node(&value, name)));
            assert!(
                got.contains(&(dev.to_string(), address.to_string())),
                "{options:?}: {name} has no {address} on {dev}: {got:?}"
            );
        }
        let worker = routes(&exec(node(&value, "ferrolb-worker")));
        assert!(
            worker.contains(&("198.19.254.0/24".into(), "198.18.0.254".into())),
            "nodes reach the external segment through the router: {worker:?}"
        );
    }
}

#[test]
fn the_router_runs_the_lab_routers_configuration() {
    for options in option_sets() {
        let (topology, _, value) = generated(options);
        let router = node(&value, "router");
        let image = router["image"].as_str().unwrap();
        let tag = image.strip_prefix("quay.io/frrouting/frr:").unwrap_or("");
        assert!(
            !tag.is_empty() && tag != "latest",
            "FRR's image is pinned: {image}"
        );
        let daemons = router["env"]["FRR_DAEMONS"].as_str().unwrap();
        for daemon in ["bgpd=yes", "bfdd=yes"] {
            assert!(daemons.lines().any(|l| l == daemon), "{daemon}: {daemons}");
        }
        let cmd = router["cmd"].as_str().unwrap();
        for part in [
            "> /etc/frr/daemons",
            "> /etc/frr/frr.conf",
            "exec /usr/lib/frr/docker-start",
        ] {
            assert!(cmd.contains(part), "{part}: {cmd}");
        }
        assert_eq!(
            router["sysctls"]["net.ipv4.ip_forward"], "1",
            "the router forwards"
        );

        let conf = router["env"]["FRR_CONF"].as_str().unwrap();
        assert_eq!(
            conf.matches("frr defaults").count(),
            1,
            "one header:\n{conf}"
        );
        // Everything after the header of the lab router's bgpd and bfdd configurations, with
        // the unnumbered link's end named as containerlab names it (eth0 is containerlab's, so
        // the lab's eth2 is eth3; written out here rather than taken from the generator).
        let mut renamed = topology.clone();
        for end in renamed.links.iter_mut().flat_map(|l| l.ends.iter_mut()) {
            let n: usize = end.interface.strip_prefix("eth").unwrap().parse().unwrap();
            end.interface = format!("eth{}", n + 1);
        }
        for lab_config in [router::frr_config(&renamed), router::bfdd_config(&topology)] {
            let body = &lab_config[lab_config.find("\n!\n").unwrap() + 3..];
            assert!(
                conf.contains(body),
                "the lab router's configuration is missing:\n{body}\nfrom:\n{conf}"
            );
        }
        assert!(conf.contains("router bgp 64500\n"), "AS 64500:\n{conf}");
        // node1's unnumbered link ends at the router's eth3 in containerlab.
        assert!(
            conf.contains(" neighbor eth3 interface remote-as external\n"),
            "the unnumbered neighbour:\n{conf}"
        );
        assert_eq!(
            conf.matches("  neighbor eth3 activate\n").count(),
            2,
            "IPv4 and IPv6 unicast:\n{conf}"
        );
        assert!(
            !conf.contains("neighbor eth2 "),
            "the lab's name leaked:\n{conf}"
        );
        assert!(conf.contains(" profile nodes\n"), "BFD profile:\n{conf}");
        // Every node can peer: its lab addresses are inside a listen range.
        let ranges: Vec<&str> = conf
            .lines()
            .filter_map(|l| l.trim().strip_prefix("bgp listen range "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        for n in topology.nodes() {
            for address in [
                IpAddr::V4(n.interfaces[0].ipv4),
                IpAddr::V6(n.interfaces[0].ipv6),
            ] {
                assert!(
                    ranges.iter().any(|r| in_prefix(address, r)),
                    "{options:?}: {} ({address}) is in no listen range {ranges:?}",
                    n.name
                );
            }
        }
    }
}

#[test]
fn the_kind_cluster_follows_the_options() {
    for options in option_sets() {
        let (topology, _, value) = generated(options);
        let cluster = node(&value, "ferrolb");
        assert_eq!(cluster["kind"], "k8s-kind");
        let config: Value =
            serde_saphyr::from_str(cluster["startup-config"].as_str().unwrap()).unwrap();
        assert_eq!(config["apiVersion"], "kind.x-k8s.io/v1alpha4");
        assert_eq!(config["kind"], "Cluster");
        let roles: Vec<&str> = config["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["role"].as_str().unwrap())
            .collect();
        let mut want = vec!["control-plane"];
        want.extend(std::iter::repeat_n("worker", usize::from(options.nodes)));
        assert_eq!(roles, want, "{options:?}");
        let net = &config["networking"];
        let family = match options.families {
            Families::V4 => "ipv4",
            Families::V6 => "ipv6",
            Families::Dual => "dual",
        };
        assert_eq!(net["ipFamily"], family);
        assert_eq!(net["podSubnet"], topology.cluster_cidrs.join(","));
        assert_eq!(net["serviceSubnet"], topology.service_cidrs.join(","));
        assert_eq!(net["kubeProxyMode"], options.proxy_mode.as_str());
        // kind's containers are declared, so links and exec reach them.
        for host in topology
            .hosts
            .iter()
            .filter(|h| matches!(h.role, Role::ControlPlane | Role::Node { .. }))
        {
            assert_eq!(node(&value, &clab_name(host))["kind"], "ext-container");
        }
    }
}

#[test]
fn links_mirror_the_lab_segments() {
    for options in option_sets() {
        let (topology, _, value) = generated(options);
        let links: Vec<[String; 2]> = value["topology"]["links"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                let e = l["endpoints"].as_array().unwrap();
                assert_eq!(e.len(), 2);
                [0, 1].map(|i| e[i].as_str().unwrap().to_string())
            })
            .collect();
        let mut ports = BTreeSet::new();
        for host in &topology.hosts {
            for (i, iface) in host.interfaces.iter().enumerate() {
                let end = format!("{}:eth{}", clab_name(host), i + 1);
                let found: Vec<&[String; 2]> = links.iter().filter(|l| l.contains(&end)).collect();
                assert_eq!(found.len(), 1, "{options:?}: links of {end}: {found:?}");
                let other = found[0].iter().find(|e| **e != end).unwrap();
                let (other_node, port) = other.split_once(':').unwrap();
                let segment = topology
                    .segments
                    .iter()
                    .find(|s| s.name == iface.segment)
                    .unwrap();
                if segment.host_bridge.is_some() {
                    // The lab's bridge: one containerlab bridge per segment, a port per member.
                    assert_eq!(
                        node(&value, other_node)["kind"],
                        "bridge",
                        "{end} -> {other}"
                    );
                    assert_eq!(other_node, format!("flb-{}", segment.name));
                    assert!(port.len() <= 15, "{port}: too long for an interface name");
                    assert!(ports.insert(port.to_string()), "{port} used twice");
                } else {
                    // The external segment: router and external client, a veth between them.
                    let peer = topology
                        .hosts
                        .iter()
                        .find(|h| {
                            h.name != host.name
                                && h.interfaces.iter().any(|p| p.segment == segment.name)
                        })
                        .unwrap();
                    assert_eq!(other_node, clab_name(peer), "{end} -> {other}");
                }
            }
        }
        // The unnumbered link: node1's eth1 and the router's eth2 in the lab, a veth with no
        // addresses (`addresses_and_routes_are_the_labs` checks that no address is added there).
        let unnumbered = ["ferrolb-worker:eth2".to_string(), "router:eth3".to_string()];
        assert!(
            links.contains(&unnumbered),
            "{options:?}: no unnumbered link: {links:?}"
        );
        for (name, dev) in [("ferrolb-worker", "eth2"), ("router", "eth3")] {
            let exec = exec(node(&value, name));
            for command in [
                format!("sysctl -w net.ipv6.conf.{dev}.accept_ra=0"),
                format!("ip link set {dev} up"),
            ] {
                assert!(
                    exec.contains(&command.as_str()),
                    "{name}: no `{command}` in {exec:?}"
                );
            }
        }
        let interfaces: usize = topology.hosts.iter().map(|h| h.interfaces.len()).sum();
        // A bridge port per interface on a bridged segment, one veth for the two-member one,
        // one per unnumbered link.
        assert_eq!(
            links.len(),
            interfaces - 1 + topology.links.len(),
            "{options:?}: {links:?}"
        );
        assert_eq!(containerlab::bridges(&topology), ["flb-lab"]);
    }
}

/// containerlab renders the file as a Go template and then substitutes environment variables:
/// neither may change what we wrote.
#[test]
fn the_file_survives_containerlabs_preprocessing() {
    for options in option_sets() {
        let (_, yaml, _) = generated(options);
        assert!(!yaml.contains("{{"), "a Go template action");
        assert!(
            !yaml.replace("$$", "").contains('$'),
            "a `$` containerlab would expand"
        );
    }
}
