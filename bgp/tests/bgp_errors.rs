//! Malformed messages: each decode error maps onto the NOTIFICATION of RFC 4271 §6, and
//! malformed UPDATE attributes are classified as RFC 7606 says.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ferrolb_bgp::packet::iana::{error_code, header_subcode, open_subcode, update_subcode};
use ferrolb_bgp::packet::{
    AfiSafi, AsPath, AttributeError, Capability, CodecContext, Community, DecodeError, ErrorAction,
    Message, MpNextHop, Nlri, Notification, Open, Origin, PathAttributes, RawAttribute, Update,
};

const FOUR: CodecContext = CodecContext {
    four_octet_as: true,
};
const TWO: CodecContext = CodecContext {
    four_octet_as: false,
};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A whole message of `message_type` around `body`.
fn frame(message_type: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![0xff; 16];
    m.extend_from_slice(&((19 + body.len()) as u16).to_be_bytes());
    m.push(message_type);
    m.extend_from_slice(body);
    m
}

/// An UPDATE with no withdrawals, these attributes, and this NLRI.
fn update_frame(attrs: &str, nlri: &str) -> Vec<u8> {
    let attrs = hex(attrs);
    let mut body = vec![0, 0];
    body.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
    body.extend_from_slice(&attrs);
    body.extend_from_slice(&hex(nlri));
    frame(2, &body)
}

fn decode_update(bytes: &[u8], ctx: &CodecContext) -> Update {
    match Message::decode(bytes, ctx).unwrap() {
        Message::Update(u) => u,
        other => panic!("not an UPDATE: {other:?}"),
    }
}

fn notification_of(bytes: &[u8]) -> Notification {
    Message::decode(bytes, &FOUR).unwrap_err().notification()
}

/// ORIGIN IGP, AS_PATH [64512], NEXT_HOP 198.18.250.2.
const GOOD_ATTRS: &str = "40010100 40020602010000fc00 400304c612fa02";
/// 198.18.250.100/32.
const ONE_PREFIX: &str = "20c612fa64";

fn soft(type_code: u8, subcode: u8, action: ErrorAction) -> AttributeError {
    AttributeError {
        type_code,
        subcode,
        action,
    }
}

// ---------------------------------------------------------------- header (RFC 4271 §6.1)

#[test]
fn marker_not_all_ones_is_connection_not_synchronized() {
    let mut m = frame(4, &[]);
    m[3] = 0;
    assert_eq!(
        Message::frame_len(&m),
        Err(DecodeError::ConnectionNotSynchronized)
    );
    let n = notification_of(&m);
    assert_eq!(
        (n.code, n.subcode, n.data),
        (
            error_code::MESSAGE_HEADER,
            header_subcode::CONNECTION_NOT_SYNCHRONIZED,
            vec![]
        )
    );
}

#[test]
fn length_outside_19_to_4096_is_bad_message_length_with_the_length_as_data() {
    for length in [0u16, 18, 4097, 65535] {
        let mut m = frame(4, &[]);
        m[16..18].copy_from_slice(&length.to_be_bytes());
        assert_eq!(
            Message::frame_len(&m),
            Err(DecodeError::BadMessageLength { length })
        );
        let n = notification_of(&m);
        assert_eq!(
            (n.code, n.subcode),
            (
                error_code::MESSAGE_HEADER,
                header_subcode::BAD_MESSAGE_LENGTH
            )
        );
        assert_eq!(n.data, length.to_be_bytes());
    }
}

#[test]
fn length_wrong_for_the_type_is_bad_message_length() {
    for (message_type, body_len) in [(1u8, 9usize), (2, 3), (3, 1), (4, 1), (5, 3), (5, 5)] {
        let m = frame(message_type, &vec![0; body_len]);
        let length = (19 + body_len) as u16;
        assert_eq!(
            Message::frame_len(&m),
            Err(DecodeError::BadMessageLength { length }),
            "type {message_type}"
        );
    }
}

#[test]
fn unknown_type_is_bad_message_type_with_the_type_as_data() {
    let m = frame(6, &[]);
    let n = notification_of(&m);
    assert_eq!(
        (n.code, n.subcode, n.data),
        (
            error_code::MESSAGE_HEADER,
            header_subcode::BAD_MESSAGE_TYPE,
            vec![6]
        )
    );
}

