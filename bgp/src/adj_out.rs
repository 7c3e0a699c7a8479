//! What was sent to one peer (Adj-RIB-Out) and the UPDATEs that bring the peer to a new plan:
//! pure, so the packing and the withdrawals are tested without sockets.
//!
//! Prefixes with equal attributes travel in one UPDATE (as many as fit in 4096 octets); a
//! prefix whose attributes change is simply announced again (an implicit withdraw, RFC 4271
//! §3.1); prefixes that left the plan are withdrawn.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::packet::{
    AfiSafi, AsPath, CodecContext, Community, EncodeError, LargeCommunity, MpNextHop, Origin,
    PathAttributes, Update,
};

/// Attributes of one advertised prefix, beyond what the session adds (ORIGIN, AS_PATH,
/// NEXT_HOP).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteAttributes {
    /// LOCAL_PREF; only ever set towards iBGP peers (RFC 4271 §5.1.5).
    pub local_pref: Option<u32>,
    /// RFC 1997 communities, aliases resolved.
    pub communities: BTreeSet<Community>,
    /// RFC 8092 large communities.
    pub large_communities: BTreeSet<LargeCommunity>,
}

impl RouteAttributes {
    /// Adds what one more advertisement asks for the same prefix. Communities add up; the
    /// configuration's validation rejects conflicting LOCAL_PREFs, so the highest is only a
    /// tie-break.
    pub fn merge(&mut self, other: RouteAttributes) {
        self.local_pref = self.local_pref.max(other.local_pref);
        self.communities.extend(other.communities);
        self.large_communities.extend(other.large_communities);
    }
}

/// What an established session needs to build UPDATEs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionContext {
    /// Our AS as sent in the OPEN.
    pub local_as: u32,
    /// iBGP: empty AS_PATH, LOCAL_PREF allowed.
    pub internal: bool,
    /// Families negotiated with the peer.
    pub families: Vec<AfiSafi>,
    /// Next hop of IPv4 prefixes: the session's local IPv4 address (or the node's over an IPv6
    /// session). `None`: IPv4 prefixes are sent with the IPv6 next hop when
    /// `extended_next_hop` is set, and not at all otherwise.
    pub next_hop_v4: Option<Ipv4Addr>,
    /// Global next hop of IPv6 prefixes: the session's local IPv6 address (or the node's over
    /// an IPv4 session). A link-local address here is taken as `next_hop_v6_link_local`.
    pub next_hop_v6: Option<Ipv6Addr>,
    /// Our link-local address on the link shared with the peer: sent after the global next
    /// hop (32 octets, RFC 2545 §3), or alone on an unnumbered session (see
    /// [`MpNextHop::ipv6`] for the encoding). With neither this nor `next_hop_v6`, IPv6
    /// prefixes cannot be sent.
    pub next_hop_v6_link_local: Option<Ipv6Addr>,
    /// Extended next hop was negotiated for IPv4 unicast with IPv6 next hops
    /// ([`Negotiated::extended_next_hop`](crate::fsm::Negotiated::extended_next_hop)). When
    /// set and `next_hop_v4` is `None`, IPv4 prefixes go in MP_REACH_NLRI (AFI 1, SAFI 1) with
    /// the IPv6 next hop and no NEXT_HOP attribute, and are withdrawn in MP_UNREACH_NLRI
    /// (RFC 8950 §4). A session with an IPv4 next hop keeps the classic encoding, which every
    /// peer understands.
    pub extended_next_hop: bool,
    /// Codec settings negotiated in the OPENs.
    pub codec: CodecContext,
}

impl SessionContext {
    /// Whether a prefix of this family can be sent on the session.
    pub fn can_send(&self, prefix: &IpNet) -> bool {
        match prefix {
            IpNet::V4(_) => {
                (self.next_hop_v4.is_some() || self.ipv4_next_hop_is_ipv6())
                    && self.families.contains(&AfiSafi::IPV4_UNICAST)
            }
            IpNet::V6(_) => {
                self.ipv6_next_hop().is_some() && self.families.contains(&AfiSafi::IPV6_UNICAST)
            }
        }
    }

