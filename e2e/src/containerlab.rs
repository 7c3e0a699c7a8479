//! The lab as a containerlab topology (<https://containerlab.dev>): `e2e/lab containerlab >
//! ferrolb.clab.yml` prints the file that [`generate`] writes from the lab's own [`Topology`], so
//! our users can run ferrolb's images and an FRR router in containerlab with the lab's address
//! plan (docs/containerlab.md). Pure: a topology in, YAML out; nothing here touches the machine.
//!
//! How the lab maps onto containerlab's kinds:
//!
//! * The control plane and the nodes become one kind cluster (a `k8s-kind` node, the cluster's
//!   configuration embedded as its `startup-config`), whose containers are declared as
//!   `ext-container` nodes (`<cluster>-control-plane`, `<cluster>-worker`, `<cluster>-worker2`,
//!   ...) so they can be linked and addressed: kind's node images are what a containerlab user
//!   runs Kubernetes with (kubelet, kube-proxy and a CNI), where a `linux` node would have to
//!   build a cluster by hand.
//! * The client, the router and the external client are `linux` nodes; the router runs FRR's
//!   own image with bgpd and bfdd, configured as the lab's router is ([`crate::router`]).
//! * A segment with a bridge in the lab's host namespace, or with more than two members, becomes
//!   a `bridge` node (a Linux bridge the user creates before deploying); a segment of two
//!   members becomes a veth link, as in the lab.
//! * An unnumbered link (node1 – router, for BGP unnumbered) becomes a veth link too, with no
//!   addresses; the router's FRR configuration names its end as containerlab does.
//! * Addresses and routes are `exec` commands (containerlab brings links up unconfigured).
//!   Containerlab owns `eth0` (its management network), so the lab's `ethN` is `eth(N+1)`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context, bail};
use serde::Serialize;
use serde::ser::SerializeMap;

use crate::topology::{Families, Host, LinkEnd, Role, Topology};

/// FRR's image for the router, pinned (the lab's router runs Debian 12's FRR 8.4.4; the
/// configuration it gets uses nothing newer).
pub const FRR_IMAGE: &str = "quay.io/frrouting/frr:10.5.1";
/// The client's and the external client's image: curl, iproute2 and friends (containerlab's own
/// examples use it).
pub const HOST_IMAGE: &str = "wbitt/network-multitool:3.22.2";

/// Names and images of the generated lab; everything else comes from the [`Topology`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// containerlab's lab name (containers are `clab-<name>-<node>`).
    pub lab_name: String,
    /// The kind cluster's name: its containers are `<name>-control-plane`, `<name>-worker`, ...
    pub cluster_name: String,
    /// kind's node image; `None` leaves it to the kind library built into containerlab, whose
    /// default image is the one made for it.
    pub kind_image: Option<String>,
    /// The router's image (FRR).
    pub frr_image: String,
    /// The clients' image.
    pub host_image: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            lab_name: "ferrolb".into(),
            cluster_name: "ferrolb".into(),
            kind_image: None,
            frr_image: FRR_IMAGE.into(),
            host_image: HOST_IMAGE.into(),
        }
    }
}

/// The longest interface name Linux takes (IFNAMSIZ less the NUL).
const IFNAME_MAX: usize = 15;

/// The containerlab topology file (YAML) of `topology`.
pub fn generate(topology: &Topology, settings: &Settings) -> anyhow::Result<String> {
    let file = ClabFile {
        name: settings.lab_name.clone(),
        topology: ClabTopology {
            nodes: nodes(topology, settings)?,
            links: links(topology, settings)?,
        },
    };
    let body = serde_saphyr::to_string(&file).context("writing the containerlab topology")?;
    let o = &topology.options;
    let mut out = String::new();
    writeln!(
        out,
        "# The ferrolb lab as a containerlab topology ({} node{}, kube-proxy {}, {}), written by\n# `e2e/lab containerlab`; docs/containerlab.md says how to run it.",
        o.nodes,
        if o.nodes == 1 { "" } else { "s" },
        o.proxy_mode.as_str(),
        family_name(o.families),
    )?;
    for bridge in bridges(topology) {
        writeln!(
            out,
            "# Create the bridge first: ip link add {bridge} type bridge && ip link set {bridge} up"
        )?;
    }
    out += &body;
    Ok(out)
}

/// The Linux bridges the topology uses; containerlab does not create them, the user does.
pub fn bridges(topology: &Topology) -> Vec<String> {
    topology
        .segments
        .iter()
        .filter(|s| is_bridged(topology, &s.name))
        .map(|s| bridge_name(&s.name))
        .collect()
}

fn family_name(families: Families) -> &'static str {
    match families {
        Families::V4 => "IPv4",
        Families::V6 => "IPv6",
        Families::Dual => "dual stack",
    }
}