#[test]
fn a_frame_shorter_or_longer_than_its_length_field_is_rejected() {
    let m = frame(4, &[]);
    assert!(Message::decode(&m[..10], &FOUR).is_err());
    let mut long = m.clone();
    long.push(0);
    assert_eq!(
        Message::decode(&long, &FOUR),
        Err(DecodeError::BadMessageLength { length: 19 })
    );
}

// ---------------------------------------------------------------- OPEN (RFC 4271 §6.2)

#[test]
fn open_version_3_is_unsupported_version_with_4_as_data() {
    let m = frame(1, &hex("03 fc00 005a c612fa02 00"));
    let n = notification_of(&m);
    assert_eq!(
        (n.code, n.subcode, n.data),
        (
            error_code::OPEN_MESSAGE,
            open_subcode::UNSUPPORTED_VERSION_NUMBER,
            vec![0, 4]
        )
    );
}

#[test]
fn open_with_authentication_parameter_is_unsupported_optional_parameter() {
    let m = frame(1, &hex("04 fc00 005a c612fa02 03 01 01 00"));
    let n = notification_of(&m);
    assert_eq!(
        (n.code, n.subcode),
        (
            error_code::OPEN_MESSAGE,
            open_subcode::UNSUPPORTED_OPTIONAL_PARAMETER
        )
    );
}

#[test]
fn open_with_overrunning_parameters_is_an_open_error() {
    for body in [
        "04 fc00 005a c612fa02 05 02 06 41040000", // parameter longer than the field
        "04 fc00 005a c612fa02 04 02 02 4104",     // capability longer than its parameter
        "04 fc00 005a c612fa02 03 02 01 41",       // capability header cut
        "04 fc00 005a c612fa02 08 02 06 010300010001 ", // multiprotocol capability of 3 octets
        "04 fc00 005a c612fa02 07 02 05 4103000000", // 4-octet AS capability of 3 octets
    ] {
        let n = notification_of(&frame(1, &hex(body)));
        assert_eq!(
            (n.code, n.subcode),
            (error_code::OPEN_MESSAGE, open_subcode::UNSPECIFIC),
            "{body}"
        );
    }
}

#[test]
fn malformed_hostname_capability_is_kept_raw_not_rejected() {
    // Hostname length 9 with only 2 octets following.
    let m = frame(1, &hex("04 fc00 005a c612fa02 07 02 05 4903 09 766d"));
    let Message::Open(open) = Message::decode(&m, &FOUR).unwrap() else {
        panic!()
    };
    assert_eq!(
        open.capabilities,
        vec![Capability::Unknown {
            code: 73,
            value: vec![9, 0x76, 0x6d]
        }]
    );
}

#[test]
fn hostname_capability_without_domain_is_accepted() {
    let m = frame(1, &hex("04 fc00 005a c612fa02 07 02 05 4903 02 766d"));
    let Message::Open(open) = Message::decode(&m, &FOUR).unwrap() else {
        panic!()
    };
    assert_eq!(
        open.capabilities,
        vec![Capability::Fqdn {
            hostname: "vm".into(),
            domain: String::new()
        }]
    );
}

#[test]
fn long_capability_lists_use_rfc_9072_extended_parameters() {
    let caps: Vec<Capability> = (0..60)
        .map(|i| Capability::Unknown {
            code: 200,
            value: vec![i; 3],
        })
        .collect();
    let open = Open::new(64512, 90, "198.18.250.2".parse().unwrap(), caps);
    let bytes = Message::Open(open.clone()).to_bytes(&FOUR).unwrap();
    assert_eq!(&bytes[28..30], &[255, 255]);
    assert_eq!(Message::decode(&bytes, &FOUR).unwrap(), Message::Open(open));
}

// ---------------------------------------------------------------- UPDATE framing: session reset

#[test]
fn withdrawn_length_overrun_is_malformed_attribute_list() {
    let m = frame(2, &hex("0010 20c612fa64 0000"));
    let n = notification_of(&m);
    assert_eq!(
        (n.code, n.subcode),
        (
            error_code::UPDATE_MESSAGE,
            update_subcode::MALFORMED_ATTRIBUTE_LIST
        )
    );
}

#[test]
fn total_attribute_length_overrun_is_malformed_attribute_list() {
    let m = frame(2, &hex("0000 0040 40010100"));
    let n = notification_of(&m);
    assert_eq!(
        (n.code, n.subcode),
        (
            error_code::UPDATE_MESSAGE,
            update_subcode::MALFORMED_ATTRIBUTE_LIST
        )
    );
}

