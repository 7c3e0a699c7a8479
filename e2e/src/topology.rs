//! The lab's topology as data: hosts, segments, addresses and roles. `Topology::standard` builds
//! it from the `up` options; everything else (creating namespaces, links, processes) only reads
//! it. The same data can later be written out as a containerlab file.
//!
//! Address plan (all inside the lab ranges 198.18.0.0/15 and fd00::/8):
//!
//! | what | IPv4 | IPv6 |
//! |---|---|---|
//! | lab segment (bridge `flb-br0`) | 198.18.0.0/16 | fd00:18::/64 |
//! | host namespace on the bridge | 198.18.0.1 | fd00:18::1 |
//! | control plane | 198.18.0.2 | fd00:18::2 |
//! | node N | 198.18.0.(10+N) | fd00:18::(10+N) (hex) |
//! | client | 198.18.0.100 | fd00:18::64 |
//! | router (lab side) | 198.18.0.254 | fd00:18::fe |
//! | LoadBalancer pools for layer 2 (on-link) | 198.18.200.0/24 | fd00:18::c8:0/112 |
//! | pod CIDR of node N | 198.19.N.0/24 | fd00:19:N::/64 |
//! | Service ClusterIPs | 198.19.64.0/18 | fd00:1b::/112 |
//! | external segment behind the router | 198.19.254.0/24 | fd00:1a::/64 |
//! | external client | 198.19.254.10 | fd00:1a::a |
//! | unnumbered link node1 `eth1` – router `eth2` (BGP unnumbered) | none | link-local only (`fe80::/64`, the kernel's, from each end's MAC) |

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// Whole IPv4 range of the lab; the host holds an `unreachable` route for it.
pub const LAB_RANGE_V4: &str = "198.18.0.0/15";
/// Whole IPv6 range of the lab; the host holds an `unreachable` route for it.
pub const LAB_RANGE_V6: &str = "fd00:18::/29";

/// Which IP families the cluster uses (Services, pods, node addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Families {
    /// IPv4 only.
    V4,
    /// IPv6 only.
    V6,
    /// Both, IPv4 primary.
    Dual,
}

impl Families {
    /// Whether IPv4 is used.
    pub fn v4(self) -> bool {
        self != Families::V6
    }
    /// Whether IPv6 is used.
    pub fn v6(self) -> bool {
        self != Families::V4
    }
}

/// kube-proxy's data path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ProxyMode {
    /// iptables rules (KUBE-SERVICES, KUBE-SVC-*, KUBE-SEP-*).
    Iptables,
    /// nftables rules (table ip/ip6 kube-proxy).
    Nftables,
}

impl ProxyMode {
    /// The value of kube-proxy's `mode` setting.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Iptables => "iptables",
            ProxyMode::Nftables => "nftables",
        }
    }
}

/// Options of `lab up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Options {
    /// Number of node hosts.
    pub nodes: u8,
    /// kube-proxy mode.
    pub proxy_mode: ProxyMode,
    /// Cluster IP families.
    pub families: Families,
    /// Real nodes: a containerd and a kubelet in every node, running the pods the API server
    /// schedules (`up --kubelet`), instead of Node objects kept Ready by the lab's agent.
    #[serde(default)]
    pub kubelet: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            nodes: 3,
            proxy_mode: ProxyMode::Iptables,
            families: Families::Dual,
            kubelet: false,
        }
    }
}

/// What a host is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// etcd, kube-apiserver, kube-controller-manager.
    ControlPlane,
    /// A Kubernetes node: kube-proxy, pods.
    Node {
        /// 1-based node number.
        index: u8,
        /// Pod CIDR (IPv4).
        pod_cidr_v4: String,
        /// Pod CIDR (IPv6).
        pod_cidr_v6: String,
    },
    /// A client on the lab segment.
    Client,
    /// FRR router between the lab segment and the external segment.
    Router {
        /// The router's AS number.
        asn: u32,
        /// The router's BFD timers towards the nodes (FRR profile `nodes`).
        #[serde(default)]
        bfd: RouterBfd,
    },
    /// A client behind the router.
    ExternalClient,
}

