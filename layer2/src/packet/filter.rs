//! The classic BPF program attached to the packet socket: only ARP requests and Neighbor
//! Solicitations reach user space, whole.
//!
//! The socket sees every frame of its interface (it is bound to all ethertypes, since it needs
//! two), so the filter does the coarse selection in the kernel and [`parse`](super::parse)
//! does the validation. Besides the ethertype and message type it drops:
//!
//! * frames the host sends itself (`PACKET_OUTGOING`, which a packet socket bound to all
//!   ethertypes also sees: our own gratuitous ARP requests would come back as requests) and
//!   unicast frames for other hosts (`PACKET_OTHERHOST`, seen while something else, tcpdump
//!   say, holds the interface promiscuous);
//! * frames of a VLAN. Linux moves the outer 802.1Q tag into packet metadata before packet
//!   sockets see a frame, whether or not the NIC offloads VLANs, so an ARP request of VLAN 100
//!   arriving on `eth0` looks untagged to a socket on `eth0`. Answering it would answer for the
//!   wrong broadcast domain. VLAN ID 0 (priority tagging) counts as untagged, as Linux treats it.
//!
//! IPv6 packets with extension headers before the ICMPv6 header are dropped: the filter checks
//! that the next header of the fixed header is ICMPv6 (58).

/// One classic BPF instruction (`struct sock_filter` of `linux/filter.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Instruction {
    /// Opcode.
    pub code: u16,
    /// Jump offset if true (relative to the next instruction).
    pub jt: u8,
    /// Jump offset if false.
    pub jf: u8,
    /// Constant operand.
    pub k: u32,
}

// Opcodes, from linux/bpf_common.h and linux/filter.h (BPF_LD and BPF_W are 0).
const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const LD_H_ABS: u16 = 0x28; // BPF_LD | BPF_H | BPF_ABS
const LD_B_ABS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
const ALU_AND_K: u16 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const JMP_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JMP_JGT_K: u16 = 0x25; // BPF_JMP | BPF_JGT | BPF_K
const RET_K: u16 = 0x06; // BPF_RET | BPF_K

/// `SKF_AD_OFF` (-0x1000): absolute loads from here on read packet metadata, not the frame.
const SKF_AD_OFF: u32 = 0xffff_f000;
/// `SKF_AD_PKTTYPE`: the frame's `PACKET_*` type.
const SKF_AD_PKTTYPE: u32 = 4;
/// `SKF_AD_VLAN_TAG`: the VLAN TCI the kernel took off the frame (0 when there was none).
const SKF_AD_VLAN_TAG: u32 = 44;

/// `PACKET_HOST` 0, `PACKET_BROADCAST` 1, `PACKET_MULTICAST` 2 are accepted; `PACKET_OTHERHOST`
/// 3, `PACKET_OUTGOING` 4 and above are not.
const LAST_ACCEPTED_PKTTYPE: u32 = 2;
/// VLAN identifier bits of a TCI.
const VLAN_VID_MASK: u32 = 0x0fff;

/// What an accepting program returns: the number of octets to keep, here all of them.
pub const ACCEPT: u32 = u32::MAX;

const fn ins(code: u16, jt: u8, jf: u8, k: u32) -> Instruction {
    Instruction { code, jt, jf, k }
}

/// The filter program. Jump offsets count instructions after the next one; instruction 14
/// accepts and 15 drops.
pub fn program() -> Vec<Instruction> {
    vec![
        /* 0 */ ins(LD_W_ABS, 0, 0, SKF_AD_OFF + SKF_AD_PKTTYPE),
        /* 1 */ ins(JMP_JGT_K, 13, 0, LAST_ACCEPTED_PKTTYPE), // -> 15 drop
        /* 2 */ ins(LD_W_ABS, 0, 0, SKF_AD_OFF + SKF_AD_VLAN_TAG),
        /* 3 */ ins(ALU_AND_K, 0, 0, VLAN_VID_MASK),
        /* 4 */ ins(JMP_JEQ_K, 0, 10, 0), // tagged -> 15 drop
        /* 5 */ ins(LD_H_ABS, 0, 0, 12), // ethertype
        /* 6 */ ins(JMP_JEQ_K, 1, 0, 0x0806), // ARP -> 8
        /* 7 */ ins(JMP_JEQ_K, 2, 7, 0x86dd), // IPv6 -> 10, else -> 15 drop
        /* 8 */ ins(LD_H_ABS, 0, 0, 14 + 6), // ARP operation
        /* 9 */ ins(JMP_JEQ_K, 4, 5, 1), // request -> 14 accept, else -> 15 drop
        /* 10 */ ins(LD_B_ABS, 0, 0, 14 + 6), // IPv6 next header
        /* 11 */ ins(JMP_JEQ_K, 0, 3, 58), // ICMPv6, else -> 15 drop
        /* 12 */ ins(LD_B_ABS, 0, 0, 14 + 40), // ICMPv6 type
        /* 13 */ ins(JMP_JEQ_K, 0, 1, 135), // NS -> 14 accept, else -> 15 drop
        /* 14 */ ins(RET_K, 0, 0, ACCEPT),
        /* 15 */ ins(RET_K, 0, 0, 0),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every jump lands inside the program and every path ends in a return; the kernel checks
    /// the same when the filter is attached.
    #[test]
    fn jumps_stay_inside() {
        let p = program();
        for (i, insn) in p.iter().enumerate() {
            if insn.code & 0x07 == 0x05 {
                assert!(i + 1 + usize::from(insn.jt) < p.len(), "jt of {i}");
                assert!(i + 1 + usize::from(insn.jf) < p.len(), "jf of {i}");
            }
        }
        assert_eq!(p.last().map(|i| i.code), Some(RET_K));
        assert_eq!(p[14], ins(RET_K, 0, 0, ACCEPT));
    }
}
