//! Asking NDP who has an IPv6 address, counting every answer (`ferrolb-lab ndp-solicit`).
//!
//! ndisc6 drops a Neighbor Advertisement whose source is a link-local address when the target is
//! a global one (it compares the reply's scope with the target's): Linux answers from the target
//! address itself and ferrolb does too, but MetalLB answers from the interface's link-local
//! address, as RFC 4861 §7.2.4 allows, and ndisc6 saw none of MetalLB's answers. A split-brain
//! check must count every answer, whatever its source, so the lab asks with this instead.

use std::io::Read;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ferrolb_layer2::packet::ndp::{
    ND_HOP_LIMIT, TYPE_NEIGHBOR_ADVERTISEMENT, TYPE_NEIGHBOR_SOLICITATION, solicited_node_multicast,
};
use socket2::{Domain, Protocol, Socket, Type};

/// ICMPv6 option type of a Source Link-Layer Address (RFC 4861 §4.6.1).
const OPTION_SOURCE_LINK_ADDRESS: u8 = 1;
/// ICMPv6 option type of a Target Link-Layer Address.
const OPTION_TARGET_LINK_ADDRESS: u8 = 2;

/// A Neighbor Solicitation for `target` from a host with MAC `mac` (ICMPv6 message only: the
/// kernel fills in the checksum of a raw ICMPv6 socket's messages).
pub fn solicitation(target: Ipv6Addr, mac: [u8; 6]) -> Vec<u8> {
    let mut m = vec![TYPE_NEIGHBOR_SOLICITATION, 0, 0, 0, 0, 0, 0, 0];
    m.extend_from_slice(&target.octets());
    m.extend_from_slice(&[OPTION_SOURCE_LINK_ADDRESS, 1]);
    m.extend_from_slice(&mac);
    m
}

/// The Target Link-Layer Address of a Neighbor Advertisement for `target` (an ICMPv6 message as
/// a raw socket reads it), or `None` for any other message.
pub fn advertised_mac(message: &[u8], target: Ipv6Addr) -> Option<[u8; 6]> {
    advertisement(message).and_then(|(t, mac)| (t == target).then_some(mac))
}

/// The target and Target Link-Layer Address of a Neighbor Advertisement (an ICMPv6 message as a
/// raw socket reads it), or `None` for any other message.
pub fn advertisement(message: &[u8]) -> Option<(Ipv6Addr, [u8; 6])> {
    if message.len() < 24 || message[0] != TYPE_NEIGHBOR_ADVERTISEMENT || message[1] != 0 {
        return None;
    }
    let target: [u8; 16] = message[8..24].try_into().ok()?;
    let target = Ipv6Addr::from(target);
    let mut options = &message[24..];
    while options.len() >= 8 {
        let len = usize::from(options[1]) * 8;
        if len == 0 || len > options.len() {
            return None;
        }
        if options[0] == OPTION_TARGET_LINK_ADDRESS {
            return Some((target, options[2..8].try_into().ok()?));
        }
        options = &options[len..];
    }
    None
}

/// A raw ICMPv6 socket on one interface that sends Neighbor Solicitations and reads the
/// advertisements that answer them (any target, any source).
pub struct Asker {
    socket: Socket,
    index: u32,
    mac: [u8; 6],
}

impl Asker {
    /// Opens the socket on `interface`.
    pub fn open(interface: &str) -> anyhow::Result<Self> {
        let mac_file = format!("/sys/class/net/{interface}/address");
        let mac_hex =
            std::fs::read_to_string(&mac_file).with_context(|| format!("reading {mac_file}"))?;
        let mut mac = [0u8; 6];
        for (byte, part) in mac.iter_mut().zip(mac_hex.trim().split(':')) {
            *byte =
                u8::from_str_radix(part, 16).with_context(|| format!("{mac_file}: {mac_hex:?}"))?;
        }
        let index = interface_index(interface)?;
        let socket = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
        socket.bind_device(Some(interface.as_bytes()))?;
        socket.set_multicast_hops_v6(u32::from(ND_HOP_LIMIT))?;
        socket.set_unicast_hops_v6(u32::from(ND_HOP_LIMIT))?;
        socket.set_multicast_if_v6(index)?;
        Ok(Self { socket, index, mac })
    }

