//! Byte-exact vectors: real messages captured from FRR and GoBGP, decoded into the structs we
//! expect and, where our encoding is the canonical one, encoded back to the same bytes.
//!
//! How they were produced: two network namespaces joined by a veth pair, FRR 8.4.4 `bgpd` (with
//! `zebra`, `hostname frr-a`, `domainname lab.example`, `router bgp 4200000001`, router-id
//! 198.18.250.1, on 198.18.250.1 and fd00:18:fa::1) peering with GoBGP 3.10.0 `gobgpd` (AS 64512,
//! router-id 198.18.250.2, on 198.18.250.2 and fd00:18:fa::2; the IPv6 neighbor uses
//! `local-as 4200000001`, so that session is iBGP). Routes were added with
//! `gobgp global rib add ...` and FRR `network` statements, refreshes and shutdowns were asked
//! for with `clear bgp ... soft in`, `gobgp neighbor ... softresetin`,
//! `gobgp neighbor ... shutdown --reason`, FRR `neighbor ... shutdown` and a wrong `remote-as`.
//! `tcpdump -w` captured port 179 on the veth, and a small script reassembled each TCP stream
//! and cut it into messages. Each constant names the sender and what was configured.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{Ipv4Addr, Ipv6Addr};

use ferrolb_bgp::packet::iana::{cease_subcode, error_code, open_subcode};
use ferrolb_bgp::packet::{
    AfiSafi, AsPath, Capability, CodecContext, Community, ExtendedNextHop, GracefulRestart,
    LargeCommunity, Message, MpNextHop, MpReach, MpUnreach, Nlri, Notification, Open, Origin,
    PathAttributes, RouteRefresh, Update,
};

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
fn assert_canonical(wire: &str, expected: Message) {
    let bytes = hex(wire);
    assert_eq!(decode(&bytes), expected);
    assert_eq!(
        expected.to_bytes(&ctx()).unwrap(),
        bytes,
        "encoding differs from the capture"
    );
}

/// Decodes to `expected`; our encoding differs from the sender's, so check it round-trips.
fn assert_decodes(wire: &str, expected: Message) {
    let bytes = hex(wire);
    assert_eq!(decode(&bytes), expected);
    let ours = expected.to_bytes(&ctx()).unwrap();
    assert_eq!(decode(&ours), expected);
}

fn v4(s: &str) -> ipnet::Ipv4Net {
    s.parse().unwrap()
}

fn v6(s: &str) -> ipnet::Ipv6Net {
    s.parse().unwrap()
}

const GOBGP: Ipv4Addr = Ipv4Addr::new(198, 18, 250, 2);
const FRR: Ipv4Addr = Ipv4Addr::new(198, 18, 250, 1);
const FRR_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x18, 0xfa, 0, 0, 0, 0, 1);
const GOBGP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x18, 0xfa, 0, 0, 0, 0, 2);

// ---------------------------------------------------------------- OPEN

/// GoBGP, AS 64512, IPv4 session: all capabilities in one optional parameter, including its
/// hostname capability ("vm", empty domain) and extended next hop.
const GOBGP_OPEN_V4: &str = "ffffffffffffffffffffffffffffffff 003b 01
    04 fc00 005a c612fa02 1e 02 1c 0200 490402766d00 010400010001 41040000fc00 0506000100010002";

#[test]
fn gobgp_open_ipv4() {
    let open = Open {
        my_as: 64512,
        hold_time: 90,
        bgp_id: GOBGP,
        capabilities: vec![
            Capability::RouteRefresh,
            Capability::Fqdn {
                hostname: "vm".into(),
                domain: String::new(),
            },
            Capability::Multiprotocol(AfiSafi::IPV4_UNICAST),
            Capability::FourOctetAs(64512),
            Capability::ExtendedNextHop(vec![ExtendedNextHop {
                afi: 1,
                safi: 1,
                next_hop_afi: 2,
            }]),
        ],
    };
    assert_eq!(open.asn(), 64512);
    assert_canonical(GOBGP_OPEN_V4, Message::Open(open));
}

/// GoBGP, IPv6 session with `local-as 4200000001`: "My AS" is AS_TRANS.
const GOBGP_OPEN_V6: &str = "ffffffffffffffffffffffffffffffff 0033 01
    04 5ba0 005a c612fa02 16 02 14 0200 490402766d00 010400020001 4104fa56ea01";