/// The lab router's BFD profile towards the nodes: its sessions run only with speakers whose
/// BGPPeer names a `bfdProfile` (FRR's BGP takes no notice of a BFD session that never came
/// up, so the others keep plain BGP).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterBfd {
    /// Required Min RX (ms).
    pub receive_interval_ms: u32,
    /// Desired Min TX (ms).
    pub transmit_interval_ms: u32,
    /// Detection multiplier.
    pub detect_multiplier: u8,
}

impl Default for RouterBfd {
    /// FRR's and MetalLB's defaults: 300 ms both ways, 3 packets.
    fn default() -> Self {
        RouterBfd {
            receive_interval_ms: 300,
            transmit_interval_ms: 300,
            detect_multiplier: 3,
        }
    }
}

/// An interface of a host on a segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    /// Name inside the host.
    pub name: String,
    /// Segment it is attached to.
    pub segment: String,
    /// IPv4 address.
    pub ipv4: Ipv4Addr,
    /// IPv6 address.
    pub ipv6: Ipv6Addr,
}

/// A static route of a host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Destination prefix.
    pub to: String,
    /// Next hop.
    pub via: IpAddr,
}

/// A host: one network namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// Short name (`cp`, `node1`, `client`, `router`, `ext`).
    pub name: String,
    /// Network namespace name (`flb-<name>`).
    pub netns: String,
    /// What runs there.
    pub role: Role,
    /// Interfaces.
    pub interfaces: Vec<Interface>,
    /// Static routes.
    pub routes: Vec<Route>,
    /// Whether the host forwards packets.
    pub forwarding: bool,
}

/// An L2 segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Segment name.
    pub name: String,
    /// IPv4 prefix.
    pub ipv4: String,
    /// IPv6 prefix.
    pub ipv6: String,
    /// The bridge in the host namespace, if the host namespace joins this segment.
    pub host_bridge: Option<HostBridge>,
}

/// The lab bridge in the host namespace and the host's addresses on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostBridge {
    /// Bridge name.
    pub name: String,
    /// Host IPv4 address.
    pub ipv4: Ipv4Addr,
    /// Host IPv6 address.
    pub ipv6: Ipv6Addr,
}

/// One end of a [`Link`]: an interface of a host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkEnd {
    /// The host's short name (`node1`, `router`).
    pub host: String,
    /// The interface's name inside the host.
    pub interface: String,
}

/// A point-to-point link with no IP addresses: a veth joining two hosts directly, reachable only
/// through the kernel's IPv6 link-local addresses, for BGP unnumbered (RFC 8950; FRR's
/// `neighbor IFNAME interface`). It is on no segment, and neither end takes Router
/// Advertisements.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    /// Its two ends.
    pub ends: [LinkEnd; 2],
}

/// The whole lab.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Options it was built from.
    pub options: Options,
    /// Segments.
    pub segments: Vec<Segment>,
    /// Hosts.
    pub hosts: Vec<Host>,
    /// Service ClusterIP ranges, primary family first.
    pub service_cidrs: Vec<String>,
    /// Cluster (pod) CIDRs, primary family first.
    pub cluster_cidrs: Vec<String>,
    /// Point-to-point unnumbered links between hosts (beside their segment interfaces). Empty
    /// when absent, so the state of a lab made before links existed still reads.
    #[serde(default)]
    pub links: Vec<Link>,
}

/// Name of the lab segment.
pub const LAB_SEGMENT: &str = "lab";
/// Name of the external segment.
pub const EXTERNAL_SEGMENT: &str = "external";
/// AS number of the lab router.
pub const ROUTER_ASN: u32 = 64500;
/// node1's end of its unnumbered link to the router.
pub const NODE1_UNNUMBERED_INTERFACE: &str = "eth1";
/// The router's end of its unnumbered link to node1.
pub const ROUTER_UNNUMBERED_INTERFACE: &str = "eth2";

/// The Service ClusterIP range (IPv4).
const SERVICE_RANGE_V4: &str = "198.19.64.0/18";
/// The Service ClusterIP range (IPv6).
const SERVICE_RANGE_V6: &str = "fd00:1b::/112";

fn v6(segments: [u16; 8]) -> Ipv6Addr {
    Ipv6Addr::from(segments)
}

/// Interface `name` of a host on the lab segment, at address `last` of it.
fn lab_if(name: &str, last: u8) -> Interface {
    Interface {
        name: name.into(),
        segment: LAB_SEGMENT.into(),
        ipv4: Ipv4Addr::new(198, 18, 0, last),
        ipv6: v6([0xfd00, 0x18, 0, 0, 0, 0, 0, u16::from(last)]),
    }
}