// The file's shape: only the fields we write, named as containerlab's schema names them.

#[derive(Serialize)]
struct ClabFile {
    name: String,
    topology: ClabTopology,
}

#[derive(Serialize)]
struct ClabTopology {
    nodes: Nodes,
    links: Vec<Link>,
}

/// Nodes in the order they were added (a map would sort them, and a reader wants the cluster
/// first and the bridges last).
struct Nodes(Vec<(String, Node)>);

impl Serialize for Nodes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, node) in &self.0 {
            map.serialize_entry(name, node)?;
        }
        map.end()
    }
}

#[derive(Serialize, Default)]
#[serde(rename_all = "kebab-case")]
struct Node {
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    startup_config: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    env: BTreeMap<&'static str, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cmd: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    sysctls: BTreeMap<&'static str, &'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    exec: Vec<String>,
}

#[derive(Serialize)]
struct Link {
    endpoints: [String; 2],
}

/// kind's cluster configuration (kind.x-k8s.io/v1alpha4), the fields we set.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KindCluster {
    api_version: &'static str,
    kind: &'static str,
    networking: KindNetworking,
    nodes: Vec<KindNode>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KindNetworking {
    ip_family: &'static str,
    pod_subnet: String,
    service_subnet: String,
    kube_proxy_mode: &'static str,
}

#[derive(Serialize)]
struct KindNode {
    role: &'static str,
}

/// The containerlab node of a lab host: kind's container name for the cluster's hosts (kind
/// names workers `-worker`, `-worker2`, ... in the order of its configuration), the lab's name
/// for the others.
fn node_name(settings: &Settings, host: &Host) -> String {
    let cluster = &settings.cluster_name;
    match host.role {
        Role::ControlPlane => format!("{cluster}-control-plane"),
        Role::Node { index: 1, .. } => format!("{cluster}-worker"),
        Role::Node { index, .. } => format!("{cluster}-worker{index}"),
        _ => host.name.clone(),
    }
}

/// containerlab's name of the `i`th lab interface of a host (eth0 is containerlab's).
fn clab_interface(i: usize) -> String {
    format!("eth{}", i + 1)
}

/// containerlab's name of a lab interface named `ethN` (an unnumbered link's end): `eth(N+1)`,
/// as for the segment interfaces.
fn clab_interface_named(lab_name: &str) -> anyhow::Result<String> {
    lab_name
        .strip_prefix("eth")
        .and_then(|n| n.parse::<usize>().ok())
        .map(clab_interface)
        .with_context(|| format!("{lab_name}: a link end's interface must be named ethN"))
}

/// The topology with every unnumbered link's ends named as in containerlab, for the router's
/// FRR configuration (`neighbor eth3 interface`).
fn with_clab_link_names(topology: &Topology) -> anyhow::Result<Topology> {
    let mut t = topology.clone();
    for end in t.links.iter_mut().flat_map(|l| l.ends.iter_mut()) {
        end.interface = clab_interface_named(&end.interface)?;
    }
    Ok(t)
}

fn bridge_name(segment: &str) -> String {
    format!("flb-{segment}")
}

/// Whether a segment needs a bridge: the lab gives it one in the host namespace, or it has
/// other than two members (a veth has two ends).
fn is_bridged(topology: &Topology, segment: &str) -> bool {
    let members = topology
        .hosts
        .iter()
        .flat_map(|h| &h.interfaces)
        .filter(|i| i.segment == segment)
        .count();
    let host_bridge = topology
        .segments
        .iter()
        .any(|s| s.name == segment && s.host_bridge.is_some());
    host_bridge || members != 2
}

fn nodes(topology: &Topology, settings: &Settings) -> anyhow::Result<Nodes> {
    let mut nodes = vec![(
        settings.cluster_name.clone(),
        Node {
            kind: "k8s-kind",
            image: settings.kind_image.clone(),
            startup_config: Some(kind_config(topology)?),
            ..Node::default()
        },
    )];
    for host in &topology.hosts {
        let exec = host_exec(topology, host)?;
        let node = match host.role {
            Role::ControlPlane | Role::Node { .. } => Node {
                kind: "ext-container",
                exec,
                ..Node::default()
            },
            Role::Router { .. } => router_node(topology, host, settings, exec)?,
            Role::Client | Role::ExternalClient => Node {
                kind: "linux",
                image: Some(settings.host_image.clone()),
                sysctls: host_sysctls(host),
                exec,
                ..Node::default()
            },
        };
        nodes.push((node_name(settings, host), node));
    }
    for bridge in bridges(topology) {
        nodes.push((
            bridge,
            Node {
                kind: "bridge",
                ..Node::default()
            },
        ));
    }
    Ok(Nodes(nodes))
}