#[test]
fn gobgp_open_ipv6_with_as_trans() {
    let open = Open::new(
        4_200_000_001,
        90,
        GOBGP,
        vec![
            Capability::RouteRefresh,
            Capability::Fqdn {
                hostname: "vm".into(),
                domain: String::new(),
            },
            Capability::Multiprotocol(AfiSafi::IPV6_UNICAST),
        ],
    );
    assert_eq!(open.my_as, 23456);
    assert_eq!(open.asn(), 4_200_000_001);
    assert_eq!(open.families(), vec![AfiSafi::IPV6_UNICAST]);
    assert_canonical(GOBGP_OPEN_V6, Message::Open(open));
}

fn frr_open(family: AfiSafi) -> Open {
    let afi = family.afi.to_be_bytes();
    Open {
        my_as: 23456,
        hold_time: 180,
        bgp_id: FRR,
        capabilities: vec![
            Capability::Multiprotocol(family),
            Capability::Unknown {
                code: 128,
                value: vec![],
            },
            Capability::RouteRefresh,
            Capability::Unknown {
                code: 70,
                value: vec![],
            },
            Capability::FourOctetAs(4_200_000_001),
            Capability::Unknown {
                code: 6,
                value: vec![],
            },
            Capability::Unknown {
                code: 69,
                value: vec![afi[0], afi[1], 1, 1],
            },
            Capability::Fqdn {
                hostname: "frr-a".into(),
                domain: "lab.example".into(),
            },
            Capability::GracefulRestart(GracefulRestart {
                restart_state: true,
                notification: true,
                restart_time: 120,
                families: vec![],
            }),
            Capability::Unknown {
                code: 71,
                value: vec![afi[0], afi[1], 1, 0x80, 0, 0, 0],
            },
        ],
    }
}

/// FRR, AS 4200000001, IPv4 session: one optional parameter per capability; hostname capability
/// with a non-empty domain name (the OPEN zettabgp 0.6.0 fails to decode), graceful restart,
/// long-lived graceful restart, add-path, extended message, enhanced and old-style route refresh.
const FRR_OPEN_V4: &str = "ffffffffffffffffffffffffffffffff 006c 01
    04 5ba0 00b4 c612fa01 4f
    0206 010400010001  0202 8000  0202 0200  0202 4600  0206 4104fa56ea01  0202 0600
    0206 450400010101  0214 4912 05 6672722d61 0b 6c61622e6578616d706c65
    0204 4002c078  0209 470700010180000000";

#[test]
fn frr_open_ipv4_with_hostname_capability() {
    let open = frr_open(AfiSafi::IPV4_UNICAST);
    assert_eq!(open.asn(), 4_200_000_001);
    assert!(open.supports_route_refresh());
    assert_decodes(FRR_OPEN_V4, Message::Open(open));
}

/// FRR, IPv6 session (iBGP with GoBGP's local-as).
const FRR_OPEN_V6: &str = "ffffffffffffffffffffffffffffffff 006c 01
    04 5ba0 00b4 c612fa01 4f
    0206 010400020001  0202 8000  0202 0200  0202 4600  0206 4104fa56ea01  0202 0600
    0206 450400020101  0214 4912 05 6672722d61 0b 6c61622e6578616d706c65
    0204 4002c078  0209 470700020180000000";

#[test]
fn frr_open_ipv6() {
    assert_decodes(FRR_OPEN_V6, Message::Open(frr_open(AfiSafi::IPV6_UNICAST)));
}

// ---------------------------------------------------------------- KEEPALIVE

/// GoBGP's first KEEPALIVE (FRR's is identical).
const KEEPALIVE: &str = "ffffffffffffffffffffffffffffffff 0013 04";

#[test]
fn keepalive() {
    assert_canonical(KEEPALIVE, Message::Keepalive);
}

// ---------------------------------------------------------------- UPDATE from GoBGP

/// GoBGP, eBGP: `global rib add -a ipv4 198.18.250.100/32 nexthop 198.18.250.2
/// community 64512:100,65535:65281 large-community 4200000001:1:2 med 10 origin igp`.
const GOBGP_UPDATE_V4: &str = "ffffffffffffffffffffffffffffffff 0051 02 0000 0035
    40010100 400206020100 00fc00 400304c612fa02 8004040000000a c00808fc000064ffffff01
    c0200cfa56ea010000000100000002 20c612fa64";

#[test]
fn gobgp_update_ipv4_with_communities() {
    let update = Update {
        nlri: vec![v4("198.18.250.100/32")],
        attributes: PathAttributes {
            origin: Some(Origin::Igp),
            as_path: Some(AsPath::sequence(&[64512])),
            next_hop: Some(GOBGP),
            med: Some(10),
            communities: vec![Community::new(64512, 100), Community::NO_EXPORT],
            large_communities: vec![LargeCommunity {
                global_admin: 4_200_000_001,
                local_data_1: 1,
                local_data_2: 2,
            }],
            ..PathAttributes::default()
        },
        ..Update::default()
    };
    assert_canonical(GOBGP_UPDATE_V4, Message::Update(update));
}