/// The routes to node `index`'s pods, through that node.
fn pod_routes(index: u8) -> [Route; 2] {
    [
        Route {
            to: format!("198.19.{index}.0/24"),
            via: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 10 + index)),
        },
        Route {
            to: format!("fd00:19:{index:x}::/64"),
            via: IpAddr::V6(v6([0xfd00, 0x18, 0, 0, 0, 0, 0, u16::from(10 + index)])),
        },
    ]
}

/// The routes to the external segment, through the router.
fn external_routes() -> [Route; 2] {
    [
        Route {
            to: "198.19.254.0/24".into(),
            via: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 254)),
        },
        Route {
            to: "fd00:1a::/64".into(),
            via: IpAddr::V6(v6([0xfd00, 0x18, 0, 0, 0, 0, 0, 0xfe])),
        },
    ]
}

/// The control plane's host.
fn control_plane(options: &Options, node_count: u8) -> Host {
    // With kubelet nodes, pods talk to the API server (the controller, through the
    // `kubernetes` Service) from their own addresses, which kube-proxy leaves alone inside
    // the cluster CIDR: the control plane routes the replies to each node.
    let routes = if options.kubelet {
        (1..=node_count).flat_map(pod_routes).collect()
    } else {
        Vec::new()
    };
    Host {
        name: "cp".into(),
        netns: "flb-cp".into(),
        role: Role::ControlPlane,
        interfaces: vec![lab_if("eth0", 2)],
        routes,
        forwarding: false,
    }
}

/// Node `index` of `node_count`.
fn node(options: &Options, index: u8, node_count: u8) -> Host {
    let mut routes: Vec<Route> = (1..=node_count)
        .filter(|o| *o != index)
        .flat_map(pod_routes)
        .collect();
    if options.kubelet {
        // Host-network pods (the speakers) reach the API server at the `kubernetes`
        // Service's ClusterIP: the kernel needs a route for it before kube-proxy's DNAT
        // sends it to the control plane.
        if options.families.v4() {
            routes.push(Route {
                to: SERVICE_RANGE_V4.into(),
                via: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
            });
        }
        if options.families.v6() {
            routes.push(Route {
                to: SERVICE_RANGE_V6.into(),
                via: IpAddr::V6(v6([0xfd00, 0x18, 0, 0, 0, 0, 0, 2])),
            });
        }
    }
    // Routes towards the external segment go through the router.
    routes.extend(external_routes());
    Host {
        name: format!("node{index}"),
        netns: format!("flb-node{index}"),
        role: Role::Node {
            index,
            pod_cidr_v4: format!("198.19.{index}.0/24"),
            pod_cidr_v6: format!("fd00:19:{index:x}::/64"),
        },
        interfaces: vec![lab_if("eth0", 10 + index)],
        routes,
        forwarding: true,
    }
}

/// The client on the lab segment.
fn client() -> Host {
    Host {
        name: "client".into(),
        netns: "flb-client".into(),
        role: Role::Client,
        interfaces: vec![lab_if("eth0", 100)],
        routes: external_routes().into(),
        forwarding: false,
    }
}

/// The router, between the lab segment and the external one.
fn router() -> Host {
    Host {
        name: "router".into(),
        netns: "flb-router".into(),
        role: Role::Router {
            asn: ROUTER_ASN,
            bfd: RouterBfd::default(),
        },
        interfaces: vec![
            lab_if("eth0", 254),
            Interface {
                name: "eth1".into(),
                segment: EXTERNAL_SEGMENT.into(),
                ipv4: Ipv4Addr::new(198, 19, 254, 1),
                ipv6: v6([0xfd00, 0x1a, 0, 0, 0, 0, 0, 1]),
            },
        ],
        routes: vec![],
        forwarding: true,
    }
}

/// The external client, behind the router.
fn external_client() -> Host {
    Host {
        name: "ext".into(),
        netns: "flb-ext".into(),
        role: Role::ExternalClient,
        interfaces: vec![Interface {
            name: "eth0".into(),
            segment: EXTERNAL_SEGMENT.into(),
            ipv4: Ipv4Addr::new(198, 19, 254, 10),
            ipv6: v6([0xfd00, 0x1a, 0, 0, 0, 0, 0, 0xa]),
        }],
        routes: vec![
            Route {
                to: "198.18.0.0/16".into(),
                via: IpAddr::V4(Ipv4Addr::new(198, 19, 254, 1)),
            },
            Route {
                to: "fd00:18::/64".into(),
                via: IpAddr::V6(v6([0xfd00, 0x1a, 0, 0, 0, 0, 0, 1])),
            },
        ],
        forwarding: false,
    }
}