#[test]
fn prefix_longer_than_32_bits_is_invalid_network_field() {
    for nlri in ["21c612fa6400", "20c612fa"] {
        let n = notification_of(&update_frame(GOOD_ATTRS, nlri));
        assert_eq!(
            (n.code, n.subcode),
            (
                error_code::UPDATE_MESSAGE,
                update_subcode::INVALID_NETWORK_FIELD
            )
        );
    }
}

#[test]
fn unrecognized_well_known_attribute_resets_with_the_attribute_as_data() {
    let n = notification_of(&update_frame("40010100 40630201ff", ONE_PREFIX));
    assert_eq!(
        (n.subcode, n.data),
        (
            update_subcode::UNRECOGNIZED_WELL_KNOWN_ATTRIBUTE,
            hex("40630201ff")
        )
    );
}

#[test]
fn repeated_mp_reach_nlri_resets_the_session() {
    let reach = "800e05 0019 41 00 00";
    let n = notification_of(&update_frame(&format!("{reach} {reach}"), ""));
    assert_eq!(n.subcode, update_subcode::MALFORMED_ATTRIBUTE_LIST);
}

#[test]
fn mp_reach_with_a_bad_next_hop_length_resets_the_session() {
    // IPv6 unicast with a 5-octet next hop.
    let n = notification_of(&update_frame("800e0a 0002 01 05 0102030405 00", ""));
    assert_eq!(
        (n.subcode, n.data),
        (
            update_subcode::OPTIONAL_ATTRIBUTE_ERROR,
            hex("800e0a000201050102030405 00")
        )
    );
}

#[test]
fn mp_unreach_with_a_bad_prefix_resets_the_session() {
    let n = notification_of(&update_frame("800f04 0002 01 81", ""));
    assert_eq!(n.subcode, update_subcode::OPTIONAL_ATTRIBUTE_ERROR);
}

#[test]
fn mp_reach_with_wrong_flags_resets_the_session() {
    let n = notification_of(&update_frame("400e05 0002 01 00 00", ""));
    assert_eq!(n.subcode, update_subcode::ATTRIBUTE_FLAGS_ERROR);
}

// ---------------------------------------------------------------- UPDATE attributes: RFC 7606

#[test]
fn well_formed_update_has_no_errors() {
    let u = decode_update(&update_frame(GOOD_ATTRS, ONE_PREFIX), &FOUR);
    assert!(u.errors.is_empty());
    assert!(!u.treat_as_withdraw());
}

#[test]
fn undefined_origin_is_treat_as_withdraw() {
    let u = decode_update(
        &update_frame("40010103 40020602010000fc00 400304c612fa02", ONE_PREFIX),
        &FOUR,
    );
    assert!(u.treat_as_withdraw());
    assert!(u.errors.contains(&soft(
        1,
        update_subcode::INVALID_ORIGIN_ATTRIBUTE,
        ErrorAction::TreatAsWithdraw
    )));
    assert_eq!(u.attributes.origin, None);
    assert_eq!(
        u.nlri.len(),
        1,
        "the prefixes are still there, to be withdrawn"
    );
}

#[test]
fn origin_with_optional_flag_is_an_attribute_flags_error_treated_as_withdraw() {
    let u = decode_update(
        &update_frame("c0010100 40020602010000fc00 400304c612fa02", ONE_PREFIX),
        &FOUR,
    );
    assert!(u.errors.contains(&soft(
        1,
        update_subcode::ATTRIBUTE_FLAGS_ERROR,
        ErrorAction::TreatAsWithdraw
    )));
}

#[test]
fn as_path_with_zero_length_segment_is_treat_as_withdraw() {
    let u = decode_update(
        &update_frame("40010100 4002020200 400304c612fa02", ONE_PREFIX),
        &FOUR,
    );
    assert!(u.errors.contains(&soft(
        2,
        update_subcode::MALFORMED_AS_PATH,
        ErrorAction::TreatAsWithdraw
    )));
}

/// zettabgp 0.6.0 loops forever on this AS_PATH (one stray octet after a segment) and grows
/// memory without bound; we treat it as withdraw at once.
#[test]
fn as_path_with_a_stray_trailing_octet_is_treat_as_withdraw() {
    let u = decode_update(
        &update_frame("40010100 4002070201 0000fc00 00 400304c612fa02", ONE_PREFIX),
        &FOUR,
    );
    assert!(u.errors.contains(&soft(
        2,
        update_subcode::MALFORMED_AS_PATH,
        ErrorAction::TreatAsWithdraw
    )));
    let u = decode_update(
        &hex("ffffffffffffffffffffffffffffffff0021020000000a40010100400203020000"),
        &FOUR,
    );
    assert!(u.treat_as_withdraw());
}