/// kind's configuration: a control plane and a worker per lab node, with the lab's pod and
/// Service ranges, families and kube-proxy mode.
fn kind_config(topology: &Topology) -> anyhow::Result<String> {
    let mut nodes = vec![KindNode {
        role: "control-plane",
    }];
    nodes.extend(topology.nodes().map(|_| KindNode { role: "worker" }));
    let cluster = KindCluster {
        api_version: "kind.x-k8s.io/v1alpha4",
        kind: "Cluster",
        networking: KindNetworking {
            ip_family: match topology.options.families {
                Families::V4 => "ipv4",
                Families::V6 => "ipv6",
                Families::Dual => "dual",
            },
            pod_subnet: topology.cluster_cidrs.join(","),
            service_subnet: topology.service_cidrs.join(","),
            kube_proxy_mode: topology.options.proxy_mode.as_str(),
        },
        nodes,
    };
    serde_saphyr::to_string(&cluster).context("writing the kind cluster configuration")
}

/// What the lab sets in each host's namespace: forwarding as the topology says, and no duplicate
/// address detection (the lab adds its IPv6 addresses `nodad`; the clients' `ip` may not know
/// that flag). Only containerlab's own containers: kind creates its nodes itself.
fn host_sysctls(host: &Host) -> BTreeMap<&'static str, &'static str> {
    let forwarding = if host.forwarding { "1" } else { "0" };
    BTreeMap::from([
        ("net.ipv4.ip_forward", forwarding),
        ("net.ipv6.conf.all.forwarding", forwarding),
        ("net.ipv6.conf.all.accept_dad", "0"),
        ("net.ipv6.conf.default.accept_dad", "0"),
    ])
}

/// The commands that give a host its lab addresses and routes.
fn host_exec(topology: &Topology, host: &Host) -> anyhow::Result<Vec<String>> {
    let mut exec = Vec::new();
    for (i, iface) in host.interfaces.iter().enumerate() {
        let segment = topology
            .segments
            .iter()
            .find(|s| s.name == iface.segment)
            .with_context(|| format!("{}: no segment {}", host.name, iface.segment))?;
        let dev = clab_interface(i);
        let len4 = prefix_len(&segment.ipv4)?;
        let len6 = prefix_len(&segment.ipv6)?;
        exec.push(format!("ip link set {dev} up"));
        exec.push(format!("ip address add {}/{len4} dev {dev}", iface.ipv4));
        exec.push(format!("ip -6 address add {}/{len6} dev {dev}", iface.ipv6));
    }
    // In the lab each node routes the other nodes' pod ranges itself; in kind its CNI (kindnet)
    // does, over kind's own network, and a second route for the same prefix would clash.
    let pod_cidrs: Vec<&str> = topology
        .nodes()
        .flat_map(|n| match &n.role {
            Role::Node {
                pod_cidr_v4,
                pod_cidr_v6,
                ..
            } => vec![pod_cidr_v4.as_str(), pod_cidr_v6.as_str()],
            _ => vec![],
        })
        .collect();
    for route in host
        .routes
        .iter()
        .filter(|r| !pod_cidrs.contains(&r.to.as_str()))
    {
        let family = if route.via.is_ipv6() { "-6 " } else { "" };
        exec.push(format!(
            "ip {family}route replace {} via {}",
            route.to, route.via
        ));
    }
    // Unnumbered links: no addresses but the kernel's link-local one (Docker may have turned
    // IPv6 off in the container), no default route from the peer's Router Advertisements, and
    // no reverse path check against IPv4 routed over IPv6 next hops; as in the lab.
    for (mine, _) in topology.links_of(&host.name) {
        let dev = clab_interface_named(&mine.interface)?;
        for setting in [
            format!("net.ipv6.conf.{dev}.disable_ipv6=0"),
            format!("net.ipv6.conf.{dev}.accept_ra=0"),
            format!("net.ipv4.conf.{dev}.rp_filter=0"),
        ] {
            exec.push(format!("sysctl -w {setting}"));
        }
        exec.push(format!("ip link set {dev} up"));
    }
    Ok(exec)
}

fn prefix_len(prefix: &str) -> anyhow::Result<u8> {
    prefix
        .split_once('/')
        .and_then(|(_, len)| len.parse().ok())
        .with_context(|| format!("{prefix}: not a prefix"))
}

