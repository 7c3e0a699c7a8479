//! The speaker's Prometheus metrics: MetalLB's names (users' dashboards expect them) plus
//! `ferrolb_*` extras.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Label set of the per-IP layer 2 counters.
pub type IpLabel = Vec<(&'static str, String)>;
/// Label set of the per-peer BGP metrics.
pub type PeerLabel = Vec<(&'static str, String)>;
/// Label set of `metallb_speaker_announced`.
pub type AnnouncedLabels = Vec<(&'static str, String)>;

/// Every metric of the speaker.
#[derive(Clone, Default)]
pub struct Metrics {
    /// `metallb_speaker_announced{service,protocol,node,ip}`: 1 while this node announces.
    pub announced: Family<AnnouncedLabels, Gauge>,
    /// `metallb_layer2_requests_received{ip}`.
    pub requests_received: Family<IpLabel, Counter>,
    /// `metallb_layer2_responses_sent{ip}`.
    pub responses_sent: Family<IpLabel, Counter>,
    /// `metallb_layer2_gratuitous_sent{ip}`.
    pub gratuitous_sent: Family<IpLabel, Counter>,
    /// Frames dropped as malformed, by reason.
    pub malformed_frames: Family<Vec<(&'static str, String)>, Counter>,
    /// Heartbeats refused, by reason.
    pub heartbeats_refused: Family<Vec<(&'static str, String)>, Counter>,
    /// Heartbeats that verified under a key other than the one this speaker signs with (during
    /// a key rotation: peers that have not swapped keys yet, or have swapped before this one).
    pub heartbeats_other_key: Counter,
    /// Gossip keys held: 1, or 2 during a key rotation.
    pub gossip_keys: Gauge,
    /// When the keys in use were read (start, or the last change), Unix seconds: a speaker whose
    /// value is older than an edit of the Secret has not taken the edit in yet.
    pub gossip_keys_loaded: Gauge,
    /// Polls of the key files that changed the keys (`applied`) or found them unusable and kept
    /// the last good ones (`unreadable`, `invalid`).
    pub gossip_key_reloads: Family<Vec<(&'static str, String)>, Counter>,
    /// Other speakers alive.
    pub peers_alive: Gauge,
    /// Speakers the presence Leases name (the quorum rule's known set).
    pub speakers_known: Gauge,
    /// 1 while this node hears a majority of the known speakers and a majority hears it (it
    /// may own layer 2 IPs); 0 when it is cut off and owns none.
    pub quorum: Gauge,
    /// 1 while flap damping holds this node back from owning layer 2 IPs after it regained its
    /// quorum.
    pub damped: Gauge,
    /// Checks at which this node owned layer 2 IPs but too few of its heartbeats were
    /// acknowledged recently to keep answering (its outgoing heartbeats are being lost).
    pub tenure_lapsed: Counter,
    /// 1 when the last renewal of this node's presence Lease succeeded.
    pub presence_renewed: Gauge,
    /// IPs this node took over (became owner of).
    pub takeovers: Counter,
    /// Services the layer 2 planner planned again (`l2::planner`): at rest it stays still.
    pub replanned: Counter,
    /// 1 when the configuration was read.
    pub config_loaded: Gauge,
    /// 1 when some configuration objects are left out.
    pub config_stale: Gauge,
    /// `metallb_bgp_session_up{peer}`: 1 while the session is Established.
    pub bgp_session_up: Family<PeerLabel, Gauge>,
    /// `metallb_bgp_updates_total{peer}`: UPDATEs sent.
    pub bgp_updates: Family<PeerLabel, Counter>,
    /// `metallb_bgp_announced_prefixes_total{peer}`: prefixes the peer holds from us.
    pub bgp_announced_prefixes: Family<PeerLabel, Gauge>,
    /// `metallb_bfd_session_up{peer,vrf}`: 1 while the BFD session is Up.
    pub bfd_session_up: Family<PeerLabel, Gauge>,
    /// `metallb_bfd_control_packet_input{peer,vrf}`: control packets accepted.
    pub bfd_control_in: Family<PeerLabel, Counter>,
    /// `metallb_bfd_control_packet_output{peer,vrf}`: control packets sent.
    pub bfd_control_out: Family<PeerLabel, Counter>,
    /// `metallb_bfd_echo_packet_input{peer,vrf}`: always 0 (no echo function, decision 0018).
    pub bfd_echo_in: Family<PeerLabel, Counter>,
    /// `metallb_bfd_echo_packet_output{peer,vrf}`: always 0.
    pub bfd_echo_out: Family<PeerLabel, Counter>,
    /// `metallb_bfd_session_up_events{peer,vrf}`.
    pub bfd_up_events: Family<PeerLabel, Counter>,
    /// `metallb_bfd_session_down_events{peer,vrf}`.
    pub bfd_down_events: Family<PeerLabel, Counter>,
    /// `metallb_bfd_zebra_notifications{peer,vrf}`: state changes told to the BGP sessions
    /// (FRR's bfdd tells bgpd through zebra; here the BGP session follows directly).
    pub bfd_notifications: Family<PeerLabel, Counter>,
    /// Datagrams on the BFD ports dropped before reaching a session, by reason.
    pub bfd_refused: Family<Vec<(&'static str, String)>, Counter>,
    /// Events dropped because the Event queue was full.
    pub events_dropped: Counter,
}

impl Metrics {
    /// The metrics and a registry that serves them.
    pub fn new() -> (Self, Registry) {
        let m = Metrics::default();
        let mut r = Registry::default();
        // The exposition lists the metrics in this order.
        m.register_layer2(&mut r);
        m.register_membership(&mut r);
        m.register_config(&mut r);
        m.register_bgp(&mut r);
        m.register_bfd(&mut r);
        // A counter's exposition adds `_total`: `ferrolb_speaker_events_dropped_total`.
        r.register(
            "ferrolb_speaker_events_dropped",
            "Events dropped because the Event queue was full",
            m.events_dropped.clone(),
        );
        (m, r)
    }

    /// Layer 2: what this node announces and answers.
    fn register_layer2(&self, r: &mut Registry) {
        r.register(
            "metallb_speaker_announced",
            "Services being announced from this node",
            self.announced.clone(),
        );
        r.register(
            "metallb_layer2_requests_received",
            "Number of layer2 requests received for owned IPs",
            self.requests_received.clone(),
        );
        r.register(
            "metallb_layer2_responses_sent",
            "Number of layer2 responses sent for owned IPs",
            self.responses_sent.clone(),
        );
        r.register(
            "metallb_layer2_gratuitous_sent",
            "Number of gratuitous layer2 packets sent for owned IPs",
            self.gratuitous_sent.clone(),
        );
        r.register(
            "ferrolb_layer2_malformed_frames",
            "ARP/NDP frames dropped as malformed",
            self.malformed_frames.clone(),
        );
    }

    /// Membership: the heartbeats and their keys, who is alive, the quorum and who owns layer 2
    /// IPs.
    fn register_membership(&self, r: &mut Registry) {
        r.register(
            "ferrolb_speaker_heartbeats_refused",
            "Heartbeats refused (authentication, replay, clock)",
            self.heartbeats_refused.clone(),
        );
        // A counter's exposition adds `_total`: `ferrolb_speaker_heartbeats_other_key_total`.
        r.register(
            "ferrolb_speaker_heartbeats_other_key",
            "Heartbeats verified by a key other than this speaker's signing key (key rotation in progress)",
            self.heartbeats_other_key.clone(),
        );
        r.register(
            "ferrolb_speaker_gossip_keys",
            "Gossip keys held (2 while a next key is configured for a rotation)",
            self.gossip_keys.clone(),
        );
        r.register(
            "ferrolb_speaker_gossip_keys_loaded_timestamp_seconds",
            "When the gossip keys in use were read from their files (start or last change), Unix time",
            self.gossip_keys_loaded.clone(),
        );
        // `ferrolb_speaker_gossip_key_reloads_total{result}`.
        r.register(
            "ferrolb_speaker_gossip_key_reloads",
            "Polls of the gossip key files that changed the keys (applied) or kept the last good keys (unreadable, invalid)",
            self.gossip_key_reloads.clone(),
        );
        r.register(
            "ferrolb_speaker_peers_alive",
            "Other speakers heard within the failure timeout",
            self.peers_alive.clone(),
        );
        r.register(
            "ferrolb_speaker_known",
            "Speakers with a current presence Lease (the set quorums are counted in)",
            self.speakers_known.clone(),
        );
        r.register(
            "ferrolb_layer2_damped",
            "1 while flap damping holds this node back from owning layer 2 IPs after a loss of quorum",
            self.damped.clone(),
        );
        r.register(
            "ferrolb_layer2_tenure_lapsed",
            "Checks at which this node owned layer 2 IPs but stopped answering for them: too few of its recent heartbeats were acknowledged by the other speakers (its outgoing heartbeats are being lost)",
            self.tenure_lapsed.clone(),
        );
        r.register(
            "ferrolb_layer2_quorum",
            "1 while this node hears a majority of the known speakers and is heard by one; 0: it owns no layer 2 IP",
            self.quorum.clone(),
        );
        r.register(
            "ferrolb_speaker_presence_renewed",
            "1 when the last renewal of this node's presence Lease succeeded",
            self.presence_renewed.clone(),
        );
        r.register(
            "ferrolb_layer2_takeovers",
            "IPs this node became the owner of",
            self.takeovers.clone(),
        );
        r.register(
            "ferrolb_layer2_replanned_services",
            "Services whose layer 2 owner was computed again because an input changed",
            self.replanned.clone(),
        );
    }

    /// The configuration read from the API server.
    fn register_config(&self, r: &mut Registry) {
        r.register(
            "metallb_k8s_client_config_loaded_bool",
            "1 if the configuration was loaded",
            self.config_loaded.clone(),
        );
        r.register(
            "metallb_k8s_client_config_stale_bool",
            "1 if some configuration objects are left out",
            self.config_stale.clone(),
        );
    }

    /// The BGP sessions.
    fn register_bgp(&self, r: &mut Registry) {
        r.register(
            "metallb_bgp_session_up",
            "BGP session state (1 is up, 0 is down)",
            self.bgp_session_up.clone(),
        );
        // A counter's exposition adds `_total`: this is `metallb_bgp_updates_total`.
        r.register(
            "metallb_bgp_updates",
            "Number of BGP UPDATE messages sent",
            self.bgp_updates.clone(),
        );
        r.register(
            "metallb_bgp_announced_prefixes_total",
            "Number of prefixes currently being advertised on the BGP session",
            self.bgp_announced_prefixes.clone(),
        );
    }

    /// The BFD sessions.
    fn register_bfd(&self, r: &mut Registry) {
        r.register(
            "metallb_bfd_session_up",
            "BFD session state (1 is up, 0 is down)",
            self.bfd_session_up.clone(),
        );
        r.register(
            "metallb_bfd_control_packet_input",
            "Number of received BFD control packets",
            self.bfd_control_in.clone(),
        );
        r.register(
            "metallb_bfd_control_packet_output",
            "Number of sent BFD control packets",
            self.bfd_control_out.clone(),
        );
        r.register(
            "metallb_bfd_echo_packet_input",
            "Number of received BFD echo packets",
            self.bfd_echo_in.clone(),
        );
        r.register(
            "metallb_bfd_echo_packet_output",
            "Number of sent BFD echo packets",
            self.bfd_echo_out.clone(),
        );
        r.register(
            "metallb_bfd_session_up_events",
            "Number of BFD session up events",
            self.bfd_up_events.clone(),
        );
        r.register(
            "metallb_bfd_session_down_events",
            "Number of BFD session down events",
            self.bfd_down_events.clone(),
        );
        r.register(
            "metallb_bfd_zebra_notifications",
            "Number of BFD state changes told to the BGP sessions",
            self.bfd_notifications.clone(),
        );
        r.register(
            "ferrolb_bfd_packets_refused",
            "Datagrams on the BFD ports dropped before reaching a session, or refused by it (malformed, TTL, unknown session, not from the peer's session)",
            self.bfd_refused.clone(),
        );
    }
}

/// The label set of one IP.
pub fn ip_label(ip: std::net::IpAddr) -> IpLabel {
    vec![("ip", ip.to_string())]
}

/// The label set of one BFD session, as MetalLB's: the peer's address and the VRF (only the
/// default one here).
pub fn bfd_label(peer: std::net::IpAddr) -> PeerLabel {
    vec![("peer", peer.to_string()), ("vrf", "default".to_string())]
}

/// The label set of one BGP peer.
pub fn peer_label(peer: &str) -> PeerLabel {
    vec![("peer", peer.to_string())]
}
