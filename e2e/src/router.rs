//! The lab router: FRR (zebra, bfdd and bgpd) in its own namespace and its own path space,
//! peering passively with every node so speakers (ferrolb, or GoBGP in the proof test) can
//! connect, with BFD (profile `nodes`) on every such session, and with an unnumbered neighbour
//! on each of its point-to-point links (the topology's `links`: node1's).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use crate::Lab;
use crate::cluster::wait_for;

use crate::topology::{Role, RouterBfd, Topology};

/// FRR's daemon directory on Debian.
pub const FRR_DIR: &str = "/usr/lib/frr";

/// zebra's configuration: nothing beyond the defaults.
pub fn zebra_config() -> String {
    String::from("frr defaults traditional\nhostname lab-router\nlog stdout informational\n!\n")
}

/// The router's AS number and BFD timers.
fn router_role(topology: &Topology) -> (u32, RouterBfd) {
    topology
        .hosts
        .iter()
        .find_map(|h| match h.role {
            Role::Router { asn, bfd } => Some((asn, bfd)),
            _ => None,
        })
        .unwrap_or((crate::topology::ROUTER_ASN, RouterBfd::default()))
}

/// bfdd's configuration: the profile the router's BGP sessions with the nodes use.
pub fn bfdd_config(topology: &Topology) -> String {
    let (_, bfd) = router_role(topology);
    format!(
        "frr defaults traditional\nhostname lab-router\nlog stdout informational\n!\nbfd\n profile nodes\n  receive-interval {}\n  transmit-interval {}\n  detect-multiplier {}\n exit\n!\nexit\n!\n",
        bfd.receive_interval_ms, bfd.transmit_interval_ms, bfd.detect_multiplier
    )
}

/// The router's interfaces on unnumbered links (`eth2` towards node1 in the standard lab).
pub fn unnumbered_interfaces(topology: &Topology) -> Vec<String> {
    let Some(router) = topology
        .hosts
        .iter()
        .find(|h| matches!(h.role, Role::Router { .. }))
    else {
        return Vec::new();
    };
    topology
        .links_of(&router.name)
        .map(|(mine, _)| mine.interface.clone())
        .collect()
}

/// bgpd's configuration.
pub fn frr_config(topology: &Topology) -> String {
    let (asn, _) = router_role(topology);
    let unnumbered = unnumbered_interfaces(topology);
    let mut c = String::from(
        "frr defaults traditional\nhostname lab-router\nlog stdout informational\n!\n",
    );
    c += &format!(
        "router bgp {asn}\n bgp router-id 198.18.0.254\n bgp log-neighbor-changes\n no bgp ebgp-requires-policy\n no bgp default ipv4-unicast\n bgp bestpath as-path multipath-relax\n"
    );
    // Nodes peer from their lab address; their AS is whatever they say (eBGP, any AS but ours).
    c += " neighbor nodes peer-group\n neighbor nodes remote-as external\n neighbor nodes timers 3 9\n neighbor nodes timers connect 1\n";
    c += " neighbor nodes bfd profile nodes\n";
    c += " bgp listen range 198.18.0.0/24 peer-group nodes\n bgp listen range fd00:18::/120 peer-group nodes\n";
    // Unnumbered neighbours (RFC 8950): found by the Router Advertisements on the link, which
    // bgpd has zebra send there, and reached at their link-local address; FRR negotiates the
    // extended next hop itself for interface neighbours. No BFD: the speaker refuses BFD on
    // unnumbered sessions for now (decision record 0020).
    for i in &unnumbered {
        c += &format!(
            " neighbor {i} interface remote-as external\n neighbor {i} timers 3 9\n neighbor {i} timers connect 1\n"
        );
    }
    let activate: String = unnumbered
        .iter()
        .map(|i| format!("  neighbor {i} activate\n"))
        .collect();
    c += &format!(
        " address-family ipv4 unicast\n  neighbor nodes activate\n{activate}  maximum-paths 16\n exit-address-family\n"
    );
    c += &format!(
        " address-family ipv6 unicast\n  neighbor nodes activate\n{activate}  maximum-paths 16\n exit-address-family\n!\n"
    );
    c
}