/// The FRR router: the image's own start script, after the daemons and configuration files are
/// written from the environment (a single topology file, with nothing beside it to bind-mount).
fn router_node(
    topology: &Topology,
    host: &Host,
    settings: &Settings,
    exec: Vec<String>,
) -> anyhow::Result<Node> {
    let mut sysctls = host_sysctls(host);
    // As in the lab: replies from a node may come over the lab segment while the route to their
    // source points at an unnumbered link.
    sysctls.insert("net.ipv4.conf.all.rp_filter", "0");
    sysctls.insert("net.ipv4.conf.default.rp_filter", "0");
    Ok(Node {
        kind: "linux",
        image: Some(settings.frr_image.clone()),
        env: BTreeMap::from([
            ("FRR_DAEMONS", frr_daemons()),
            ("FRR_CONF", frr_conf(topology)?),
        ]),
        // `$$` is containerlab's escape for a `$` it must not expand itself (it substitutes
        // environment variables in the whole file before reading it).
        cmd: Some(
            "sh -c 'printf %s \"$$FRR_DAEMONS\" > /etc/frr/daemons && printf %s \"$$FRR_CONF\" > /etc/frr/frr.conf && exec /usr/lib/frr/docker-start'"
                .into(),
        ),
        sysctls,
        exec,
        ..Node::default()
    })
}

/// FRR's daemons file: bgpd and bfdd as in the lab's router (zebra, mgmtd and staticd always
/// run); the vty listens on loopback only.
fn frr_daemons() -> String {
    String::from(
        "bgpd=yes\nbfdd=yes\nvtysh_enable=yes\nzebra_options=\" -A 127.0.0.1 -s 90000000\"\nbgpd_options=\" -A 127.0.0.1\"\nbfdd_options=\" -A 127.0.0.1\"\n",
    )
}

/// FRR's integrated configuration: the lab router's bgpd and bfdd configurations under one
/// header, so the two cannot drift apart; unnumbered neighbours are named by containerlab's
/// interface names.
pub fn frr_conf(topology: &Topology) -> anyhow::Result<String> {
    let bgp = crate::router::frr_config(&with_clab_link_names(topology)?);
    let bfd = crate::router::bfdd_config(topology);
    let (header, bgp_body) = split_header(&bgp);
    let (_, bfd_body) = split_header(&bfd);
    Ok(format!("{header}{bfd_body}{bgp_body}"))
}

/// A daemon configuration's header (`frr defaults`, hostname, log; up to the first `!` line) and
/// the rest: an integrated configuration takes the header once.
fn split_header(config: &str) -> (&str, &str) {
    match config.find("\n!\n") {
        Some(at) => config.split_at(at + 3),
        None => ("", config),
    }
}

fn links(topology: &Topology, settings: &Settings) -> anyhow::Result<Vec<Link>> {
    let mut links = Vec::new();
    for segment in &topology.segments {
        let members: Vec<(&Host, usize)> = topology
            .hosts
            .iter()
            .flat_map(|h| {
                h.interfaces
                    .iter()
                    .enumerate()
                    .filter(|(_, i)| i.segment == segment.name)
                    .map(move |(n, _)| (h, n))
            })
            .collect();
        let endpoint = |(host, n): (&Host, usize)| {
            format!("{}:{}", node_name(settings, host), clab_interface(n))
        };
        if is_bridged(topology, &segment.name) {
            let bridge = bridge_name(&segment.name);
            for &(host, n) in &members {
                // The bridge's end of the veth lives in the host namespace: a unique name there.
                let port = format!("flb-{}-e{}", host.name, n + 1);
                if port.len() > IFNAME_MAX {
                    bail!("bridge port name {port} is longer than {IFNAME_MAX} characters");
                }
                links.push(Link {
                    endpoints: [endpoint((host, n)), format!("{bridge}:{port}")],
                });
            }
        } else if let [a, b] = members[..] {
            links.push(Link {
                endpoints: [endpoint(a), endpoint(b)],
            });
        }
    }
    // Unnumbered links: a veth between their two ends, like the two-member segment.
    let link_end = |end: &LinkEnd| -> anyhow::Result<String> {
        let host = topology
            .host(&end.host)
            .with_context(|| format!("a link names no host {}", end.host))?;
        Ok(format!(
            "{}:{}",
            node_name(settings, host),
            clab_interface_named(&end.interface)?
        ))
    };
    for link in &topology.links {
        let [a, b] = &link.ends;
        links.push(Link {
            endpoints: [link_end(a)?, link_end(b)?],
        });
    }
    if let Some(long) = bridges(topology).into_iter().find(|b| b.len() > IFNAME_MAX) {
        bail!("bridge name {long} is longer than {IFNAME_MAX} characters");
    }
    Ok(links)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_header_keeps_the_header_once() {
        let (header, body) = split_header("frr defaults traditional\nhostname x\n!\nbfd\n!\n");
        assert_eq!(header, "frr defaults traditional\nhostname x\n!\n");
        assert_eq!(body, "bfd\n!\n");
        assert_eq!(split_header("no header"), ("", "no header"));
    }

    #[test]
    fn link_ends_are_renamed_as_containerlab_names_interfaces() {
        assert_eq!(clab_interface_named("eth1").ok().as_deref(), Some("eth2"));
        assert_eq!(clab_interface_named("eth2").ok().as_deref(), Some("eth3"));
        assert!(clab_interface_named("swp1").is_err());
    }
}
