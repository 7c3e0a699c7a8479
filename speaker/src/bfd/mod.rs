//! BFD for the speaker: one session per BGPPeer that names a `bfdProfile`, run next to its BGP
//! session, around the pure protocol core `ferrolb-bfd` (decision 0018).
//!
//! - [`table`] is the pure part: the sessions, which one a datagram belongs to, TTL checks.
//! - [`driver`] owns the sockets (UDP 3784 single hop, 4784 multihop, each session sending from
//!   its own port in 49152–65535 with TTL 255) and the clock, in one tokio task, and publishes
//!   each session's [`Status`] on a watch channel.
//! - [`follow`] is how a BGP session follows its BFD session: down at once when BFD goes down,
//!   back only once BFD is Up again.
//! - [`sessions`] is BFD in the work loop: the sessions the running BGP sessions ask for,
//!   handed to the driver, and the driver's reports turned into metrics and Events.

pub mod driver;
pub mod follow;
pub(crate) mod sessions;
mod socket;
pub mod table;

use std::net::IpAddr;
use std::time::Duration;

use ferrolb_bfd::auth::Authentication;
use ferrolb_bfd::packet::{Diagnostic, State};
use ferrolb_bfd::session::Config;
use ferrolb_config::model::{BfdAuthentication, BfdProfile, Peer, PeerTarget};
use k8s_openapi::api::core::v1::Secret;

/// The TTL every single-hop packet must arrive with (RFC 5881 section 5, GTSM).
pub const SINGLE_HOP_TTL: u8 = 255;

/// Which session: the peer, where we send from, and single hop or multihop. One per BGPPeer
/// address (two BGPPeers with the same address and source share it, as FRR's bfdd does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionKey {
    /// The peer's address (IPv4-mapped IPv6 addresses as IPv4).
    pub peer: IpAddr,
    /// The local address to send from (BGPPeer `sourceAddress`); none: the kernel's choice.
    pub local: Option<IpAddr>,
    /// Multihop (RFC 5883, port 4784): the BGPPeer sets `ebgpMultiHop`.
    pub multihop: bool,
}

impl SessionKey {
    /// The session a BGPPeer asks for, when it names a BFD profile and has an address.
    pub fn of_peer(peer: &Peer) -> Option<SessionKey> {
        peer.bfd_profile.as_ref().filter(|p| !p.is_empty())?;
        match &peer.target {
            PeerTarget::Address(a) => Some(SessionKey {
                peer: a.to_canonical(),
                local: peer.source_address.map(|s| s.to_canonical()),
                multihop: peer.ebgp_multi_hop,
            }),
            PeerTarget::Interface(_) => None,
        }
    }
}

/// A session's timers and checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Timers and role.
    pub config: Config,
    /// The lowest TTL a packet may arrive with: 255 for single hop, the profile's
    /// `minimumTtl` for multihop.
    pub minimum_ttl: u8,
}

/// What a BFDProfile asks for that this speaker does not do; the session runs without it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    /// `echoMode: true`: the echo function is not implemented (decision 0018).
    #[error(
        "BFDProfile {0}: echoMode is not supported (decision 0018); the session runs with control packets only"
    )]
    EchoMode(String),
    /// A BGPPeer in a VRF names a BFD profile: BFD's sockets are in the default VRF only.
    #[error(
        "BFDProfile {profile}: BFD is not supported for a BGPPeer in a VRF (vrf {vrf}); the BGP session runs without it"
    )]
    InVrf {
        /// The profile asked for.
        profile: String,
        /// The peer's VRF.
        vrf: String,
    },
    /// The profile asks for authentication and its key cannot be read: a session that cannot
    /// sign its packets would never come up with a peer that checks them, so none runs, and
    /// the BGP session runs without BFD (as with a router that has no BFD configured).
    #[error(
        "BFDProfile {profile}: authentication key unusable: {why}; the BGP session runs without BFD until it is fixed"
    )]
    AuthenticationKey {
        /// The profile asked for.
        profile: String,
        /// What is wrong with the Secret.
        why: String,
    },
    /// An unnumbered BGPPeer (`interface`) names a BFD profile: BFD over link-local addresses
    /// is not done.
    #[error(
        "BFDProfile {profile}: BFD is not supported for an unnumbered BGPPeer (interface {interface}); the BGP session runs without it"
    )]
    Unnumbered {
        /// The profile asked for.
        profile: String,
        /// The peer's interface.
        interface: String,
    },
}

impl Unsupported {
    /// The reason of the Warning Event on the BGPPeer.
    pub fn reason(&self) -> &'static str {
        match self {
            Unsupported::EchoMode(_) => "BFDEchoNotSupported",
            Unsupported::InVrf { .. } => "BFDNotSupportedInVRF",
            Unsupported::Unnumbered { .. } => "BFDNotSupportedUnnumbered",
            Unsupported::AuthenticationKey { .. } => "BFDAuthenticationKeyUnusable",
        }
    }
}

