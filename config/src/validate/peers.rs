//! BGPPeer and BFDProfile rules: per-object checks, references, and conflicts between peers that
//! share a node.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use super::{
    Kind, NodeInfo, ObjectRef, Report, by_age, compile_selectors, parse_go_duration, share_a_node,
};
use crate::crd::{BFDProfile, BGPPeer, BGPPeerSpec, DynamicAsn};
use crate::model::{
    BFD_AUTHENTICATION, BFD_AUTHENTICATION_KEY_ID, BFD_AUTHENTICATION_SECRET, BfdAuthentication,
    BfdProfile, Peer, PeerAsn, PeerPassword, PeerTarget,
};
use ferrolb_bfd::auth::AuthType;

/// MetalLB's default hold time when neither timer is set.
const DEFAULT_HOLD: Duration = Duration::from_secs(90);

/// The longest TCP MD5 key, in bytes: Linux's `TCP_MD5SIG_MAXKEYLEN` (FRR refuses longer
/// passwords too). A longer password cannot protect the session at all.
const MAX_PASSWORD_BYTES: usize = 80;

/// Validates BFD profiles, applying MetalLB's defaults.
pub(super) fn validate_bfd_profiles(
    report: &mut Report,
    objects: &[BFDProfile],
) -> BTreeMap<String, BfdProfile> {
    let mut accepted = BTreeMap::new();
    for object in by_age(objects) {
        let me = ObjectRef::of(Kind::BFDProfile, &object.metadata);
        let mark = report.mark();
        let s = &object.spec;
        let mut field = |name: &str, value: Option<u32>, min: u32, max: u32, default: u32| -> u32 {
            let v = value.unwrap_or(default);
            if !(min..=max).contains(&v) {
                report.error(
                    &me,
                    format!("spec.{name}"),
                    format!("{v} is outside {min}-{max}"),
                );
            }
            v
        };
        let profile = BfdProfile {
            name: me.name.clone(),
            receive_interval_ms: field("receiveInterval", s.receive_interval, 10, 60000, 300),
            transmit_interval_ms: field("transmitInterval", s.transmit_interval, 10, 60000, 300),
            detect_multiplier: field("detectMultiplier", s.detect_multiplier, 2, 255, 3),
            echo_interval_ms: field("echoInterval", s.echo_interval, 10, 60000, 50),
            minimum_ttl: field("minimumTtl", s.minimum_ttl, 1, 254, 254),
            echo_mode: s.echo_mode.unwrap_or(false),
            passive_mode: s.passive_mode.unwrap_or(false),
            authentication: bfd_authentication(report, &me, &object.metadata),
        };
        if !report.failed_since(mark) {
            accepted.insert(profile.name.clone(), profile);
        }
    }
    accepted
}