/// The lab segment (with the host's bridge) and the external segment.
fn segments() -> Vec<Segment> {
    vec![
        Segment {
            name: LAB_SEGMENT.into(),
            ipv4: "198.18.0.0/16".into(),
            ipv6: "fd00:18::/64".into(),
            host_bridge: Some(HostBridge {
                name: "flb-br0".into(),
                ipv4: Ipv4Addr::new(198, 18, 0, 1),
                ipv6: v6([0xfd00, 0x18, 0, 0, 0, 0, 0, 1]),
            }),
        },
        Segment {
            name: EXTERNAL_SEGMENT.into(),
            ipv4: "198.19.254.0/24".into(),
            ipv6: "fd00:1a::/64".into(),
            host_bridge: None,
        },
    ]
}

impl Topology {
    /// The standard lab: control plane, N nodes, a client and a router with an external client.
    pub fn standard(options: Options) -> Self {
        // Node N's pods use 198.19.N.0/24, below the Service range 198.19.64.0/18.
        let node_count = options.nodes.clamp(1, 60);
        let mut hosts = vec![control_plane(&options, node_count)];
        hosts.extend((1..=node_count).map(|index| node(&options, index, node_count)));
        hosts.extend([client(), router(), external_client()]);
        // node1 and the router are also joined directly, with no addresses, for BGP unnumbered.
        let mut links = Vec::new();
        if hosts.iter().any(|h| h.name == "node1") {
            links.push(Link {
                ends: [
                    LinkEnd {
                        host: "node1".into(),
                        interface: NODE1_UNNUMBERED_INTERFACE.into(),
                    },
                    LinkEnd {
                        host: "router".into(),
                        interface: ROUTER_UNNUMBERED_INTERFACE.into(),
                    },
                ],
            });
        }
        let (mut service_cidrs, mut cluster_cidrs) = (Vec::new(), Vec::new());
        if options.families.v4() {
            service_cidrs.push(SERVICE_RANGE_V4.to_string());
            cluster_cidrs.push("198.19.0.0/16".to_string());
        }
        if options.families.v6() {
            service_cidrs.push(SERVICE_RANGE_V6.to_string());
            cluster_cidrs.push("fd00:19::/48".to_string());
        }
        Topology {
            options: Options {
                nodes: node_count,
                ..options
            },
            segments: segments(),
            hosts,
            service_cidrs,
            cluster_cidrs,
            links,
        }
    }