    /// The IPv6 next hop in MP_REACH_NLRI: global, global and link-local, or link-local
    /// alone; `None` without any IPv6 address.
    pub fn ipv6_next_hop(&self) -> Option<MpNextHop> {
        MpNextHop::ipv6(self.next_hop_v6, self.next_hop_v6_link_local)
    }

    /// True when IPv4 prefixes travel in MP_REACH_NLRI with the IPv6 next hop (RFC 8950):
    /// extended next hop negotiated, no IPv4 next hop, and an IPv6 one.
    pub fn ipv4_next_hop_is_ipv6(&self) -> bool {
        self.extended_next_hop && self.next_hop_v4.is_none() && self.ipv6_next_hop().is_some()
    }

    fn attributes(&self, route: &RouteAttributes) -> PathAttributes {
        PathAttributes {
            origin: Some(Origin::Igp),
            as_path: Some(if self.internal {
                AsPath::sequence(&[])
            } else {
                AsPath::sequence(&[self.local_as])
            }),
            local_pref: route.local_pref.filter(|_| self.internal),
            communities: route.communities.iter().copied().collect(),
            large_communities: route.large_communities.iter().copied().collect(),
            ..PathAttributes::default()
        }
    }
}

/// The routes a peer holds from us.
pub type AdjRibOut = BTreeMap<IpNet, RouteAttributes>;