/// GoBGP, iBGP over IPv6: `global rib add -a ipv6 fd00:18:fa::200/128 nexthop fd00:18:fa::2
/// community 64512:200 large-community 4200000001:3:4 local-pref 200 origin igp`.
const GOBGP_UPDATE_V6: &str = "ffffffffffffffffffffffffffffffff 0064 02 0000 004d
    40010100 400200 400504000000c8 c00804fc0000c8
    800e26 0002 01 10 fd00001800fa0000000000000000000200 80fd00001800fa00000000000000000200
    c0200cfa56ea010000000300000004";

fn gobgp_v6_attributes() -> PathAttributes {
    PathAttributes {
        origin: Some(Origin::Igp),
        as_path: Some(AsPath::default()),
        local_pref: Some(200),
        communities: vec![Community::new(64512, 200)],
        large_communities: vec![LargeCommunity {
            global_admin: 4_200_000_001,
            local_data_1: 3,
            local_data_2: 4,
        }],
        ..PathAttributes::default()
    }
}

#[test]
fn gobgp_update_ipv6_mp_reach_with_local_pref() {
    let mut attributes = gobgp_v6_attributes();
    attributes.mp_reach = Some(MpReach {
        next_hop: MpNextHop::Ipv6 {
            global: GOBGP_V6,
            link_local: None,
        },
        nlri: Nlri::Ipv6Unicast(vec![v6("fd00:18:fa::200/128")]),
    });
    assert_canonical(
        GOBGP_UPDATE_V6,
        Message::Update(Update {
            attributes,
            ..Update::default()
        }),
    );
}

#[test]
fn announce_ipv6_builds_the_gobgp_update() {
    let next_hop = MpNextHop::Ipv6 {
        global: GOBGP_V6,
        link_local: None,
    };
    let updates = Update::announce_ipv6(
        &gobgp_v6_attributes(),
        next_hop,
        &[v6("fd00:18:fa::200/128")],
        &ctx(),
    )
    .unwrap();
    assert_eq!(updates.len(), 1);
    assert_eq!(
        Message::Update(updates[0].clone())
            .to_bytes(&ctx())
            .unwrap(),
        hex(GOBGP_UPDATE_V6)
    );
}

/// GoBGP: `global rib add -a ipv4 198.18.250.128/25 nexthop 198.18.250.2 aspath 64600,64601
/// origin incomplete`, sent to FRR with its own AS prepended: one AS_SEQUENCE of three.
const GOBGP_UPDATE_V4_AS_SEQUENCE: &str = "ffffffffffffffffffffffffffffffff 0038 02 0000 001c
    40010102 40020e 0203 0000fc00 0000fc58 0000fc59 400304c612fa02 19c612fa80";

#[test]
fn gobgp_update_as_sequence() {
    let update = Update {
        nlri: vec![v4("198.18.250.128/25")],
        attributes: PathAttributes {
            origin: Some(Origin::Incomplete),
            as_path: Some(AsPath::sequence(&[64512, 64600, 64601])),
            next_hop: Some(GOBGP),
            ..PathAttributes::default()
        },
        ..Update::default()
    };
    assert_eq!(update.attributes.as_path.as_ref().unwrap().path_len(), 3);
    assert_canonical(GOBGP_UPDATE_V4_AS_SEQUENCE, Message::Update(update));
}

/// GoBGP: `global rib del -a ipv4 198.18.250.100/32`.
const GOBGP_WITHDRAW_V4: &str = "ffffffffffffffffffffffffffffffff 001c 02 0005 20c612fa64 0000";

#[test]
fn gobgp_withdraw_ipv4() {
    let update = Update {
        withdrawn: vec![v4("198.18.250.100/32")],
        ..Update::default()
    };
    assert_eq!(
        Update::withdraw_ipv4(&update.withdrawn),
        vec![update.clone()]
    );
    assert_canonical(GOBGP_WITHDRAW_V4, Message::Update(update));
}

/// GoBGP: `global rib del -a ipv6 fd00:18:fa::200/128`: MP_UNREACH_NLRI only.
const GOBGP_WITHDRAW_V6: &str = "ffffffffffffffffffffffffffffffff 002e 02 0000 0017
    800f14 0002 01 80fd00001800fa00000000000000000200";

