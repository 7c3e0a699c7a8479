//! RFC 8950 (IPv4 NLRI with an IPv6 next hop, "extended next hop encoding") as BGP unnumbered
//! needs it: the capability, IPv4 unicast in MP_REACH_NLRI / MP_UNREACH_NLRI, and IPv6 next
//! hops of 16 and 32 octets.
//!
//! Unlike bgp_vectors.rs these vectors are not captures: each was written out by hand from the
//! layouts of RFC 8950 §3 (capability), RFC 4760 §3-4 (MP_REACH_NLRI, MP_UNREACH_NLRI) and RFC
//! 2545 §3 (IPv6 next hop), with the length fields counted by hand, so they check our encoder
//! against the RFCs rather than against itself.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{Ipv4Addr, Ipv6Addr};

use ferrolb_bgp::adj_out::{AdjRibOut, RouteAttributes, SessionContext, diff};
use ferrolb_bgp::packet::iana::{error_code, update_subcode};
use ferrolb_bgp::packet::{
    AfiSafi, AsPath, Capability, CodecContext, ExtendedNextHop, Message, MpNextHop, MpReach,
    MpUnreach, Nlri, Open, Origin, PathAttributes, Update,
};
use ipnet::{IpNet, Ipv4Net};
use proptest::prelude::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn ctx() -> CodecContext {
    CodecContext::default()
}

fn decode(bytes: &[u8]) -> Message {
    assert_eq!(Message::frame_len(bytes).unwrap(), Some(bytes.len()));
    Message::decode(bytes, &ctx()).unwrap()
}

/// Decodes to `expected` and encodes back to the same bytes.
fn assert_canonical(wire: &str, expected: &Message) {
    let bytes = hex(wire);
    assert_eq!(&decode(&bytes), expected);
    assert_eq!(expected.to_bytes(&ctx()).unwrap(), bytes);
}

const LINK_LOCAL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
const GLOBAL: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x18, 0, 0, 0, 0, 0, 1);
const ROUTER_ID: Ipv4Addr = Ipv4Addr::new(198, 18, 250, 10);

fn prefix() -> Ipv4Net {
    "198.18.201.1/32".parse().unwrap()
}

/// The session of an eBGP speaker in AS 64512 with extended next hop negotiated and no IPv4
/// next hop, with these IPv6 next hops.
fn session(global: Option<Ipv6Addr>, link_local: Option<Ipv6Addr>) -> SessionContext {
    SessionContext {
        local_as: 64512,
        internal: false,
        families: vec![AfiSafi::IPV4_UNICAST, AfiSafi::IPV6_UNICAST],
        next_hop_v4: None,
        next_hop_v6: global,
        next_hop_v6_link_local: link_local,
        extended_next_hop: true,
        codec: ctx(),
    }
}

/// The one UPDATE that announces 198.18.201.1/32 on `session`.
fn announcement(session: &SessionContext) -> Message {
    let desired: AdjRibOut = [(IpNet::V4(prefix()), RouteAttributes::default())].into();
    let (mut updates, sent) = diff(&AdjRibOut::new(), &desired, session).unwrap();
    assert_eq!(sent, desired);
    assert_eq!(updates.len(), 1);
    Message::Update(updates.remove(0))
}

fn expected_announcement(next_hop: MpNextHop) -> Message {
    Message::Update(Update {
        attributes: PathAttributes {
            origin: Some(Origin::Igp),
            as_path: Some(AsPath::sequence(&[64512])),
            mp_reach: Some(MpReach {
                next_hop,
                nlri: Nlri::Ipv4Unicast(vec![prefix()]),
            }),
            ..PathAttributes::default()
        },
        ..Update::default()
    })
}

// ---------------------------------------------------------------- capability (RFC 8950 §3)

/// An OPEN (AS 64512, hold 90, id 198.18.250.10) whose only capability is extended next hop
/// for IPv4 unicast with IPv6 next hops: code 5, length 6, NLRI AFI 1, NLRI SAFI 1 (two
/// octets here, unlike in the multiprotocol capability), next hop AFI 2.
const OPEN_ENHE: &str = "ffffffffffffffffffffffffffffffff 0027 01
    04 fc00 005a c612fa0a 0a 02 08 05 06 0001 0001 0002";

#[test]
fn extended_next_hop_capability_vector() {
    let open = Open {
        my_as: 64512,
        hold_time: 90,
        bgp_id: ROUTER_ID,
        capabilities: vec![Capability::ExtendedNextHop(vec![
            ExtendedNextHop::IPV4_UNICAST_OVER_IPV6,
        ])],
    };
    assert_canonical(OPEN_ENHE, &Message::Open(open.clone()));
    assert_eq!(
        open.extended_next_hops().collect::<Vec<_>>(),
        [ExtendedNextHop {
            afi: 1,
            safi: 1,
            next_hop_afi: 2
        }]
    );
    assert_eq!(
        open.capabilities[0].to_bytes().unwrap(),
        hex("05 06 0001 0001 0002")
    );
}