#[test]
fn as_path_with_unknown_segment_type_is_treat_as_withdraw() {
    let u = decode_update(
        &update_frame("40010100 40020609010000fc00 400304c612fa02", ONE_PREFIX),
        &FOUR,
    );
    assert!(u.treat_as_withdraw());
}

#[test]
fn next_hop_of_wrong_length_is_treat_as_withdraw() {
    let u = decode_update(
        &update_frame("40010100 40020602010000fc00 400305c612fa0200", ONE_PREFIX),
        &FOUR,
    );
    assert!(u.errors.contains(&soft(
        3,
        update_subcode::ATTRIBUTE_LENGTH_ERROR,
        ErrorAction::TreatAsWithdraw
    )));
}

#[test]
fn med_and_local_pref_of_wrong_length_are_treat_as_withdraw() {
    let u = decode_update(
        &update_frame(
            &format!("{GOOD_ATTRS} 800403000000 40050500000000"),
            ONE_PREFIX,
        ),
        &FOUR,
    );
    assert_eq!(u.errors.len(), 2);
    assert!(u.treat_as_withdraw());
}

#[test]
fn communities_not_a_multiple_of_four_are_treat_as_withdraw() {
    for attr in ["c00806fc000064ffff", "c00800"] {
        let u = decode_update(
            &update_frame(&format!("{GOOD_ATTRS} {attr}"), ONE_PREFIX),
            &FOUR,
        );
        assert!(u.errors.contains(&soft(
            8,
            update_subcode::ATTRIBUTE_LENGTH_ERROR,
            ErrorAction::TreatAsWithdraw
        )));
    }
}

#[test]
fn large_communities_not_a_multiple_of_twelve_are_treat_as_withdraw() {
    let u = decode_update(
        &update_frame(&format!("{GOOD_ATTRS} c020080000000100000002"), ONE_PREFIX),
        &FOUR,
    );
    assert!(u.treat_as_withdraw());
}

#[test]
fn atomic_aggregate_with_a_value_is_discarded() {
    let u = decode_update(
        &update_frame(&format!("{GOOD_ATTRS} 40060101"), ONE_PREFIX),
        &FOUR,
    );
    assert_eq!(
        u.errors,
        vec![soft(
            6,
            update_subcode::ATTRIBUTE_LENGTH_ERROR,
            ErrorAction::AttributeDiscard
        )]
    );
    assert!(!u.treat_as_withdraw());
    assert!(!u.attributes.atomic_aggregate);
}

#[test]
fn aggregator_of_the_wrong_width_is_discarded() {
    // Six octets on a 4-octet session.
    let u = decode_update(
        &update_frame(&format!("{GOOD_ATTRS} c00706fc00c612fa02"), ONE_PREFIX),
        &FOUR,
    );
    assert_eq!(
        u.errors,
        vec![soft(
            7,
            update_subcode::ATTRIBUTE_LENGTH_ERROR,
            ErrorAction::AttributeDiscard
        )]
    );
    assert_eq!(u.attributes.aggregator, None);
}

#[test]
fn repeated_attribute_other_than_mp_is_discarded() {
    let u = decode_update(
        &update_frame(&format!("{GOOD_ATTRS} 40010102"), ONE_PREFIX),
        &FOUR,
    );
    assert_eq!(u.attributes.origin, Some(Origin::Igp));
    assert_eq!(
        u.errors,
        vec![soft(
            1,
            update_subcode::MALFORMED_ATTRIBUTE_LIST,
            ErrorAction::AttributeDiscard
        )]
    );
}

#[test]
fn attribute_overrunning_the_attribute_field_is_treat_as_withdraw() {
    // The last attribute claims 9 octets and has 1; the NLRI is still found.
    let u = decode_update(
        &update_frame(&format!("{GOOD_ATTRS} c0080900"), ONE_PREFIX),
        &FOUR,
    );
    assert!(u.treat_as_withdraw());
    assert_eq!(u.nlri.len(), 1);
    // Fewer than three octets left for an attribute header.
    let u = decode_update(
        &update_frame(&format!("{GOOD_ATTRS} c0"), ONE_PREFIX),
        &FOUR,
    );
    assert!(u.treat_as_withdraw());
}