#[test]
fn gobgp_withdraw_ipv6_mp_unreach() {
    let prefixes = [v6("fd00:18:fa::200/128")];
    let update = Update {
        attributes: PathAttributes {
            mp_unreach: Some(MpUnreach {
                withdrawn: Nlri::Ipv6Unicast(prefixes.to_vec()),
            }),
            ..PathAttributes::default()
        },
        ..Update::default()
    };
    assert_eq!(Update::withdraw_ipv6(&prefixes), vec![update.clone()]);
    assert_eq!(update.end_of_rib(), None);
    assert_canonical(GOBGP_WITHDRAW_V6, Message::Update(update));
}

// ---------------------------------------------------------------- UPDATE from FRR

/// FRR, eBGP: `network 198.18.250.64/26`. FRR sets the extended length flag on AS_PATH even for
/// six octets, so only decoding is byte-exact.
const FRR_UPDATE_V4: &str = "ffffffffffffffffffffffffffffffff 0038 02 0000 001c
    40010100 50020006 0201fa56ea01 400304c612fa01 80040400000000 1ac612fa40";

#[test]
fn frr_update_ipv4_extended_length_as_path() {
    let update = Update {
        nlri: vec![v4("198.18.250.64/26")],
        attributes: PathAttributes {
            origin: Some(Origin::Igp),
            as_path: Some(AsPath::sequence(&[4_200_000_001])),
            next_hop: Some(FRR),
            med: Some(0),
            ..PathAttributes::default()
        },
        ..Update::default()
    };
    assert_decodes(FRR_UPDATE_V4, Message::Update(update));
}

/// FRR passing GoBGP's 198.18.250.128/25 on with its own AS prepended.
const FRR_UPDATE_V4_AS_SEQUENCE: &str = "ffffffffffffffffffffffffffffffff 003d 02 0000 0021
    40010102 50020012 0204 fa56ea01 0000fc00 0000fc58 0000fc59 400304c612fa01 19c612fa80";

#[test]
fn frr_update_as_sequence_of_four() {
    let update = Update {
        nlri: vec![v4("198.18.250.128/25")],
        attributes: PathAttributes {
            origin: Some(Origin::Incomplete),
            as_path: Some(AsPath::sequence(&[4_200_000_001, 64512, 64600, 64601])),
            next_hop: Some(FRR),
            ..PathAttributes::default()
        },
        ..Update::default()
    };
    assert_decodes(FRR_UPDATE_V4_AS_SEQUENCE, Message::Update(update));
}

/// FRR, iBGP over IPv6 without zebra: MP_REACH_NLRI first, global next hop only.
const FRR_UPDATE_V6: &str = "ffffffffffffffffffffffffffffffff 0057 02 0000 0040
    900e0026 0002 01 10 fd00001800fa0000000000000000000100 80fd00001800fa00000000000000000100
    40010100 50020000 80040400000000 40050400000064";

fn frr_v6_update(link_local: Option<Ipv6Addr>) -> Update {
    Update {
        attributes: PathAttributes {
            origin: Some(Origin::Igp),
            as_path: Some(AsPath::default()),
            med: Some(0),
            local_pref: Some(100),
            mp_reach: Some(MpReach {
                next_hop: MpNextHop::Ipv6 {
                    global: FRR_V6,
                    link_local,
                },
                nlri: Nlri::Ipv6Unicast(vec![v6("fd00:18:fa::100/128")]),
            }),
            ..PathAttributes::default()
        },
        ..Update::default()
    }
}

#[test]
fn frr_update_ipv6_global_next_hop() {
    assert_decodes(FRR_UPDATE_V6, Message::Update(frr_v6_update(None)));
}

/// FRR with zebra running: the next hop is global plus link-local (32 octets).
const FRR_UPDATE_V6_LINK_LOCAL: &str = "ffffffffffffffffffffffffffffffff 0067 02 0000 0050
    900e0036 0002 01 20 fd00001800fa00000000000000000001 fe800000000000002c68eafffed95dc2 00
    80fd00001800fa00000000000000000100
    40010100 50020000 80040400000000 40050400000064";

#[test]
fn frr_update_ipv6_global_and_link_local_next_hop() {
    let ll: Ipv6Addr = "fe80::2c68:eaff:fed9:5dc2".parse().unwrap();
    assert_decodes(
        FRR_UPDATE_V6_LINK_LOCAL,
        Message::Update(frr_v6_update(Some(ll))),
    );
}