/// Two entries in one capability: IPv4 unicast and IPv4 VPN (SAFI 128), both over IPv6.
const OPEN_ENHE_TWO: &str = "ffffffffffffffffffffffffffffffff 002d 01
    04 fc00 005a c612fa0a 10 02 0e 05 0c 0001 0001 0002 0001 0080 0002";

#[test]
fn extended_next_hop_capability_with_two_entries() {
    let open = Open {
        my_as: 64512,
        hold_time: 90,
        bgp_id: ROUTER_ID,
        capabilities: vec![Capability::ExtendedNextHop(vec![
            ExtendedNextHop::IPV4_UNICAST_OVER_IPV6,
            ExtendedNextHop {
                afi: 1,
                safi: 128,
                next_hop_afi: 2,
            },
        ])],
    };
    assert_canonical(OPEN_ENHE_TWO, &Message::Open(open));
}

#[test]
fn malformed_extended_next_hop_capability_is_kept_as_unknown() {
    // Not a multiple of six octets, or empty (RFC 8950 §3: one or more triples). Ignoring the
    // capability is safe (docs/decisions/0010), so the OPEN still decodes.
    for (len, value) in [("05", "0001000100"), ("07", "00010001000200"), ("00", "")] {
        let caps_len = 2 + value.len() / 2;
        let wire = format!(
            "ffffffffffffffffffffffffffffffff {:04x} 01 04 fc00 005a c612fa0a {:02x} 02 {:02x} 05 {len} {value}",
            19 + 10 + 2 + caps_len,
            2 + caps_len,
            caps_len,
        );
        let Message::Open(open) = decode(&hex(&wire)) else {
            panic!("not an OPEN")
        };
        assert_eq!(
            open.capabilities,
            [Capability::Unknown {
                code: 5,
                value: hex(value)
            }]
        );
        assert_eq!(open.extended_next_hops().count(), 0);
    }
}

// ---------------------------------------------------------------- UPDATE (RFC 8950 §4)

/// 198.18.201.1/32 from AS 64512 on an unnumbered session: ORIGIN IGP, AS_PATH [64512],
/// MP_REACH_NLRI (optional, length 42) with AFI 1, SAFI 1, next hop length 32 holding fe80::1
/// twice (see `MpNextHop::ipv6` for why), reserved 0, NLRI /32 198.18.201.1. No NEXT_HOP.
const UPDATE_V4_LINK_LOCAL: &str = "ffffffffffffffffffffffffffffffff 0051 02 0000 003a
    40010100 400206 02 01 0000fc00
    800e2a 0001 01 20 fe800000000000000000000000000001 fe800000000000000000000000000001 00
    20 c612c901";

#[test]
fn ipv4_prefix_with_link_local_only_next_hop() {
    let expected = expected_announcement(MpNextHop::Ipv6 {
        global: LINK_LOCAL,
        link_local: Some(LINK_LOCAL),
    });
    assert_canonical(UPDATE_V4_LINK_LOCAL, &expected);
    assert_eq!(announcement(&session(None, Some(LINK_LOCAL))), expected);
    // The speaker's local address on an unnumbered session is the link-local one; given as
    // the "global" next hop it is still encoded as link-local.
    assert_eq!(announcement(&session(Some(LINK_LOCAL), None)), expected);
}

/// The same with global fd00:18::1 and link-local fe80::1 (RFC 2545 §3: 32 octets, global
/// first).
const UPDATE_V4_GLOBAL_AND_LINK_LOCAL: &str = "ffffffffffffffffffffffffffffffff 0051 02 0000 003a
    40010100 400206 02 01 0000fc00
    800e2a 0001 01 20 fd000018000000000000000000000001 fe800000000000000000000000000001 00
    20 c612c901";

#[test]
fn ipv4_prefix_with_global_and_link_local_next_hop() {
    let expected = expected_announcement(MpNextHop::Ipv6 {
        global: GLOBAL,
        link_local: Some(LINK_LOCAL),
    });
    assert_canonical(UPDATE_V4_GLOBAL_AND_LINK_LOCAL, &expected);
    assert_eq!(
        announcement(&session(Some(GLOBAL), Some(LINK_LOCAL))),
        expected
    );
}

