//! Builders for `ferrolb_config::model` objects, with the defaults a minimal object validates
//! to, so that a test states only what matters to it.
//!
//! ```
//! use std::time::Duration;
//! use ferrolb_config::model::{PeerAsn, PeerPassword};
//! use ferrolb_testkit::model::{peer, pool};
//!
//! let p = peer("frr", "198.19.77.2")
//!     .hold_time(Duration::from_secs(9))
//!     .password("s3cret")
//!     .build();
//! assert_eq!((p.my_asn, p.peer_asn, p.port), (64512, PeerAsn::Fixed(64500), 179));
//! assert_eq!(p.password, Some(PeerPassword::Plain("s3cret".into())));
//!
//! let l2 = pool("l2", &["198.18.200.0/24", "fd00:18::c8:0/112"]);
//! assert!(l2.auto_assign && l2.allocation.is_none());
//! ```

use std::time::Duration;

use ferrolb_config::address::IpRange;
use ferrolb_config::model::{Peer, PeerAsn, PeerPassword, PeerTarget, Pool};

/// A peer `name` at `address` (an IP address): our AS 64512, the peer's AS 64500 (eBGP), port
/// 179, hold time 90 s, keepalive 30 s (MetalLB's defaults), no connect time, router ID,
/// password, node selectors or options. The builder's methods change what a test needs; any
/// other field: `Peer { field, ..peer(..).build() }`.
pub fn peer(name: &str, address: &str) -> PeerBuilder {
    let address = address
        .parse()
        .unwrap_or_else(|e| panic!("peer address {address:?}: {e}"));
    PeerBuilder(Peer {
        name: name.into(),
        my_asn: 64512,
        peer_asn: PeerAsn::Fixed(64500),
        target: PeerTarget::Address(address),
        source_address: None,
        port: 179,
        hold_time: Duration::from_secs(90),
        keepalive_time: Duration::from_secs(30),
        connect_time: None,
        router_id: None,
        node_selectors: vec![],
        password: None,
        bfd_profile: None,
        ebgp_multi_hop: false,
        vrf: None,
        graceful_restart: false,
        local_asn: None,
        dual_stack_address_family: false,
        disable_mp: false,
    })
}

/// A [`Peer`] under construction; see [`peer`].
#[derive(Clone, Debug)]
#[must_use = "build() gives the Peer"]
pub struct PeerBuilder(Peer);

impl PeerBuilder {
    /// Our AS.
    pub fn my_asn(mut self, asn: u32) -> Self {
        self.0.my_asn = asn;
        self
    }

    /// The peer's AS.
    pub fn peer_asn(mut self, asn: PeerAsn) -> Self {
        self.0.peer_asn = asn;
        self
    }

    /// The peer's TCP port.
    pub fn port(mut self, port: u16) -> Self {
        self.0.port = port;
        self
    }

    /// Hold time.
    pub fn hold_time(mut self, hold: Duration) -> Self {
        self.0.hold_time = hold;
        self
    }

    /// Keepalive interval.
    pub fn keepalive_time(mut self, keepalive: Duration) -> Self {
        self.0.keepalive_time = keepalive;
        self
    }

    /// Connect retry time.
    pub fn connect_time(mut self, connect: Duration) -> Self {
        self.0.connect_time = Some(connect);
        self
    }

    /// A fixed router ID (an IPv4 address).
    pub fn router_id(mut self, id: &str) -> Self {
        self.0.router_id = Some(
            id.parse()
                .unwrap_or_else(|e| panic!("router ID {id:?}: {e}")),
        );
        self
    }

    /// The TCP MD5 password, given in the object; `None` for none.
    pub fn password<'a>(mut self, password: impl Into<Option<&'a str>>) -> Self {
        self.0.password = password.into().map(|p| PeerPassword::Plain(p.into()));
        self
    }

    /// The peer.
    pub fn build(self) -> Peer {
        self.0
    }
}

impl From<PeerBuilder> for Peer {
    fn from(b: PeerBuilder) -> Peer {
        b.build()
    }
}

/// An address pool `name` with `ranges` (CIDR or `first-last`, sorted here as validation
/// sorts them): no labels, auto-assign on, buggy IPs not avoided, no service allocation. Any
/// other field: `Pool { field, ..pool(..) }`.
pub fn pool(name: &str, ranges: &[&str]) -> Pool {
    let mut ranges: Vec<IpRange> = ranges
        .iter()
        .map(|r| IpRange::parse(r).unwrap_or_else(|e| panic!("range {r:?}: {e}")))
        .collect();
    ranges.sort();
    Pool {
        name: name.into(),
        labels: Default::default(),
        ranges,
        auto_assign: true,
        avoid_buggy_ips: false,
        allocation: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_defaults_and_changes() {
        let p = peer("r", "198.18.0.254").build();
        assert_eq!(p.name, "r");
        assert_eq!(
            p.target,
            PeerTarget::Address("198.18.0.254".parse().expect("address"))
        );
        assert_eq!(p.hold_time, Duration::from_secs(90));
        assert_eq!(p.keepalive_time, Duration::from_secs(30));
        assert_eq!(
            (p.connect_time, p.router_id, &p.password),
            (None, None, &None)
        );
        assert!(!p.is_ibgp());
        let q = peer("r", "fd00:77::2")
            .my_asn(64500)
            .port(1790)
            .connect_time(Duration::from_secs(1))
            .router_id("198.19.77.1")
            .password(Some("pw"))
            .build();
        assert!(q.is_ibgp());
        assert_eq!(q.port, 1790);
        assert_eq!(q.connect_time, Some(Duration::from_secs(1)));
        assert_eq!(q.router_id, Some("198.19.77.1".parse().expect("id")));
        assert_eq!(q.password, Some(PeerPassword::Plain("pw".into())));
        assert_eq!(peer("r", "::1").password(None).build().password, None);
    }

    #[test]
    fn pool_ranges_are_sorted() {
        let p = pool("p", &["fd00::/120", "198.18.1.0/24", "198.18.0.0/24"]);
        let sorted: Vec<IpRange> = ["198.18.0.0/24", "198.18.1.0/24", "fd00::/120"]
            .iter()
            .map(|r| IpRange::parse(r).expect("range"))
            .collect();
        assert_eq!(p.ranges, sorted);
        assert!(p.auto_assign && !p.avoid_buggy_ips && p.labels.is_empty());
    }
}