#[test]
fn missing_mandatory_attributes_are_treat_as_withdraw() {
    let u = decode_update(&update_frame("40010100", ONE_PREFIX), &FOUR);
    let missing: Vec<u8> = u.errors.iter().map(|e| e.type_code).collect();
    assert_eq!(missing, vec![2, 3]);
    assert!(
        u.errors
            .iter()
            .all(|e| e.subcode == update_subcode::MISSING_WELL_KNOWN_ATTRIBUTE)
    );
}

#[test]
fn withdraw_only_update_needs_no_attributes() {
    let u = decode_update(&frame(2, &hex("0005 20c612fa64 0000")), &FOUR);
    assert!(u.errors.is_empty());
}

#[test]
fn mp_reach_without_next_hop_attribute_is_fine() {
    let u = decode_update(
        &update_frame(
            "40010100 400200 800e1e 0002 01 10 fd00001800fa00000000000000000002 00 40fd00001800fa0000",
            "",
        ),
        &FOUR,
    );
    assert!(u.errors.is_empty(), "{:?}", u.errors);
}

#[test]
fn unknown_optional_transitive_attribute_is_kept_and_passed_on() {
    let bytes = update_frame(&format!("{GOOD_ATTRS} e0630201ff"), ONE_PREFIX);
    let u = decode_update(&bytes, &FOUR);
    assert_eq!(
        u.attributes.other,
        vec![RawAttribute {
            flags: 0xe0,
            type_code: 99,
            value: vec![1, 0xff]
        }]
    );
    assert_eq!(Message::Update(u).to_bytes(&FOUR).unwrap(), bytes);
}

#[test]
fn as4_path_is_discarded_between_four_octet_speakers_and_kept_otherwise() {
    let attrs = format!("{GOOD_ATTRS} c0110602010000fc00");
    let u = decode_update(&update_frame(&attrs, ONE_PREFIX), &FOUR);
    assert_eq!(
        u.errors,
        vec![soft(
            17,
            update_subcode::OPTIONAL_ATTRIBUTE_ERROR,
            ErrorAction::AttributeDiscard
        )]
    );
    // On a 2-octet session the AS_PATH holds 2-octet numbers.
    let u = decode_update(
        &update_frame(
            "40010100 4002040201fc00 400304c612fa02 c0110602010000fc00",
            ONE_PREFIX,
        ),
        &TWO,
    );
    assert!(u.errors.is_empty());
    assert_eq!(u.attributes.as_path, Some(AsPath::sequence(&[64512])));
    assert_eq!(u.attributes.other.len(), 1);
}

// ---------------------------------------------------------------- encoding choices

/// zettabgp 0.6.0 writes an AS_SEQUENCE with segment type 1 (AS_SET); ours is type 2.
#[test]
fn as_sequence_is_written_as_segment_type_2() {
    let u = Update {
        attributes: PathAttributes {
            as_path: Some(AsPath::sequence(&[64512, 64600])),
            ..PathAttributes::default()
        },
        ..Update::default()
    };
    let bytes = Message::Update(u).to_bytes(&FOUR).unwrap();
    assert_eq!(&bytes[23..], &hex("40020a 0202 0000fc00 0000fc58"));
}

#[test]
fn two_octet_session_writes_as_trans_and_as4_path_carries_the_real_path() {
    let path = AsPath::sequence(&[4_200_000_001, 64512]);
    let mut attrs = PathAttributes {
        as_path: Some(path.clone()),
        ..PathAttributes::default()
    };
    attrs.other.extend(path.as4_path_attribute());
    let bytes = Message::Update(Update {
        attributes: attrs,
        ..Update::default()
    })
    .to_bytes(&TWO)
    .unwrap();
    assert_eq!(
        &bytes[23..],
        &hex("400206 0202 5ba0 fc00  c0110a 0202 fa56ea01 0000fc00")
    );
    assert_eq!(AsPath::sequence(&[64512]).as4_path_attribute(), None);
}

#[test]
fn long_as_path_is_split_into_segments_of_255() {
    let asns: Vec<u32> = (1..=300).collect();
    let u = Update {
        attributes: PathAttributes {
            as_path: Some(AsPath::sequence(&asns)),
            ..PathAttributes::default()
        },
        ..Update::default()
    };
    let bytes = Message::Update(u).to_bytes(&FOUR).unwrap();
    let back = decode_update(&bytes, &FOUR);
    let segments = &back.attributes.as_path.unwrap().segments;
    assert_eq!(
        segments.iter().map(|s| s.asns.len()).collect::<Vec<_>>(),
        vec![255, 45]
    );
}