/// Runs `commands` (one `-c` each) in vtysh on the lab router; returns what it printed.
pub fn vtysh(lab: &crate::Lab, commands: &[&str]) -> anyhow::Result<String> {
    let socket = lab.dir.join("frr").display().to_string();
    let mut args = vec!["--vty_socket", socket.as_str()];
    for c in commands {
        args.extend(["-c", c]);
    }
    lab.exec("router", "vtysh", &args)
}

/// One command on zebra's vty alone (no other daemon need be up yet), for the lab's build:
/// its output, or why there is none.
pub fn zebra_vty(dir: &Path, command: &str) -> Result<String, String> {
    let out = std::process::Command::new("vtysh")
        .args(["-d", "zebra", "--vty_socket"])
        .arg(dir)
        .args(["-c", command])
        .output()
        .map_err(|e| format!("vtysh: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Arguments of an FRR daemon in the lab's path space `dir`.
pub fn daemon_args(daemon: &str, dir: &Path) -> Vec<String> {
    let d = dir.display();
    let mut args = vec![
        "-N".to_string(),
        "flb-router".to_string(),
        "-f".to_string(),
        format!("{d}/{daemon}.conf"),
        "-i".to_string(),
        format!("{d}/{daemon}.pid"),
        "-z".to_string(),
        format!("{d}/zserv.api"),
        "--vty_socket".to_string(),
        d.to_string(),
    ];
    if daemon == "bgpd" {
        // bgpd listens on every address of the router namespace.
        args.extend(["-p".to_string(), "179".to_string()]);
    }
    if daemon == "bfdd" {
        args.extend(["--bfdctl".to_string(), format!("{d}/bfdd.sock")]);
    }
    args
}

// What the router learnt, and what reaches the Service through it: the checks BGP tests make
// for ferrolb and for MetalLB alike.

/// How long a route change may take to reach the router: UPDATEs are sent at once, so this is
/// generous; a hold timer expiry (9 s) plus reconnect (connectTime 1 s, doubling) fits too.
pub const ROUTE_TIMEOUT: Duration = Duration::from_secs(40);

/// The prefix of a Service IP (host route).
pub fn prefix(ip: &str) -> String {
    if ip.contains(':') {
        format!("{ip}/128")
    } else {
        format!("{ip}/32")
    }
}

/// The lab node owning an address (either family) on the lab segment.
pub fn node_of_address(lab: &Lab, address: &str) -> Option<String> {
    lab.topology.nodes().find_map(|n| {
        let i = &n.interfaces[0];
        (i.ipv4.to_string() == address || i.ipv6.to_string() == address).then(|| n.name.clone())
    })
}

/// The router's BGP table entry (vtysh JSON) for the host route of `ip`.
pub fn router_route(lab: &Lab, ip: &str) -> anyhow::Result<serde_json::Value> {
    let family = if ip.contains(':') { "ipv6" } else { "ipv4" };
    let socket = lab.dir.join("frr").display().to_string();
    let command = format!("show bgp {family} unicast {} json", prefix(ip));
    let out = lab.exec(
        "router",
        "vtysh",
        &["--vty_socket", &socket, "-c", &command],
    )?;
    // A prefix not in the table prints `{}` (or a warning object): no paths.
    Ok(serde_json::from_str(&out).unwrap_or_default())
}

/// The router's paths for the host route of `ip`: for each, the node it came from (the BGP
/// neighbour) and the nodes its next hops name.
pub fn router_paths(lab: &Lab, ip: &str) -> anyhow::Result<Vec<(String, BTreeSet<String>)>> {
    let json = router_route(lab, ip)?;
    let mut paths = Vec::new();
    for path in json["paths"].as_array().into_iter().flatten() {
        let peer = path["peer"]["peerId"].as_str().unwrap_or_default();
        let from = node_of_address(lab, peer).unwrap_or_else(|| format!("?{peer}"));
        let next_hops = path["nexthops"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h["ip"].as_str())
            // IPv6 paths may carry the neighbour's link-local address beside the global one.
            .filter(|a| !a.starts_with("fe80:"))
            .map(|a| node_of_address(lab, a).unwrap_or_else(|| format!("?{a}")))
            .collect();
        paths.push((from, next_hops));
    }
    Ok(paths)
}

/// Waits until the router's paths for `ip` come from exactly `nodes`, each with its own address
/// as next hop.
pub async fn wait_advertised_by(lab: &Lab, ip: &str, nodes: &[&str]) -> anyhow::Result<()> {
    let want: BTreeSet<String> = nodes.iter().map(|n| n.to_string()).collect();
    wait_for(
        &format!("the router's paths for {ip} to come from {want:?}"),
        ROUTE_TIMEOUT,
        || async {
            let paths = router_paths(lab, ip).map_err(|e| e.to_string())?;
            let from: BTreeSet<String> = paths.iter().map(|(f, _)| f.clone()).collect();
            let hops_ok = paths
                .iter()
                .all(|(f, hops)| hops.contains(f) && hops.iter().all(|h| h == f));
            if from == want && paths.len() == want.len() && hops_ok {
                Ok(Some(()))
            } else {
                Err(format!("paths (neighbour, next hops): {paths:?}"))
            }
        },
    )
    .await
}

/// HTTP through `ip` from the external client: the answering pod.
pub fn http_from_ext(lab: &Lab, ip: &str) -> anyhow::Result<String> {
    Ok(lab.http_from("ext", ip)?.0)
}

/// Waits until HTTP from the external client through `ip` has been answered by `want` different
/// pods (kube-proxy programs the Service's rules a little after its endpoints are ready: until
/// then requests are dropped or rejected, so failures are retried).
pub async fn wait_http_pods(lab: &Lab, ip: &str, want: usize) -> anyhow::Result<BTreeSet<String>> {
    let mut pods = BTreeSet::new();
    wait_for(
        &format!("{want} pod(s) to answer through {ip} from ext"),
        Duration::from_secs(30),
        || {
            let answer = http_from_ext(lab, ip);
            if let Ok(pod) = &answer {
                pods.insert(pod.clone());
            }
            let seen = format!("pods {pods:?}, last {answer:?}");
            let done = pods.len() >= want;
            async move { if done { Ok(Some(())) } else { Err(seen) } }
        },
    )
    .await?;
    Ok(pods)
}

/// Waits until the router installed the route in its kernel table: for IPv4 with every node as
/// next hop; for IPv6 with as many next hops (zebra may prefer link-local next hops).
pub async fn wait_installed(lab: &Lab, ip: &str, nodes: &[&str]) -> anyhow::Result<()> {
    let v6 = ip.contains(':');
    let family = if v6 { "-6" } else { "-4" };
    let want = nodes
        .iter()
        .map(|n| Ok(lab.ipv4_of(n)?.to_string()))
        .collect::<anyhow::Result<Vec<String>>>()?;
    wait_for(
        &format!("the router to install {ip} via {nodes:?}"),
        ROUTE_TIMEOUT,
        || async {
            let out = lab
                .exec("router", "ip", &[family, "route", "show", &prefix(ip)])
                .map_err(|e| e.to_string())?;
            let hops_ok = if v6 {
                // One next hop is written inline, several as `nexthop via` lines.
                nodes.len() == 1 || out.matches("nexthop via").count() == nodes.len()
            } else {
                want.iter().all(|a| out.contains(&format!("via {a} ")))
            };
            if out.contains("proto bgp") && hops_ok {
                Ok(Some(()))
            } else {
                Err(format!("router route: {out:?}"))
            }
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Options;

    #[test]
    fn unnumbered_link_is_a_neighbour_in_both_families_without_bfd() {
        let t = Topology::standard(Options::default());
        assert_eq!(unnumbered_interfaces(&t), ["eth2"]);
        let c = frr_config(&t);
        for line in [
            " neighbor eth2 interface remote-as external\n",
            " neighbor eth2 timers 3 9\n",
            " neighbor eth2 timers connect 1\n",
            " address-family ipv4 unicast\n  neighbor nodes activate\n  neighbor eth2 activate\n",
            " address-family ipv6 unicast\n  neighbor nodes activate\n  neighbor eth2 activate\n",
        ] {
            assert!(c.contains(line), "{line:?} missing from:\n{c}");
        }
        assert!(!c.contains("neighbor eth2 bfd"), "{c}");
        // The node peer group keeps its BFD.
        assert!(c.contains(" neighbor nodes bfd profile nodes\n"), "{c}");
    }

    #[test]
    fn no_links_no_interface_neighbours() {
        let mut t = Topology::standard(Options::default());
        t.links.clear();
        let c = frr_config(&t);
        assert!(!c.contains(" interface "), "{c}");
        assert_eq!(c.matches(" activate\n").count(), 2, "{c}");
    }
}
