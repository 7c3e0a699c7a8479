//! The validated internal model: what the controller and the speakers act on. Every value here
//! has passed validation, so consumers never re-check syntax.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use crate::address::IpRange;
use crate::selector::{Labels, Selector, any_matches};

/// A namespace's ferrolb configuration after validation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    /// Address pools by name.
    pub pools: BTreeMap<String, Pool>,
    /// Layer 2 advertisements by name.
    pub l2_advertisements: BTreeMap<String, L2Advertisement>,
    /// BGP advertisements by name.
    pub bgp_advertisements: BTreeMap<String, BgpAdvertisement>,
    /// BGP peers by name.
    pub peers: BTreeMap<String, Peer>,
    /// BFD profiles by name.
    pub bfd_profiles: BTreeMap<String, BfdProfile>,
    /// Community aliases by name.
    pub communities: BTreeMap<String, CommunityValue>,
}

/// An address pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    /// Name of the IPAddressPool.
    pub name: String,
    /// Labels of the IPAddressPool (advertisements select pools by label).
    pub labels: Labels,
    /// Addresses, sorted and non-overlapping.
    pub ranges: Vec<IpRange>,
    /// Whether Services get addresses from this pool without asking for it.
    pub auto_assign: bool,
    /// Skip IPv4 addresses ending in .0 or .255.
    pub avoid_buggy_ips: bool,
    /// Restriction to some Services, if any.
    pub allocation: Option<PoolAllocation>,
}

/// `serviceAllocation` of a pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolAllocation {
    /// Lower first; `None` (or 0 in the object) after every set priority.
    pub priority: Option<u32>,
    /// Namespaces admitted by name. Empty: no restriction by name.
    pub namespaces: BTreeSet<String>,
    /// Namespaces admitted by label. Empty: no restriction by label.
    pub namespace_selectors: Vec<Selector>,
    /// Services admitted by label. Empty: no restriction by label.
    pub service_selectors: Vec<Selector>,
}

impl PoolAllocation {
    /// Whether a Service in `namespace` (with `namespace_labels`) and with `service_labels` may
    /// use the pool: each non-empty list must match.
    pub fn admits(
        &self,
        namespace: &str,
        namespace_labels: &Labels,
        service_labels: &Labels,
    ) -> bool {
        (self.namespaces.is_empty() || self.namespaces.contains(namespace))
            && any_matches(&self.namespace_selectors, namespace_labels)
            && any_matches(&self.service_selectors, service_labels)
    }
}

impl Pool {
    /// Whether a Service may use this pool at all (autoAssign aside).
    pub fn admits(
        &self,
        namespace: &str,
        namespace_labels: &Labels,
        service_labels: &Labels,
    ) -> bool {
        self.allocation
            .as_ref()
            .is_none_or(|a| a.admits(namespace, namespace_labels, service_labels))
    }

    /// Whether the pool holds this address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(ip))
    }
}

/// Which pools an advertisement covers. Both lists empty: every pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolSelection {
    /// Pools by name.
    pub names: BTreeSet<String>,
    /// Pools by label.
    pub selectors: Vec<Selector>,
}

impl PoolSelection {
    /// Whether the selection covers this pool.
    pub fn covers(&self, pool: &Pool) -> bool {
        (self.names.is_empty() && self.selectors.is_empty())
            || self.names.contains(&pool.name)
            || self.selectors.iter().any(|s| s.matches(&pool.labels))
    }
}

/// A layer 2 advertisement.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct L2Advertisement {
    /// Name of the object.
    pub name: String,
    /// Pools covered.
    pub pools: PoolSelection,
    /// Nodes that may announce; empty: all.
    pub node_selectors: Vec<Selector>,
    /// Interfaces to announce on; empty: every eligible interface.
    pub interfaces: Vec<String>,
    /// Services covered; empty: all.
    pub service_selectors: Vec<Selector>,
}

/// A BGP community value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CommunityValue {
    /// RFC 1997 community `a:b`.
    Standard(u16, u16),
    /// RFC 8092 large community `large:a:b:c`.
    Large(u32, u32, u32),
}

/// A BGP advertisement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BgpAdvertisement {
    /// Name of the object.
    pub name: String,
    /// IPv4 aggregation prefix length.
    pub aggregation_length: u8,
    /// IPv6 aggregation prefix length.
    pub aggregation_length_v6: u8,
    /// LOCAL_PREF, if set.
    pub local_pref: Option<u32>,
    /// Communities, aliases resolved.
    pub communities: BTreeSet<CommunityValue>,
    /// Pools covered.
    pub pools: PoolSelection,
    /// Nodes that advertise; empty: all.
    pub node_selectors: Vec<Selector>,
    /// Peers advertised to by name; empty: all.
    pub peers: BTreeSet<String>,
    /// Services covered; empty: all.
    pub service_selectors: Vec<Selector>,
}