#[test]
fn attributes_longer_than_255_octets_get_the_extended_length_flag() {
    let communities: Vec<Community> = (0..70).map(|i| Community::new(64512, i)).collect();
    let u = Update {
        attributes: PathAttributes {
            communities: communities.clone(),
            ..PathAttributes::default()
        },
        ..Update::default()
    };
    let bytes = Message::Update(u.clone()).to_bytes(&FOUR).unwrap();
    assert_eq!(&bytes[23..27], &[0xd0, 8, 0x01, 0x18]);
    assert_eq!(decode_update(&bytes, &FOUR), u);
}

#[test]
fn host_bits_are_cleared() {
    let bytes = update_frame(GOOD_ATTRS, "18c612fa");
    let u = decode_update(&bytes, &FOUR);
    assert_eq!(u.nlri, vec!["198.18.250.0/24".parse().unwrap()]);
    let u = decode_update(&update_frame(GOOD_ATTRS, "17c612fb"), &FOUR);
    assert_eq!(u.nlri, vec!["198.18.250.0/23".parse().unwrap()]);
}

#[test]
fn thousand_prefixes_are_packed_into_messages_of_at_most_4096_octets() {
    let attrs = decode_update(&update_frame(GOOD_ATTRS, ""), &FOUR).attributes;
    let prefixes: Vec<ipnet::Ipv4Net> = (0..1000u32)
        .map(|i| ipnet::Ipv4Net::new((0xc612_0000 + i).into(), 32).unwrap())
        .collect();
    let updates = Update::announce_ipv4(&attrs, &prefixes, &FOUR).unwrap();
    assert_eq!(updates.len(), 2);
    let mut seen = Vec::new();
    for u in updates {
        let bytes = Message::Update(u).to_bytes(&FOUR).unwrap();
        assert!(bytes.len() <= 4096);
        seen.extend(decode_update(&bytes, &FOUR).nlri);
    }
    assert_eq!(seen, prefixes);
    assert_eq!(Update::withdraw_ipv4(&prefixes).len(), 2);
}

#[test]
fn thousand_ipv6_prefixes_are_packed_into_messages_of_at_most_4096_octets() {
    let attrs = PathAttributes {
        origin: Some(Origin::Igp),
        as_path: Some(AsPath::default()),
        ..PathAttributes::default()
    };
    let prefixes: Vec<ipnet::Ipv6Net> = (0..1000u128)
        .map(|i| ipnet::Ipv6Net::new((0xfd00_0018_00fa_u128 << 80 | i).into(), 128).unwrap())
        .collect();
    let nh = MpNextHop::Ipv6 {
        global: "fd00:18:fa::2".parse().unwrap(),
        link_local: None,
    };
    let mut seen = Vec::new();
    for u in Update::announce_ipv6(&attrs, nh, &prefixes, &FOUR).unwrap() {
        let bytes = Message::Update(u).to_bytes(&FOUR).unwrap();
        assert!(bytes.len() <= 4096);
        let Some(reach) = decode_update(&bytes, &FOUR).attributes.mp_reach else {
            panic!()
        };
        let Nlri::Ipv6Unicast(p) = reach.nlri else {
            panic!()
        };
        seen.extend(p);
    }
    assert_eq!(seen, prefixes);
    for u in Update::withdraw_ipv6(&prefixes) {
        assert!(Message::Update(u).to_bytes(&FOUR).unwrap().len() <= 4096);
    }
}

#[test]
fn end_of_rib_markers() {
    for family in [AfiSafi::IPV4_UNICAST, AfiSafi::IPV6_UNICAST] {
        let marker = Update::end_of_rib_marker(family);
        let bytes = Message::Update(marker).to_bytes(&FOUR).unwrap();
        assert_eq!(decode_update(&bytes, &FOUR).end_of_rib(), Some(family));
    }
    assert_eq!(
        Message::Update(Update::end_of_rib_marker(AfiSafi::IPV4_UNICAST))
            .to_bytes(&FOUR)
            .unwrap()
            .len(),
        23
    );
    assert_eq!(
        decode_update(&update_frame(GOOD_ATTRS, ONE_PREFIX), &FOUR).end_of_rib(),
        None
    );
}