/// A BFDProfile's authentication, from its ferrolb annotations: the type and the Secret are
/// both needed, the key ID defaults to 1. Errors name the annotation.
fn bfd_authentication(
    report: &mut Report,
    me: &ObjectRef,
    metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<BfdAuthentication> {
    let annotation = |key: &str| {
        metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(|v| v.trim())
    };
    let field = |key: &str| format!("metadata.annotations[{key}]");
    let kind = annotation(BFD_AUTHENTICATION);
    let secret = annotation(BFD_AUTHENTICATION_SECRET);
    let key_id = annotation(BFD_AUTHENTICATION_KEY_ID);
    if kind.is_none() && secret.is_none() && key_id.is_none() {
        return None;
    }
    let names = || {
        AuthType::ALL
            .iter()
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let kind = match kind {
        Some(k) => match AuthType::from_name(k) {
            Some(t) => Some(t),
            None => {
                report.error(
                    me,
                    field(BFD_AUTHENTICATION),
                    format!("{k:?} is not one of {}", names()),
                );
                None
            }
        },
        None => {
            report.error(
                me,
                field(BFD_AUTHENTICATION),
                format!(
                    "missing: {BFD_AUTHENTICATION_SECRET} or {BFD_AUTHENTICATION_KEY_ID} is set, so the type is needed (one of {})",
                    names()
                ),
            );
            None
        }
    };
    let secret = match secret {
        Some(s) if !s.is_empty() => Some(s.to_string()),
        _ => {
            report.error(
                me,
                field(BFD_AUTHENTICATION_SECRET),
                "missing: authentication needs the name of a Secret in the speaker's namespace whose key \"password\" holds the key",
            );
            None
        }
    };
    let key_id = match key_id {
        None => Some(1),
        Some(text) => match text.parse::<u8>() {
            Ok(id) => Some(id),
            Err(_) => {
                report.error(
                    me,
                    field(BFD_AUTHENTICATION_KEY_ID),
                    format!("{text:?} is not a key ID (0-255)"),
                );
                None
            }
        },
    };
    Some(BfdAuthentication {
        kind: kind?,
        key_id: key_id?,
        secret: secret?,
    })
}

fn parse_timer(
    report: &mut Report,
    me: &ObjectRef,
    field: &str,
    text: Option<&str>,
) -> Option<Duration> {
    let text = text?;
    match parse_go_duration(text) {
        Ok(d) => Some(d),
        Err(e) => {
            report.error(me, field, e.to_string());
            None
        }
    }
}

/// Hold and keepalive as MetalLB derives them: one given → the other follows (×3 or ÷3).
fn timers(
    report: &mut Report,
    me: &ObjectRef,
    hold: Option<Duration>,
    keepalive: Option<Duration>,
) -> (Duration, Duration) {
    let (hold, keepalive) = match (hold, keepalive) {
        (None, None) => (DEFAULT_HOLD, DEFAULT_HOLD / 3),
        (Some(h), None) => (h, h / 3),
        (None, Some(k)) => (k * 3, k),
        (Some(h), Some(k)) => (h, k),
    };
    if !hold.is_zero() && hold < Duration::from_secs(3) {
        report.error(
            me,
            "spec.holdTime",
            format!("{hold:?} is too short: use 0 (no keepalives) or at least 3s"),
        );
    }
    if keepalive > hold {
        report.error(
            me,
            "spec.keepaliveTime",
            format!("{keepalive:?} exceeds the hold time {hold:?}"),
        );
    }
    (hold, keepalive)
}

fn parse_ip(
    report: &mut Report,
    me: &ObjectRef,
    field: &str,
    text: Option<&str>,
) -> Option<IpAddr> {
    let text = text?;
    match text.parse() {
        Ok(ip) => Some(ip),
        Err(_) => {
            report.error(me, field, format!("{text:?} is not an IP address"));
            None
        }
    }
}

fn validate_one(
    report: &mut Report,
    me: &ObjectRef,
    object: &BGPPeer,
    bfd_objects: &[BFDProfile],
    bfd_profiles: &BTreeMap<String, BfdProfile>,
    namespace: &str,
) -> Option<Peer> {
    let mark = report.mark();
    let s = &object.spec;
    if s.my_asn == 0 {
        report.error(
            me,
            "spec.myASN",
            "must be set to our AS number (1-4294967295)",
        );
    }
    let peer_asn = peer_asn(report, me, s);
    let target = peer_target(report, me, s);
    let source_address = parse_ip(
        report,
        me,
        "spec.sourceAddress",
        s.source_address.as_deref(),
    );
    let router_id = router_id(report, me, s.router_id.as_deref());
    let (hold_time, keepalive_time, connect_time) = session_timers(report, me, s);
    if s.peer_port == 0 {
        report.error(me, "spec.peerPort", "must be 1-16384");
    }
    let password = password(report, me, s, namespace);
    check_bfd_reference(report, me, s, bfd_objects, bfd_profiles);
    let node_selectors = compile_selectors(report, me, "spec.nodeSelectors", &s.node_selectors);
    let peer = Peer {
        name: me.name.clone(),
        my_asn: s.my_asn,
        peer_asn: peer_asn.unwrap_or(PeerAsn::External),
        target: target.unwrap_or(PeerTarget::Interface(String::new())),
        source_address,
        port: s.peer_port,
        hold_time,
        keepalive_time,
        connect_time,
        router_id,
        node_selectors,
        password,
        bfd_profile: s.bfd_profile.clone(),
        ebgp_multi_hop: s.ebgp_multi_hop.unwrap_or(false),
        vrf: s.vrf.clone().filter(|v| !v.is_empty()),
        graceful_restart: s.enable_graceful_restart,
        local_asn: s.local_asn,
        dual_stack_address_family: s.dual_stack_address_family.unwrap_or(false),
        disable_mp: s.disable_mp.unwrap_or(false),
    };
    if peer_asn.is_some() && peer.ebgp_multi_hop && peer.is_ibgp() {
        report.error(
            me,
            "spec.ebgpMultiHop",
            "is for eBGP sessions; this session is iBGP (the peer is in our AS)",
        );
    }
    (!report.failed_since(mark)).then_some(peer)
}

/// The peer's AS: exactly one of `peerASN` (non-zero) and `dynamicASN`.
fn peer_asn(report: &mut Report, me: &ObjectRef, s: &BGPPeerSpec) -> Option<PeerAsn> {
    match (s.peer_asn, s.dynamic_asn) {
        (Some(_), Some(_)) => {
            report.error(
                me,
                "spec.dynamicASN",
                "peerASN and dynamicASN cannot both be set",
            );
            None
        }
        (None, None) | (Some(0), None) => {
            report.error(
                me,
                "spec.peerASN",
                "set either peerASN or dynamicASN (internal or external)",
            );
            None
        }
        (Some(asn), None) => Some(PeerAsn::Fixed(asn)),
        (None, Some(DynamicAsn::Internal)) => Some(PeerAsn::Internal),
        (None, Some(DynamicAsn::External)) => Some(PeerAsn::External),
    }
}

/// Where the session goes: exactly one of `peerAddress` and `interface` (unnumbered).
fn peer_target(report: &mut Report, me: &ObjectRef, s: &BGPPeerSpec) -> Option<PeerTarget> {
    match (&s.peer_address, &s.interface) {
        (Some(_), Some(_)) => {
            report.error(
                me,
                "spec.interface",
                "peerAddress and interface cannot both be set",
            );
            None
        }
        (None, None) => {
            report.error(
                me,
                "spec.peerAddress",
                "set either peerAddress or interface",
            );
            None
        }
        (Some(addr), None) => {
            parse_ip(report, me, "spec.peerAddress", Some(addr)).map(PeerTarget::Address)
        }
        (None, Some(ifname)) => Some(PeerTarget::Interface(ifname.clone())),
    }
}

fn router_id(report: &mut Report, me: &ObjectRef, text: Option<&str>) -> Option<Ipv4Addr> {
    let text = text?;
    match text.parse::<Ipv4Addr>() {
        Ok(id) => Some(id),
        Err(_) => {
            report.error(
                me,
                "spec.routerID",
                format!("{text:?} is not a router ID (an IPv4 address such as 10.0.0.1)"),
            );
            None
        }
    }
}

/// Hold, keepalive and connect times, each checked against its range.
fn session_timers(
    report: &mut Report,
    me: &ObjectRef,
    s: &BGPPeerSpec,
) -> (Duration, Duration, Option<Duration>) {
    let hold = parse_timer(report, me, "spec.holdTime", s.hold_time.as_deref());
    let keepalive = parse_timer(
        report,
        me,
        "spec.keepaliveTime",
        s.keepalive_time.as_deref(),
    );
    let (hold_time, keepalive_time) = timers(report, me, hold, keepalive);
    let connect_time = parse_timer(report, me, "spec.connectTime", s.connect_time.as_deref());
    if let Some(c) =
        connect_time.filter(|c| *c < Duration::from_secs(1) || *c > Duration::from_secs(65535))
    {
        report.error(
            me,
            "spec.connectTime",
            format!("{c:?} is outside 1s-65535s"),
        );
    }
    (hold_time, keepalive_time, connect_time)
}

/// The TCP MD5 password: inline (at most [`MAX_PASSWORD_BYTES`]) or from a Secret in ferrolb's
/// own namespace, never both.
fn password(
    report: &mut Report,
    me: &ObjectRef,
    s: &BGPPeerSpec,
    namespace: &str,
) -> Option<PeerPassword> {
    match (&s.password, &s.password_secret) {
        (Some(_), Some(_)) => {
            report.error(
                me,
                "spec.passwordSecret",
                "password and passwordSecret cannot both be set",
            );
            None
        }
        (Some(p), None) => {
            if p.len() > MAX_PASSWORD_BYTES {
                report.error(
                    me,
                    "spec.password",
                    format!(
                        "is {} bytes; a TCP MD5 password is at most {MAX_PASSWORD_BYTES} bytes (Linux TCP_MD5SIG_MAXKEYLEN)",
                        p.len()
                    ),
                );
            }
            Some(PeerPassword::Plain(p.clone()))
        }
        (None, Some(secret)) => {
            let name = secret.name.clone().unwrap_or_default();
            if name.is_empty() {
                report.error(me, "spec.passwordSecret.name", "must name a Secret");
            }
            let ns = secret
                .namespace
                .clone()
                .unwrap_or_else(|| namespace.to_string());
            if ns != namespace {
                report.error(
                    me,
                    "spec.passwordSecret.namespace",
                    format!("the Secret must be in ferrolb's namespace {namespace:?}, not {ns:?}"),
                );
            }
            Some(PeerPassword::Secret {
                name,
                namespace: ns,
            })
        }
        (None, None) => None,
    }
}

/// A named BFD profile must be an accepted one; the error says whether it is missing or invalid.
fn check_bfd_reference(
    report: &mut Report,
    me: &ObjectRef,
    s: &BGPPeerSpec,
    bfd_objects: &[BFDProfile],
    bfd_profiles: &BTreeMap<String, BfdProfile>,
) {
    if let Some(profile) = &s.bfd_profile
        && !bfd_profiles.contains_key(profile)
    {
        let exists = bfd_objects
            .iter()
            .any(|b| b.metadata.name.as_deref() == Some(profile));
        let why = if exists {
            "is itself invalid"
        } else {
            "does not exist"
        };
        report.error(
            me,
            "spec.bfdProfile",
            format!("BFDProfile {profile:?} {why}"),
        );
    }
}

/// Validates peers; a peer conflicting with an older accepted peer on a shared node is left out.
pub(super) fn validate(
    report: &mut Report,
    objects: &[BGPPeer],
    bfd_objects: &[BFDProfile],
    bfd_profiles: &BTreeMap<String, BfdProfile>,
    namespace: &str,
    nodes: Option<&[NodeInfo]>,
) -> BTreeMap<String, Peer> {
    let mut accepted: BTreeMap<String, Peer> = BTreeMap::new();
    for object in by_age(objects) {
        let me = ObjectRef::of(Kind::BGPPeer, &object.metadata);
        let mark = report.mark();
        let Some(peer) = validate_one(report, &me, object, bfd_objects, bfd_profiles, namespace)
        else {
            continue;
        };
        for other in accepted.values() {
            if peer.vrf != other.vrf
                || !share_a_node(nodes, &peer.node_selectors, &other.node_selectors)
            {
                continue;
            }
            let with = format!(
                "the older BGPPeer {:?}, which runs on the same nodes",
                other.name
            );
            if let (Some(a), Some(b)) = (peer.router_id, other.router_id)
                && a != b
            {
                report.error(
                    &me,
                    "spec.routerID",
                    format!("{a} differs from routerID {b} of {with}; a node has one router ID"),
                );
            }
            if peer.my_asn != other.my_asn {
                report.error(
                    &me,
                    "spec.myASN",
                    format!(
                        "{} differs from myASN {} of {with}; a node has one AS",
                        peer.my_asn, other.my_asn
                    ),
                );
            }
            if peer.target == other.target && peer.port == other.port {
                let what = match &peer.target {
                    PeerTarget::Address(ip) => format!("address {ip}"),
                    PeerTarget::Interface(i) => format!("interface {i}"),
                };
                report.error(
                    &me,
                    "spec.peerAddress",
                    format!("{with} already peers with {what} port {}", peer.port),
                );
            }
        }
        if !report.failed_since(mark) {
            accepted.insert(peer.name.clone(), peer);
        }
    }
    accepted
}