/// How the peer's AS number is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerAsn {
    /// A fixed AS number.
    Fixed(u32),
    /// Same AS as ours (iBGP), learned from the OPEN.
    Internal,
    /// Another AS (eBGP), learned from the OPEN.
    External,
}

/// Where the session goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerTarget {
    /// A peer address.
    Address(IpAddr),
    /// Unnumbered over an interface.
    Interface(String),
}

/// Where the TCP MD5 password comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerPassword {
    /// Given in the object.
    Plain(String),
    /// In a Secret (key `password`).
    Secret {
        /// Secret name.
        name: String,
        /// Secret namespace.
        namespace: String,
    },
}

/// A BGP peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Name of the object.
    pub name: String,
    /// Our AS.
    pub my_asn: u32,
    /// The peer's AS.
    pub peer_asn: PeerAsn,
    /// Address or interface.
    pub target: PeerTarget,
    /// Local address to connect from.
    pub source_address: Option<IpAddr>,
    /// TCP port.
    pub port: u16,
    /// Hold time (0 disables keepalives).
    pub hold_time: Duration,
    /// Keepalive interval.
    pub keepalive_time: Duration,
    /// Connect retry time.
    pub connect_time: Option<Duration>,
    /// Router ID, if fixed.
    pub router_id: Option<Ipv4Addr>,
    /// Nodes that open the session; empty: all.
    pub node_selectors: Vec<Selector>,
    /// TCP MD5 password.
    pub password: Option<PeerPassword>,
    /// BFD profile name (checked to exist).
    pub bfd_profile: Option<String>,
    /// Multi-hop eBGP.
    pub ebgp_multi_hop: bool,
    /// VRF.
    pub vrf: Option<String>,
    /// Graceful restart capability.
    pub graceful_restart: bool,
    /// local-as.
    pub local_asn: Option<u32>,
    /// Both families over one session.
    pub dual_stack_address_family: bool,
    /// Deprecated disableMP.
    pub disable_mp: bool,
}

impl Peer {
    /// Whether this is an iBGP session.
    pub fn is_ibgp(&self) -> bool {
        match self.peer_asn {
            PeerAsn::Fixed(asn) => asn == self.local_asn.unwrap_or(self.my_asn),
            PeerAsn::Internal => true,
            PeerAsn::External => false,
        }
    }
}

/// A BFD profile with defaults applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BfdProfile {
    /// Name of the object.
    pub name: String,
    /// ms.
    pub receive_interval_ms: u32,
    /// ms.
    pub transmit_interval_ms: u32,
    /// Packets.
    pub detect_multiplier: u32,
    /// ms.
    pub echo_interval_ms: u32,
    /// Echo mode.
    pub echo_mode: bool,
    /// Passive mode.
    pub passive_mode: bool,
    /// Minimum TTL.
    pub minimum_ttl: u32,
    /// BFD authentication (RFC 5880 6.7), a ferrolb extension set by annotations
    /// ([`BFD_AUTHENTICATION`] and its companions); `None`: none, as in MetalLB.
    pub authentication: Option<BfdAuthentication>,
}

/// Annotation of a BFDProfile naming its authentication type: `meticulous-keyed-sha1`
/// (recommended), `keyed-sha1`, `meticulous-keyed-md5` or `keyed-md5`. MetalLB's BFDProfile has
/// no field for it, and MetalLB ignores the annotation.
pub const BFD_AUTHENTICATION: &str = "ferrolb.io/bfd-authentication";
/// Annotation of a BFDProfile naming the Secret, in the speaker's namespace, whose `password`
/// key holds the authentication key (1-20 octets for SHA1, 1-16 for MD5).
pub const BFD_AUTHENTICATION_SECRET: &str = "ferrolb.io/bfd-authentication-secret";
/// Annotation of a BFDProfile giving the Auth Key ID (0-255, default 1), which both ends must
/// agree on.
pub const BFD_AUTHENTICATION_KEY_ID: &str = "ferrolb.io/bfd-authentication-key-id";

/// How a BFDProfile's sessions authenticate their packets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BfdAuthentication {
    /// The type.
    pub kind: ferrolb_bfd::auth::AuthType,
    /// The Auth Key ID.
    pub key_id: u8,
    /// The Secret holding the key (its `password` key), in the speaker's namespace.
    pub secret: String,
}
