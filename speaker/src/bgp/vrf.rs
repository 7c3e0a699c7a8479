//! The addresses of a VRF on this node: those of the VRF device and of the interfaces enslaved
//! to it (sysfs `master` link), read with getifaddrs. A BGPPeer in a VRF takes the next hop of
//! the family its session does not run over from here.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;

/// Every address in VRF `vrf`, in a stable order; empty when the node has no such device.
pub fn addresses(vrf: &str) -> Vec<IpAddr> {
    let members = members(vrf);
    if members.is_empty() {
        return Vec::new();
    }
    let Ok(ifaddrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out = BTreeSet::new();
    for a in ifaddrs.filter(|a| members.contains(&a.interface_name)) {
        let Some(addr) = a.address else { continue };
        if let Some(v4) = addr.as_sockaddr_in() {
            out.insert(IpAddr::V4(v4.ip()));
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            out.insert(IpAddr::V6(v6.ip()));
        }
    }
    out.into_iter().collect()
}

/// The VRF device and the interfaces whose master it is.
fn members(vrf: &str) -> BTreeSet<String> {
    let net = Path::new("/sys/class/net");
    if !net.join(vrf).exists() {
        return BTreeSet::new();
    }
    let mut names = BTreeSet::from([vrf.to_string()]);
    if let Ok(entries) = std::fs::read_dir(net) {
        for entry in entries.flatten() {
            let master = std::fs::read_link(entry.path().join("master")).ok();
            if master.as_deref().and_then(Path::file_name) == Some(vrf.as_ref()) {
                names.insert(entry.file_name().to_string_lossy().into_owned());
            }
        }
    }
    names
}