impl Settings {
    /// The settings of a session using `profile` (the model has MetalLB's defaults applied
    /// and the ranges validated). Also returns what the profile asks for that is not done.
    pub fn from_profile(profile: &BfdProfile, multihop: bool) -> (Settings, Option<Unsupported>) {
        let config = Config {
            desired_min_tx: Duration::from_millis(u64::from(profile.transmit_interval_ms)),
            required_min_rx: Duration::from_millis(u64::from(profile.receive_interval_ms)),
            // Validation keeps it in 2..=255.
            detect_mult: u8::try_from(profile.detect_multiplier).unwrap_or(u8::MAX),
            passive: profile.passive_mode,
            auth: None,
        };
        let minimum_ttl = if multihop {
            u8::try_from(profile.minimum_ttl).unwrap_or(SINGLE_HOP_TTL)
        } else {
            SINGLE_HOP_TTL
        };
        let unsupported = profile
            .echo_mode
            .then(|| Unsupported::EchoMode(profile.name.clone()));
        (
            Settings {
                config,
                minimum_ttl,
            },
            unsupported,
        )
    }
}

/// One session as the driver reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// Our state.
    pub state: State,
    /// The peer's state, as its last packet said.
    pub remote_state: State,
    /// Why our session last went down.
    pub diagnostic: Diagnostic,
    /// The negotiated interval between our packets (before jitter).
    pub transmit_interval: Duration,
    /// The negotiated detection time; none before the peer was heard.
    pub detection_time: Option<Duration>,
    /// How many times the session came Up: a watcher that missed an Up between two Downs
    /// (watch channels keep only the latest value) still sees that it was Up.
    pub ups: u64,
}

impl Default for Status {
    fn default() -> Self {
        Status {
            state: State::Down,
            remote_state: State::Down,
            diagnostic: Diagnostic::None,
            transmit_interval: ferrolb_bfd::session::SLOW_TX,
            detection_time: None,
            ups: 0,
        }
    }
}

/// The key of a profile's authentication, from the Secret it names (its `password` key, of a
/// Secret of any type, as raw octets). The error names the Secret and what is wrong.
pub fn authentication_key(
    auth: &BfdAuthentication,
    secret: Option<&Secret>,
) -> Result<Authentication, String> {
    let name = &auth.secret;
    let secret = secret.ok_or_else(|| format!("Secret {name:?} does not exist"))?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get("password"))
        .ok_or_else(|| format!("Secret {name:?} has no key \"password\""))?;
    Authentication::new(auth.kind, auth.key_id, &bytes.0)
        .map_err(|e| format!("Secret {name:?}, key \"password\": {e}"))
}

/// The name FRR's `show bfd peers` and MetalLB's metrics give a state.
pub fn state_name(state: State) -> &'static str {
    match state {
        State::AdminDown => "shutdown",
        State::Down => "down",
        State::Init => "init",
        State::Up => "up",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn profile() -> BfdProfile {
        BfdProfile {
            name: "fast".into(),
            receive_interval_ms: 100,
            transmit_interval_ms: 150,
            detect_multiplier: 4,
            echo_interval_ms: 50,
            echo_mode: false,
            passive_mode: true,
            minimum_ttl: 250,
            authentication: None,
        }
    }

    #[test]
    fn settings_follow_the_profile() {
        let (s, unsupported) = Settings::from_profile(&profile(), false);
        assert_eq!(s.config.required_min_rx, Duration::from_millis(100));
        assert_eq!(s.config.desired_min_tx, Duration::from_millis(150));
        assert_eq!(s.config.detect_mult, 4);
        assert!(s.config.passive);
        assert_eq!(s.minimum_ttl, 255, "single hop is always GTSM");
        assert_eq!(unsupported, None);
        let (s, _) = Settings::from_profile(&profile(), true);
        assert_eq!(s.minimum_ttl, 250);
        let mut echo = profile();
        echo.echo_mode = true;
        let (_, unsupported) = Settings::from_profile(&echo, false);
        assert!(
            unsupported
                .unwrap()
                .to_string()
                .contains("BFDProfile fast: echoMode is not supported")
        );
    }

    #[test]
    fn session_key_of_a_peer() {
        let mut p = ferrolb_testkit::model::peer("r", "::ffff:198.18.0.254").build();
        assert_eq!(SessionKey::of_peer(&p), None, "no profile, no session");
        p.bfd_profile = Some("fast".into());
        p.ebgp_multi_hop = true;
        let k = SessionKey::of_peer(&p).unwrap();
        assert_eq!(k.peer, "198.18.0.254".parse::<IpAddr>().unwrap());
        assert!(k.multihop);
        assert_eq!(k.local, None);
    }
}
