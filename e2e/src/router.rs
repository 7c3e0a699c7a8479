//! The lab router: FRR (zebra, bfdd and bgpd) in its own namespace and its own path space,
//! peering passively with every node so speakers (ferrolb, or GoBGP in the proof test) can
//! connect, with BFD (profile `nodes`) on every such session.

use std::path::Path;

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

/// bgpd's configuration.
pub fn frr_config(topology: &Topology) -> String {
    let (asn, _) = router_role(topology);
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
    c += " address-family ipv4 unicast\n  neighbor nodes activate\n  maximum-paths 16\n exit-address-family\n";
    c += " address-family ipv6 unicast\n  neighbor nodes activate\n  maximum-paths 16\n exit-address-family\n!\n";
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