/// FRR: `no network fd00:18:fa::100/128` (MP_UNREACH_NLRI with the extended length flag).
const FRR_WITHDRAW_V6: &str = "ffffffffffffffffffffffffffffffff 002f 02 0000 0018
    900f0014 0002 01 80fd00001800fa00000000000000000100";

#[test]
fn frr_withdraw_ipv6() {
    let update = Update::withdraw_ipv6(&[v6("fd00:18:fa::100/128")]).remove(0);
    assert_decodes(FRR_WITHDRAW_V6, Message::Update(update));
}

/// FRR: `no network 198.18.250.64/26`; identical to what we encode.
const FRR_WITHDRAW_V4: &str = "ffffffffffffffffffffffffffffffff 001c 02 0005 1ac612fa40 0000";

#[test]
fn frr_withdraw_ipv4() {
    let update = Update {
        withdrawn: vec![v4("198.18.250.64/26")],
        ..Update::default()
    };
    assert_canonical(FRR_WITHDRAW_V4, Message::Update(update));
}

// ---------------------------------------------------------------- ROUTE-REFRESH

/// FRR: `clear bgp ipv4 unicast 198.18.250.2 soft in`.
const FRR_ROUTE_REFRESH_V4: &str = "ffffffffffffffffffffffffffffffff 0017 05 0001 00 01";
/// FRR: `clear bgp ipv6 unicast fd00:18:fa::2 soft in`.
const FRR_ROUTE_REFRESH_V6: &str = "ffffffffffffffffffffffffffffffff 0017 05 0002 00 01";

#[test]
fn frr_route_refresh() {
    assert_canonical(
        FRR_ROUTE_REFRESH_V4,
        Message::RouteRefresh(RouteRefresh::new(AfiSafi::IPV4_UNICAST)),
    );
    assert_canonical(
        FRR_ROUTE_REFRESH_V6,
        Message::RouteRefresh(RouteRefresh::new(AfiSafi::IPV6_UNICAST)),
    );
}

// ---------------------------------------------------------------- NOTIFICATION

/// GoBGP: `neighbor fd00:18:fa::1 shutdown --reason "ferrolb vector"` (RFC 9003 communication).
const GOBGP_NOTIFICATION_SHUTDOWN: &str = "ffffffffffffffffffffffffffffffff 0024 03 06 02
    0e 666572726f6c6220766563746f72";

#[test]
fn gobgp_notification_with_shutdown_communication() {
    let n = Notification::administrative_shutdown("ferrolb vector");
    assert_eq!(n.shutdown_communication(), Some("ferrolb vector"));
    assert_canonical(GOBGP_NOTIFICATION_SHUTDOWN, Message::Notification(n));
}

/// FRR: `neighbor 198.18.250.2 shutdown`.
const FRR_NOTIFICATION_SHUTDOWN: &str = "ffffffffffffffffffffffffffffffff 0015 03 06 02";

#[test]
fn frr_notification_administrative_shutdown() {
    let n = Notification::cease(cease_subcode::ADMINISTRATIVE_SHUTDOWN);
    assert_eq!(n.shutdown_communication(), None);
    assert_canonical(FRR_NOTIFICATION_SHUTDOWN, Message::Notification(n));
}

/// FRR configured with `remote-as 64513` receiving GoBGP's OPEN for 64512: OPEN Message Error /
/// Bad Peer AS, with the AS it received as data.
const FRR_NOTIFICATION_BAD_PEER_AS: &str = "ffffffffffffffffffffffffffffffff 0017 03 02 02 fc00";

#[test]
fn frr_notification_bad_peer_as() {
    let n = Notification::new(
        error_code::OPEN_MESSAGE,
        open_subcode::BAD_PEER_AS,
        vec![0xfc, 0x00],
    );
    assert_canonical(FRR_NOTIFICATION_BAD_PEER_AS, Message::Notification(n));
}

// ---------------------------------------------------------------- streams

#[test]
fn frame_len_cuts_a_captured_stream_into_messages() {
    let stream: Vec<u8> = [GOBGP_OPEN_V4, KEEPALIVE, GOBGP_UPDATE_V4, GOBGP_WITHDRAW_V4]
        .iter()
        .flat_map(|m| hex(m))
        .collect();
    let mut rest = &stream[..];
    let mut kinds = Vec::new();
    while let Some(len) = Message::frame_len(rest).unwrap() {
        kinds.push(decode(&rest[..len]).message_type());
        rest = &rest[len..];
    }
    assert!(rest.is_empty());
    assert_eq!(kinds, vec![1, 4, 2, 2]);
    // A partial header asks for more.
    assert_eq!(Message::frame_len(&stream[..18]).unwrap(), None);
}
