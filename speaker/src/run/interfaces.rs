//! Reads the node's network interfaces from sysfs. Polled (every 100 ms): reading a
//! few small files costs microseconds, and a cut link is then noticed well within the failure
//! timeout without a netlink dependency.

use std::collections::BTreeMap;
use std::path::Path;

use ferrolb_speaker::l2::interfaces::{Interface, oper_up, parse_flags, parse_mac};

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