    /// The ends of `host`'s unnumbered links: each as (its own end, the other host's end).
    pub fn links_of<'a>(
        &'a self,
        host: &'a str,
    ) -> impl Iterator<Item = (&'a LinkEnd, &'a LinkEnd)> + 'a {
        self.links.iter().filter_map(move |l| {
            let [a, b] = &l.ends;
            if a.host == host {
                Some((a, b))
            } else if b.host == host {
                Some((b, a))
            } else {
                None
            }
        })
    }

    /// A host by short name.
    pub fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// The node hosts in order.
    pub fn nodes(&self) -> impl Iterator<Item = &Host> {
        self.hosts
            .iter()
            .filter(|h| matches!(h.role, Role::Node { .. }))
    }

    /// The control plane's address on the lab segment.
    pub fn apiserver_address(&self) -> Ipv4Addr {
        self.host("cp")
            .map(|h| h.interfaces[0].ipv4)
            .unwrap_or(Ipv4Addr::new(198, 18, 0, 2))
    }

    /// The first ClusterIP of each Service range (the `kubernetes` Service), for the serving cert.
    pub fn kubernetes_service_ips(&self) -> Vec<IpAddr> {
        let mut ips = Vec::new();
        if self.options.families.v4() {
            ips.push(IpAddr::V4(Ipv4Addr::new(198, 19, 64, 1)));
        }
        if self.options.families.v6() {
            ips.push(IpAddr::V6(v6([0xfd00, 0x1b, 0, 0, 0, 0, 0, 1])));
        }
        ips
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn standard_topology_has_every_role_and_unique_addresses() {
        let t = Topology::standard(Options::default());
        assert_eq!(t.nodes().count(), 3);
        let mut v4: Vec<Ipv4Addr> = t
            .hosts
            .iter()
            .flat_map(|h| h.interfaces.iter().map(|i| i.ipv4))
            .collect();
        let n = v4.len();
        v4.sort();
        v4.dedup();
        assert_eq!(v4.len(), n, "duplicate IPv4 addresses");
        assert!(t.host("router").is_some_and(|r| r.interfaces.len() == 2));
        assert_eq!(t.service_cidrs, ["198.19.64.0/18", "fd00:1b::/112"]);
    }

    #[test]
    fn every_address_is_inside_the_lab_ranges() {
        let t = Topology::standard(Options {
            nodes: 5,
            ..Options::default()
        });
        for h in &t.hosts {
            for i in &h.interfaces {
                assert_eq!(i.ipv4.octets()[0..1], [198]);
                assert!(matches!(i.ipv4.octets()[1], 18 | 19), "{}", i.ipv4);
                assert_eq!(i.ipv6.segments()[0], 0xfd00, "{}", i.ipv6);
            }
        }
    }

    #[test]
    fn pod_cidrs_stay_clear_of_the_service_and_external_ranges() {
        let t = Topology::standard(Options {
            nodes: 200,
            ..Options::default()
        });
        assert_eq!(t.nodes().count(), 60, "node count is capped");
        for node in t.nodes() {
            let Role::Node { index, .. } = node.role else {
                unreachable!()
            };
            assert!(
                index < 64,
                "198.19.{index}.0/24 would overlap the Service range 198.19.64.0/18"
            );
        }
    }

    #[test]
    fn standard_topology_links_node1_and_the_router_unnumbered() {
        for nodes in [1, 3, 60] {
            let t = Topology::standard(Options {
                nodes,
                ..Options::default()
            });
            assert_eq!(t.links.len(), 1, "{nodes} nodes");
            let ends: Vec<(&str, &str)> = t.links[0]
                .ends
                .iter()
                .map(|e| (e.host.as_str(), e.interface.as_str()))
                .collect();
            assert_eq!(ends, [("node1", "eth1"), ("router", "eth2")]);
            let mine: Vec<(&str, &str)> = t
                .links_of("router")
                .map(|(mine, peer)| (mine.interface.as_str(), peer.host.as_str()))
                .collect();
            assert_eq!(mine, [("eth2", "node1")]);
            assert_eq!(t.links_of("node2").count(), 0);
        }
    }

    #[test]
    fn link_ends_are_hosts_with_free_interface_names() {
        let t = Topology::standard(Options::default());
        for link in &t.links {
            assert_ne!(
                link.ends[0].host, link.ends[1].host,
                "a link joins two hosts"
            );
            for end in &link.ends {
                let host = t.host(&end.host).expect("a link end names a host");
                assert!(end.interface.len() <= 15, "{}: too long", end.interface);
                assert!(
                    host.interfaces.iter().all(|i| i.name != end.interface),
                    "{}:{} is also a segment interface",
                    end.host,
                    end.interface
                );
                assert_eq!(
                    t.links_of(&end.host)
                        .filter(|(mine, _)| mine.interface == end.interface)
                        .count(),
                    1,
                    "{}:{} is on two links",
                    end.host,
                    end.interface
                );
            }
        }
    }

    #[test]
    fn a_topology_without_links_still_reads() {
        // The state file of a lab made before links existed has no `links`.
        let mut json = serde_json::to_value(Topology::standard(Options::default())).unwrap();
        json.as_object_mut().unwrap().remove("links");
        let t: Topology = serde_json::from_value(json).unwrap();
        assert!(t.links.is_empty());
        let round = serde_json::to_value(Topology::standard(Options::default())).unwrap();
        assert_eq!(round["links"][0]["ends"][1]["interface"], "eth2");
    }

    #[test]
    fn v6_only_cluster_uses_only_v6_ranges() {
        let t = Topology::standard(Options {
            families: Families::V6,
            ..Options::default()
        });
        assert_eq!(t.service_cidrs, ["fd00:1b::/112"]);
        assert_eq!(t.cluster_cidrs, ["fd00:19::/48"]);
    }
}