/// The same with the global next hop alone: next hop length 16, MP_REACH_NLRI length 26.
const UPDATE_V4_GLOBAL: &str = "ffffffffffffffffffffffffffffffff 0041 02 0000 002a
    40010100 400206 02 01 0000fc00
    800e1a 0001 01 10 fd000018000000000000000000000001 00
    20 c612c901";

#[test]
fn ipv4_prefix_with_global_next_hop() {
    let expected = expected_announcement(MpNextHop::Ipv6 {
        global: GLOBAL,
        link_local: None,
    });
    assert_canonical(UPDATE_V4_GLOBAL, &expected);
    assert_eq!(announcement(&session(Some(GLOBAL), None)), expected);
}

/// What FRR ≥ 10.4 sends once the Link-Local Next Hop capability is negotiated, and some other
/// speakers send anyway: a 16-octet next hop that is link-local. We never send it, but must
/// read it.
const UPDATE_V4_LINK_LOCAL_16: &str = "ffffffffffffffffffffffffffffffff 0041 02 0000 002a
    40010100 400206 02 01 0000fc00
    800e1a 0001 01 10 fe800000000000000000000000000001 00
    20 c612c901";

#[test]
fn ipv4_prefix_with_16_octet_link_local_next_hop_decodes() {
    let expected = expected_announcement(MpNextHop::Ipv6 {
        global: LINK_LOCAL,
        link_local: None,
    });
    assert_canonical(UPDATE_V4_LINK_LOCAL_16, &expected);
    let Message::Update(u) = expected else {
        unreachable!()
    };
    // Announces routes without NEXT_HOP: nothing is missing.
    assert!(u.errors.is_empty() && !u.treat_as_withdraw());
}

/// 198.18.201.1/32 withdrawn in MP_UNREACH_NLRI (optional, length 8): AFI 1, SAFI 1, /32
/// 198.18.201.1. Nothing in the Withdrawn Routes field.
const WITHDRAW_V4_MP: &str = "ffffffffffffffffffffffffffffffff 0022 02 0000 000b
    800f08 0001 01 20 c612c901";

#[test]
fn ipv4_withdrawal_in_mp_unreach() {
    let expected = Message::Update(Update {
        attributes: PathAttributes {
            mp_unreach: Some(MpUnreach {
                withdrawn: Nlri::Ipv4Unicast(vec![prefix()]),
            }),
            ..PathAttributes::default()
        },
        ..Update::default()
    });
    assert_canonical(WITHDRAW_V4_MP, &expected);
    assert_eq!(
        Message::Update(Update::withdraw_ipv4_mp(&[prefix()]).remove(0)),
        expected
    );
    // What the Adj-RIB-Out sends when the prefix leaves the plan on an unnumbered session.
    let s = session(None, Some(LINK_LOCAL));
    let sent: AdjRibOut = [(IpNet::V4(prefix()), RouteAttributes::default())].into();
    let (updates, left) = diff(&sent, &AdjRibOut::new(), &s).unwrap();
    assert!(left.is_empty());
    assert_eq!(
        updates.into_iter().map(Message::Update).collect::<Vec<_>>(),
        [expected]
    );
}

#[test]
fn ipv4_mp_reach_with_a_bad_next_hop_length_resets_the_session() {
    // IPv4 unicast takes 4, 16 or 32 octets; 8 and 24 are neither.
    for nh in [
        "0102030405060708",
        "fe800000000000000000000000000001 0102030405060708",
    ] {
        let nh = hex(nh);
        let mut attr = vec![0x80, 0x0e, (3 + 1 + nh.len() + 1 + 5) as u8, 0, 1, 1];
        attr.push(nh.len() as u8);
        attr.extend_from_slice(&nh);
        attr.extend_from_slice(&hex("00 20c612c901"));
        let mut body = vec![0, 0];
        body.extend_from_slice(&(attr.len() as u16).to_be_bytes());
        body.extend_from_slice(&attr);
        let mut m = vec![0xff; 16];
        m.extend_from_slice(&((19 + body.len()) as u16).to_be_bytes());
        m.push(2);
        m.extend_from_slice(&body);
        let n = Message::decode(&m, &ctx()).unwrap_err().notification();
        assert_eq!(
            (n.code, n.subcode, n.data),
            (
                error_code::UPDATE_MESSAGE,
                update_subcode::OPTIONAL_ATTRIBUTE_ERROR,
                attr
            )
        );
    }
}

// ---------------------------------------------------------------- properties

fn next_hop_strategy() -> impl Strategy<Value = MpNextHop> {
    let global = prop_oneof![
        any::<u128>().prop_map(Ipv6Addr::from),
        Just(GLOBAL),
        Just(LINK_LOCAL)
    ];
    let link_local = proptest::option::of(
        any::<u64>().prop_map(|iid| Ipv6Addr::from((0xfe80_u128 << 112) | u128::from(iid))),
    );
    (proptest::option::of(global), link_local)
        .prop_filter_map("no address", |(g, ll)| MpNextHop::ipv6(g, ll))
}