/// The UPDATEs that take the peer from `sent` to `desired`, and the new Adj-RIB-Out (which
/// leaves out prefixes the session cannot carry).
pub fn diff(
    sent: &AdjRibOut,
    desired: &AdjRibOut,
    ctx: &SessionContext,
) -> Result<(Vec<Update>, AdjRibOut), EncodeError> {
    let next: AdjRibOut = desired
        .iter()
        .filter(|(p, _)| ctx.can_send(p))
        .map(|(p, a)| (*p, a.clone()))
        .collect();
    let mut withdraw4: Vec<Ipv4Net> = Vec::new();
    let mut withdraw6: Vec<Ipv6Net> = Vec::new();
    for prefix in sent.keys().filter(|p| !next.contains_key(p)) {
        match prefix {
            IpNet::V4(p) => withdraw4.push(*p),
            IpNet::V6(p) => withdraw6.push(*p),
        }
    }
    // Group new or changed prefixes by attributes, so equal ones share UPDATEs.
    let mut groups: BTreeMap<&RouteAttributes, (Vec<Ipv4Net>, Vec<Ipv6Net>)> = BTreeMap::new();
    for (prefix, attrs) in &next {
        if sent.get(prefix) == Some(attrs) {
            continue;
        }
        let g = groups.entry(attrs).or_default();
        match prefix {
            IpNet::V4(p) => g.0.push(*p),
            IpNet::V6(p) => g.1.push(*p),
        }
    }
    let mut updates = Vec::new();
    if !withdraw4.is_empty() {
        // Withdrawn where they were announced. The session's next hops do not change while it
        // is up (the driver builds a new context, and clears the Adj-RIB-Out, per session).
        updates.extend(if ctx.ipv4_next_hop_is_ipv6() {
            Update::withdraw_ipv4_mp(&withdraw4)
        } else {
            Update::withdraw_ipv4(&withdraw4)
        });
    }
    if !withdraw6.is_empty() {
        updates.extend(Update::withdraw_ipv6(&withdraw6));
    }
    let v6_next_hop = ctx.ipv6_next_hop();
    for (attrs, (v4, v6)) in groups {
        let base = ctx.attributes(attrs);
        if !v4.is_empty() {
            match (ctx.next_hop_v4, &v6_next_hop) {
                (Some(nh), _) => {
                    let mut a = base.clone();
                    a.next_hop = Some(nh);
                    updates.extend(Update::announce_ipv4(&a, &v4, &ctx.codec)?);
                }
                (None, Some(nh)) if ctx.extended_next_hop => {
                    updates.extend(Update::announce_ipv4_mp(
                        &base,
                        nh.clone(),
                        &v4,
                        &ctx.codec,
                    )?);
                }
                // `can_send` kept them out of `next`.
                _ => {}
            }
        }
        if let (false, Some(nh)) = (v6.is_empty(), &v6_next_hop) {
            updates.extend(Update::announce_ipv6(&base, nh.clone(), &v6, &ctx.codec)?);
        }
    }
    Ok((updates, next))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::packet::{Message, Nlri};
    use proptest::prelude::*;

    fn ctx() -> SessionContext {
        SessionContext {
            local_as: 64512,
            internal: false,
            families: vec![AfiSafi::IPV4_UNICAST, AfiSafi::IPV6_UNICAST],
            next_hop_v4: Some("198.18.0.1".parse().unwrap()),
            next_hop_v6: Some("fd00:18::1".parse().unwrap()),
            next_hop_v6_link_local: None,
            extended_next_hop: false,
            codec: CodecContext::default(),
        }
    }

    /// An unnumbered session: only our link-local address, extended next hop negotiated.
    fn unnumbered() -> SessionContext {
        SessionContext {
            next_hop_v4: None,
            next_hop_v6: None,
            next_hop_v6_link_local: Some(LINK_LOCAL),
            extended_next_hop: true,
            ..ctx()
        }
    }

    const LINK_LOCAL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

    fn attrs(c: u16) -> RouteAttributes {
        RouteAttributes {
            local_pref: Some(100),
            communities: [Community::new(64512, c)].into(),
            ..Default::default()
        }
    }

    /// Applies UPDATEs (after an encode/decode round trip) to a table, as a peer would, and
    /// checks every next hop is `ctx`'s.
    fn apply(
        table: &mut BTreeMap<IpNet, PathAttributes>,
        updates: &[Update],
        ctx: &SessionContext,
    ) {
        for u in updates {
            let bytes = Message::Update(u.clone())
                .to_bytes(&CodecContext::default())
                .unwrap();
            let Message::Update(u) = Message::decode(&bytes, &CodecContext::default()).unwrap()
            else {
                panic!("not an update")
            };
            assert!(bytes.len() <= 4096);
            for p in &u.withdrawn {
                table.remove(&IpNet::V4(*p));
            }
            match u.attributes.mp_unreach.as_ref().map(|un| &un.withdrawn) {
                Some(Nlri::Ipv6Unicast(ps)) => ps.iter().for_each(|p| {
                    table.remove(&IpNet::V6(*p));
                }),
                Some(Nlri::Ipv4Unicast(ps)) => ps.iter().for_each(|p| {
                    table.remove(&IpNet::V4(*p));
                }),
                _ => {}
            }
            if !u.nlri.is_empty() {
                assert_eq!(u.attributes.next_hop, ctx.next_hop_v4);
            }
            let mut a = u.attributes.clone();
            a.mp_reach = None;
            a.mp_unreach = None;
            for p in &u.nlri {
                table.insert(IpNet::V4(*p), a.clone());
            }
            if let Some(r) = &u.attributes.mp_reach {
                assert_eq!(Some(&r.next_hop), ctx.ipv6_next_hop().as_ref());
                // RFC 4760 §3: no NEXT_HOP when all NLRI is in MP_REACH_NLRI.
                assert_eq!(u.attributes.next_hop, None);
                match &r.nlri {
                    Nlri::Ipv6Unicast(ps) => ps.iter().for_each(|p| {
                        table.insert(IpNet::V6(*p), a.clone());
                    }),
                    Nlri::Ipv4Unicast(ps) => ps.iter().for_each(|p| {
                        table.insert(IpNet::V4(*p), a.clone());
                    }),
                    Nlri::Other { .. } => panic!("unexpected family"),
                }
            }
        }
    }

    #[test]
    fn equal_attributes_share_one_update_and_ebgp_drops_local_pref() {
        let desired: AdjRibOut = [
            ("198.18.200.1/32", 1),
            ("198.18.200.2/32", 1),
            ("198.18.200.3/32", 2),
            ("fd00:18::c8:1/128", 1),
        ]
        .into_iter()
        .map(|(p, c)| (p.parse().unwrap(), attrs(c)))
        .collect();
        let (updates, sent) = diff(&AdjRibOut::new(), &desired, &ctx()).unwrap();
        // Community 1: one IPv4 UPDATE with two prefixes and one IPv6; community 2: one IPv4.
        assert_eq!(updates.len(), 3);
        assert_eq!(updates[0].nlri.len(), 2);
        assert_eq!(
            updates[0].attributes.as_path,
            Some(AsPath::sequence(&[64512]))
        );
        assert_eq!(updates[0].attributes.local_pref, None);
        assert_eq!(sent, desired);
        // Nothing changed: nothing to send.
        let (again, _) = diff(&sent, &desired, &ctx()).unwrap();
        assert!(again.is_empty());
    }

    #[test]
    fn withdraws_what_is_gone_and_skips_what_cannot_be_sent() {
        let mut c = ctx();
        c.next_hop_v6 = None;
        c.internal = true;
        let desired: AdjRibOut = [("198.18.200.1/32", 1), ("fd00:18::c8:1/128", 1)]
            .into_iter()
            .map(|(p, c)| (p.parse().unwrap(), attrs(c)))
            .collect();
        let (updates, sent) = diff(&AdjRibOut::new(), &desired, &c).unwrap();
        assert_eq!(updates.len(), 1);
        assert_eq!(updates[0].attributes.local_pref, Some(100));
        assert_eq!(updates[0].attributes.as_path, Some(AsPath::sequence(&[])));
        assert_eq!(sent.len(), 1);
        let (updates, sent) = diff(&sent, &AdjRibOut::new(), &c).unwrap();
        assert_eq!(updates.len(), 1);
        assert_eq!(
            updates[0].withdrawn,
            vec!["198.18.200.1/32".parse().unwrap()]
        );
        assert!(sent.is_empty());
    }

    fn table_strategy() -> impl Strategy<Value = AdjRibOut> {
        proptest::collection::btree_map(
            prop_oneof![
                (any::<u32>(), 8u8..=32).prop_map(|(a, l)| IpNet::V4(
                    Ipv4Net::new(Ipv4Addr::from(a), l).unwrap().trunc()
                )),
                (any::<u128>(), 16u8..=128).prop_map(|(a, l)| IpNet::V6(
                    Ipv6Net::new(Ipv6Addr::from(a), l).unwrap().trunc()
                )),
            ],
            (0u16..3).prop_map(attrs),
            0..400,
        )
    }

    #[test]
    fn unnumbered_session_sends_ipv4_in_mp_reach_with_the_link_local_next_hop() {
        let c = unnumbered();
        let v4: IpNet = "198.18.201.1/32".parse().unwrap();
        let v6: IpNet = "fd00:18::c9:1/128".parse().unwrap();
        assert!(c.can_send(&v4));
        assert!(c.can_send(&v6));
        let desired: AdjRibOut = [(v4, attrs(1)), (v6, attrs(1))].into();
        let (updates, sent) = diff(&AdjRibOut::new(), &desired, &c).unwrap();
        assert_eq!(sent, desired);
        let ll_twice = MpNextHop::Ipv6 {
            global: LINK_LOCAL,
            link_local: Some(LINK_LOCAL),
        };
        assert_eq!(updates.len(), 2);
        for u in &updates {
            assert!(u.nlri.is_empty() && u.withdrawn.is_empty());
            assert_eq!(u.attributes.next_hop, None);
            assert_eq!(
                u.attributes.mp_reach.as_ref().map(|r| &r.next_hop),
                Some(&ll_twice)
            );
        }
        assert_eq!(
            updates[0].attributes.mp_reach.as_ref().unwrap().nlri,
            Nlri::Ipv4Unicast(vec!["198.18.201.1/32".parse().unwrap()])
        );
        // Withdrawn in MP_UNREACH_NLRI, where they were announced.
        let (updates, sent) = diff(&sent, &AdjRibOut::new(), &c).unwrap();
        assert!(sent.is_empty());
        let withdrawn: Vec<&Nlri> = updates
            .iter()
            .filter_map(|u| u.attributes.mp_unreach.as_ref().map(|m| &m.withdrawn))
            .collect();
        assert_eq!(
            withdrawn,
            [
                &Nlri::Ipv4Unicast(vec!["198.18.201.1/32".parse().unwrap()]),
                &Nlri::Ipv6Unicast(vec!["fd00:18::c9:1/128".parse().unwrap()]),
            ]
        );
        assert!(updates.iter().all(|u| u.withdrawn.is_empty()));
    }

    #[test]
    fn ipv4_without_ipv4_next_hop_needs_extended_next_hop() {
        let v4: IpNet = "198.18.201.1/32".parse().unwrap();
        let not_negotiated = SessionContext {
            extended_next_hop: false,
            ..unnumbered()
        };
        assert!(!not_negotiated.can_send(&v4));
        let desired: AdjRibOut = [(v4, attrs(1))].into();
        let (updates, sent) = diff(&AdjRibOut::new(), &desired, &not_negotiated).unwrap();
        assert!(updates.is_empty() && sent.is_empty());
        // Negotiated, but no IPv6 address either.
        let no_address = SessionContext {
            next_hop_v6_link_local: None,
            ..unnumbered()
        };
        assert!(!no_address.can_send(&v4));
        // With an IPv4 next hop the classic encoding stays, negotiated or not.
        let numbered = SessionContext {
            extended_next_hop: true,
            ..ctx()
        };
        assert!(!numbered.ipv4_next_hop_is_ipv6());
        let (updates, _) = diff(&AdjRibOut::new(), &desired, &numbered).unwrap();
        assert_eq!(updates[0].nlri, vec!["198.18.201.1/32".parse().unwrap()]);
        assert_eq!(updates[0].attributes.mp_reach, None);
    }

    #[test]
    fn ipv6_next_hop_takes_global_link_local_or_both() {
        let global: Ipv6Addr = "fd00:18::1".parse().unwrap();
        let with = |g, ll| SessionContext {
            next_hop_v6: g,
            next_hop_v6_link_local: ll,
            ..ctx()
        };
        assert_eq!(
            with(Some(global), None).ipv6_next_hop(),
            Some(MpNextHop::Ipv6 {
                global,
                link_local: None
            })
        );
        assert_eq!(
            with(Some(global), Some(LINK_LOCAL)).ipv6_next_hop(),
            Some(MpNextHop::Ipv6 {
                global,
                link_local: Some(LINK_LOCAL)
            })
        );
        let ll_twice = Some(MpNextHop::Ipv6 {
            global: LINK_LOCAL,
            link_local: Some(LINK_LOCAL),
        });
        assert_eq!(with(None, Some(LINK_LOCAL)).ipv6_next_hop(), ll_twice);
        // A link-local address given as the global one (the session's local address on an
        // unnumbered session) is not sent as if it were global.
        assert_eq!(with(Some(LINK_LOCAL), None).ipv6_next_hop(), ll_twice);
        assert_eq!(with(None, None).ipv6_next_hop(), None);
        assert!(!with(None, None).can_send(&"fd00:18::c9:1/128".parse().unwrap()));
    }

    /// Sessions the property runs on: classic, unnumbered, global plus link-local with extended
    /// next hop and no IPv4 next hop, and extended next hop with an IPv4 next hop.
    fn session_strategy() -> impl Strategy<Value = SessionContext> {
        prop_oneof![
            Just(ctx()),
            Just(unnumbered()),
            Just(SessionContext {
                next_hop_v4: None,
                next_hop_v6_link_local: Some(LINK_LOCAL),
                extended_next_hop: true,
                ..ctx()
            }),
            Just(SessionContext {
                extended_next_hop: true,
                ..ctx()
            }),
        ]
    }

    proptest! {
        /// After any sequence of plans, the peer's table (built from the encoded UPDATEs) holds
        /// exactly the last plan, with the attributes it asks for.
        #[test]
        fn peer_table_follows_the_plans(
            plans in proptest::collection::vec(table_strategy(), 1..4),
            ctx in session_strategy(),
        ) {
            let mut sent = AdjRibOut::new();
            let mut table = BTreeMap::new();
            for desired in &plans {
                let (updates, next) = diff(&sent, desired, &ctx).unwrap();
                apply(&mut table, &updates, &ctx);
                sent = next;
                prop_assert_eq!(table.keys().collect::<Vec<_>>(), desired.keys().collect::<Vec<_>>());
                for (p, a) in &table {
                    let want = &desired[p];
                    prop_assert_eq!(&a.communities, &want.communities.iter().copied().collect::<Vec<_>>());
                    prop_assert_eq!(a.local_pref, None);
                    let classic_v4 = matches!(p, IpNet::V4(_)) && !ctx.ipv4_next_hop_is_ipv6();
                    prop_assert_eq!(a.next_hop.is_some(), classic_v4);
                }
            }
        }
    }
}
