//! Which network interfaces may carry announcements.
//!
//! [`read`] reads them from `/sys/class/net`, polled every 100 ms: reading a few small files
//! costs microseconds, and a cut link is then noticed well within the failure timeout without a
//! netlink dependency. The rules that pick the usable ones are pure, so they are tested without a
//! network.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// How often interfaces are read.
pub const POLL: Duration = Duration::from_millis(100);

/// Name prefixes of interfaces never announced on (MetalLB's list): container, bridge, tunnel and
/// virtual interfaces that no client's ARP or NDP reaches.
pub const DEFAULT_IGNORED_PREFIXES: &[&str] = &[
    "docker",
    "cbr",
    "dummy",
    "virbr",
    "lxcbr",
    "veth",
    "lo",
    "cali",
    "tunl",
    "flannel",
    "kube-ipvs",
    "cni",
    "nodelocaldns",
    "lxc",
];

/// `IFF_UP`: administratively up.
pub const IFF_UP: u32 = 0x1;
/// `IFF_NOARP`: the interface does not do ARP.
pub const IFF_NOARP: u32 = 0x80;

/// One network interface of the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// Name, such as `eth0`.
    pub name: String,
    /// Kernel interface index.
    pub index: u32,
    /// Hardware (MAC) address; interfaces without a 6-byte one cannot answer ARP.
    pub mac: Option<[u8; 6]>,
    /// `IFF_*` flags.
    pub flags: u32,
    /// Operational state is up (carrier present). `unknown` counts as up: many virtual drivers
    /// never report a state.
    pub oper_up: bool,
    /// Enslaved to a bond or bridge (the master answers, not the slave).
    pub enslaved: bool,
}

impl Interface {
    /// Whether announcements may go out of this interface: up with carrier, does ARP, has a MAC,
    /// not enslaved, not ignored by name.
    pub fn usable(&self, ignored_prefixes: &[String]) -> bool {
        self.flags & IFF_UP != 0
            && self.flags & IFF_NOARP == 0
            && self.oper_up
            && self.mac.is_some()
            && !self.enslaved
            && !ignored_prefixes
                .iter()
                .any(|p| self.name.starts_with(p.as_str()))
    }
}

/// Parses a MAC address as sysfs prints it (`aa:bb:cc:dd:ee:ff`); `None` for other lengths
/// and for the all-zero address of interfaces without one.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    (parts.next().is_none() && mac != [0; 6]).then_some(mac)
}

/// Parses interface flags as sysfs prints them (`0x1003`).
pub fn parse_flags(text: &str) -> Option<u32> {
    u32::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
}

/// Whether an `operstate` value means the link carries traffic.
pub fn oper_up(operstate: &str) -> bool {
    matches!(operstate.trim(), "up" | "unknown")
}

/// Every interface of the node's network namespace, by name. Interfaces that vanish while
/// being read are skipped.
pub fn read() -> BTreeMap<String, Interface> {
    let Ok(entries) = std::fs::read_dir("/sys/class/net") else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let dir = entry.path();
            let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
            let index: u32 = read("ifindex")?.trim().parse().ok()?;
            let iface = Interface {
                mac: read("address").as_deref().and_then(parse_mac),
                flags: read("flags").as_deref().and_then(parse_flags)?,
                oper_up: read("operstate").as_deref().is_some_and(oper_up),
                enslaved: Path::new(&dir.join("master")).exists(),
                index,
                name: name.clone(),
            };
            Some((name, iface))
        })
        .collect()
}

/// Reads the interfaces into `links` every [`POLL`], and wakes the work loop through `changed`
/// when they change.
pub(crate) async fn poll(
    links: std::sync::Arc<std::sync::Mutex<BTreeMap<String, Interface>>>,
    changed: std::sync::Arc<tokio::sync::Notify>,
) {
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = read();
        let mut current = links.lock().unwrap_or_else(|p| p.into_inner());
        if *current != now {
            *current = now;
            changed.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn eth(name: &str) -> Interface {
        Interface {
            name: name.into(),
            index: 2,
            mac: Some([2, 0, 0, 0, 0, 1]),
            flags: 0x1003,
            oper_up: true,
            enslaved: false,
        }
    }

    fn defaults() -> Vec<String> {
        DEFAULT_IGNORED_PREFIXES
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    #[test]
    fn usable_rules() {
        let ignored = defaults();
        assert!(eth("eth0").usable(&ignored));
        assert!(eth("ens3").usable(&ignored));
        for name in ["lo", "veth12ab", "docker0", "cali1", "kube-ipvs0", "cni0"] {
            assert!(!eth(name).usable(&ignored), "{name}");
        }
        let down = Interface {
            flags: 0x1002,
            ..eth("eth0")
        };
        assert!(!down.usable(&ignored));
        let no_carrier = Interface {
            oper_up: false,
            ..eth("eth0")
        };
        assert!(!no_carrier.usable(&ignored));
        let noarp = Interface {
            flags: 0x1003 | IFF_NOARP,
            ..eth("eth0")
        };
        assert!(!noarp.usable(&ignored));
        let slave = Interface {
            enslaved: true,
            ..eth("eth0")
        };
        assert!(!slave.usable(&ignored));
        let no_mac = Interface {
            mac: None,
            ..eth("eth0")
        };
        assert!(!no_mac.usable(&ignored));
        assert!(eth("veth0").usable(&[]));
    }

    #[test]
    fn parses_sysfs_values() {
        assert_eq!(
            parse_mac("02:00:c6:12:00:0b\n"),
            Some([2, 0, 0xc6, 0x12, 0, 0xb])
        );
        assert_eq!(parse_mac("00:00:00:00:00:00"), None);
        assert_eq!(parse_mac("02:00:c6"), None);
        assert_eq!(parse_mac("02:00:c6:12:00:0b:00:01"), None);
        assert_eq!(parse_flags("0x1003\n"), Some(0x1003));
        assert!(oper_up("up\n") && oper_up("unknown") && !oper_up("lowerlayerdown"));
    }
}