fn prefixes_strategy() -> impl Strategy<Value = Vec<Ipv4Net>> {
    proptest::collection::vec(
        (any::<u32>(), 0u8..=32)
            .prop_map(|(a, l)| Ipv4Net::new(Ipv4Addr::from(a), l).unwrap().trunc()),
        0..1500,
    )
}

/// Encodes and decodes `update`, checking the size limit and that nothing changed.
fn round_trip(update: &Update) -> Vec<u8> {
    let bytes = Message::Update(update.clone()).to_bytes(&ctx()).unwrap();
    assert!(bytes.len() <= 4096, "{} octets", bytes.len());
    assert_eq!(decode(&bytes), Message::Update(update.clone()));
    bytes
}

proptest! {
    /// Any list of entries survives encoding and decoding in an OPEN.
    #[test]
    fn extended_next_hop_capability_round_trips(
        entries in proptest::collection::vec(
            (any::<u16>(), any::<u16>(), any::<u16>()).prop_map(|(afi, safi, next_hop_afi)| {
                ExtendedNextHop { afi, safi, next_hop_afi }
            }),
            1..=42,
        ),
    ) {
        let open = Open::new(64512, 90, ROUTER_ID, vec![Capability::ExtendedNextHop(entries.clone())]);
        let bytes = Message::Open(open.clone()).to_bytes(&ctx()).unwrap();
        let Message::Open(back) = decode(&bytes) else { panic!("not an OPEN") };
        prop_assert_eq!(back.extended_next_hops().collect::<Vec<_>>(), entries);
        prop_assert_eq!(back, open);
    }

    /// IPv4 prefixes announced with any IPv6 next hop come back as they were: in order, in as
    /// many UPDATEs of at most 4096 octets as needed, each without NEXT_HOP and with the next
    /// hop length RFC 2545 asks for.
    #[test]
    fn ipv4_over_ipv6_announcements_round_trip(
        prefixes in prefixes_strategy(),
        next_hop in next_hop_strategy(),
    ) {
        let attrs = PathAttributes {
            origin: Some(Origin::Igp),
            as_path: Some(AsPath::sequence(&[64512])),
            // Dropped: RFC 4760 §3.
            next_hop: Some(Ipv4Addr::new(198, 18, 250, 10)),
            ..PathAttributes::default()
        };
        let updates = Update::announce_ipv4_mp(&attrs, next_hop.clone(), &prefixes, &ctx()).unwrap();
        let mut back = Vec::new();
        for u in &updates {
            let bytes = round_trip(u);
            prop_assert!(u.nlri.is_empty() && u.attributes.next_hop.is_none());
            let reach = u.attributes.mp_reach.as_ref().unwrap();
            prop_assert_eq!(&reach.next_hop, &next_hop);
            let Nlri::Ipv4Unicast(ps) = &reach.nlri else { panic!("not IPv4") };
            prop_assert!(!ps.is_empty());
            back.extend_from_slice(ps);
            // MP_REACH_NLRI follows header (19), the two length fields (4), ORIGIN (4) and
            // AS_PATH (9); its next hop length octet follows its header, AFI and SAFI.
            let MpNextHop::Ipv6 { link_local, .. } = &next_hop else { unreachable!() };
            let reach_at = 19 + 4 + 4 + 9;
            prop_assert_eq!(bytes[reach_at + 1], 14);
            let header = if bytes[reach_at] & 0x10 != 0 { 4 } else { 3 };
            prop_assert_eq!(&bytes[reach_at + header..reach_at + header + 3], &[0, 1, 1]);
            let nh_len = bytes[reach_at + header + 3];
            prop_assert_eq!(nh_len, if link_local.is_some() { 32 } else { 16 });
        }
        prop_assert_eq!(back, prefixes);
    }

    /// IPv4 withdrawals in MP_UNREACH_NLRI come back as they were, in order.
    #[test]
    fn ipv4_mp_withdrawals_round_trip(prefixes in prefixes_strategy()) {
        let mut back = Vec::new();
        for u in Update::withdraw_ipv4_mp(&prefixes) {
            round_trip(&u);
            prop_assert!(u.withdrawn.is_empty());
            let Some(MpUnreach { withdrawn: Nlri::Ipv4Unicast(ps) }) = &u.attributes.mp_unreach
            else {
                panic!("not IPv4 MP_UNREACH_NLRI")
            };
            back.extend_from_slice(ps);
        }
        prop_assert_eq!(back, prefixes);
    }
}