    /// Sends one solicitation for `target` to its solicited-node group.
    pub fn ask(&self, target: Ipv6Addr) -> anyhow::Result<()> {
        let group = SocketAddrV6::new(solicited_node_multicast(target), 0, 0, self.index);
        self.socket
            .send_to(&solicitation(target, self.mac), &group.into())?;
        Ok(())
    }

    /// The next advertisement read before `until`: its target and MAC; `None` once `until`
    /// has passed.
    pub fn answer_before(&self, until: Instant) -> anyhow::Result<Option<(Ipv6Addr, [u8; 6])>> {
        let mut buf = [0u8; 1500];
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // socket2 passes the timeout in whole microseconds: less than one would be zero,
            // which the kernel takes for "wait for ever".
            self.socket
                .set_read_timeout(Some(left.max(Duration::from_micros(1))))?;
            let n = match (&self.socket).read(&mut buf) {
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None);
                }
                Err(e) => return Err(e.into()),
            };
            if let Some(answer) = advertisement(&buf[..n]) {
                return Ok(Some(answer));
            }
        }
    }
}

/// Formats a MAC as ndisc6 does (upper-case hex, colons).
pub fn mac_text(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Sends `count` solicitations for `target` on `interface`, each followed by `wait` of listening,
/// and prints one line per answer, as ndisc6 -m does: `Target link-layer address: MAC`.
pub fn solicit(
    interface: &str,
    target: Ipv6Addr,
    count: u32,
    wait: Duration,
) -> anyhow::Result<()> {
    let asker = Asker::open(interface)?;
    for _ in 0..count {
        asker.ask(target)?;
        let until = Instant::now() + wait;
        while let Some((answered, mac)) = asker.answer_before(until)? {
            if answered == target {
                println!("Target link-layer address: {}", mac_text(mac));
            }
        }
    }
    Ok(())
}

/// The index of network interface `name`.
fn interface_index(name: &str) -> anyhow::Result<u32> {
    let file = format!("/sys/class/net/{name}/ifindex");
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {file}"))?;
    match text.trim().parse() {
        Ok(i) => Ok(i),
        Err(_) => bail!("{file}: {text:?} is no interface index"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x18, 0, 0, 0, 0, 0xc8, 0);

    #[test]
    fn solicitation_bytes() {
        let m = solicitation(TARGET, [2, 0, 0, 0, 0, 1]);
        assert_eq!(m.len(), 32);
        assert_eq!(m[0], 135);
        assert_eq!(&m[8..24], &TARGET.octets());
        assert_eq!(&m[24..], &[1, 1, 2, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn reads_the_target_link_address_of_an_advertisement() {
        // As MetalLB sends it: Solicited only, the target link-layer address option.
        let mut na = vec![136, 0, 0, 0, 0x40, 0, 0, 0];
        na.extend_from_slice(&TARGET.octets());
        na.extend_from_slice(&[2, 1, 0x46, 0xa5, 0x9f, 0xb6, 0xe1, 0xc9]);
        assert_eq!(
            advertised_mac(&na, TARGET),
            Some([0x46, 0xa5, 0x9f, 0xb6, 0xe1, 0xc9])
        );
        assert_eq!(
            mac_text([0x46, 0xa5, 0x9f, 0xb6, 0xe1, 0xc9]),
            "46:A5:9F:B6:E1:C9"
        );
        // Another target, a solicitation, a truncated or zero-length option: no answer.
        assert_eq!(advertised_mac(&na, Ipv6Addr::LOCALHOST), None);
        let mut ns = na.clone();
        ns[0] = 135;
        assert_eq!(advertised_mac(&ns, TARGET), None);
        assert_eq!(advertised_mac(&na[..30], TARGET), None);
        let mut zero = na.clone();
        zero[25] = 0;
        assert_eq!(advertised_mac(&zero, TARGET), None);
        // Another option first is skipped.
        let mut two = na[..24].to_vec();
        two.extend_from_slice(&[1, 1, 9, 9, 9, 9, 9, 9]);
        two.extend_from_slice(&na[24..]);
        assert_eq!(
            advertised_mac(&two, TARGET),
            Some([0x46, 0xa5, 0x9f, 0xb6, 0xe1, 0xc9])
        );
    }
}
