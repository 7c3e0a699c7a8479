//! BFD in the work loop: the BFD sessions the running BGP sessions ask for (their BGPPeer's
//! `bfdProfile`), handed to the BFD driver, each BGP session set to follow its BFD session;
//! the driver's reports turned into MetalLB's `metallb_bfd_*` metrics and Events on the
//! BGPPeers.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::bfd::driver::{Bfd, Observer, Options};
use crate::bfd::table::Refused;
use crate::bfd::{SessionKey, Settings, Unsupported, authentication_key, state_name};
use crate::bgp::driver::Driver;
use ferrolb_bfd::packet::{Diagnostic, State};
use ferrolb_bfd::session::Refusal;
use ferrolb_config::model::{Config, PeerTarget};
use ferrolb_runtime::events::{EventQueue, Queued};
use k8s_openapi::api::core::v1::Secret;

use crate::metrics::{Metrics, bfd_label};

/// The BFD sessions some BGP sessions ask for.
#[derive(Debug, Default)]
pub struct Desired {
    /// The sessions.
    pub sessions: BTreeMap<SessionKey, Settings>,
    /// The session each BGPPeer follows.
    pub follows: BTreeMap<String, SessionKey>,
    /// What the BGPPeers' profiles ask for that is not done.
    pub unsupported: Vec<(String, Unsupported)>,
}

/// The BFD sessions of `peers` (running BGP sessions, by BGPPeer name). Two BGPPeers with the
/// same address share one session (the first by name sets its timers), as in FRR. `secret`
/// finds a Secret of the speaker's namespace by name (a profile's authentication key).
pub fn desired<'a>(
    config: &Config,
    peers: impl IntoIterator<Item = &'a String>,
    secret: &dyn Fn(&str) -> Option<Arc<Secret>>,
) -> Desired {
    let mut sessions = BTreeMap::new();
    let mut follows = BTreeMap::new();
    let mut unsupported = Vec::new();
    for name in peers {
        let Some(peer) = config.peers.get(name) else {
            continue;
        };
        if let (PeerTarget::Interface(interface), Some(profile)) = (
            &peer.target,
            peer.bfd_profile.as_ref().filter(|p| !p.is_empty()),
        ) {
            unsupported.push((
                name.clone(),
                Unsupported::Unnumbered {
                    profile: profile.clone(),
                    interface: interface.clone(),
                },
            ));
            continue;
        }
        let Some(key) = SessionKey::of_peer(peer) else {
            continue;
        };
        // Validation refuses a BGPPeer naming a missing profile; one deleted meanwhile leaves
        // the peer without BFD rather than without BGP.
        let Some(profile) = peer
            .bfd_profile
            .as_ref()
            .and_then(|p| config.bfd_profiles.get(p))
        else {
            continue;
        };
        if let Some(vrf) = peer.vrf.as_ref().filter(|v| !v.is_empty()) {
            unsupported.push((
                name.clone(),
                Unsupported::InVrf {
                    profile: profile.name.clone(),
                    vrf: vrf.clone(),
                },
            ));
            continue;
        }
        let (mut settings, missing) = Settings::from_profile(profile, key.multihop);
        if let Some(m) = missing {
            unsupported.push((name.clone(), m));
        }
        if let Some(auth) = &profile.authentication {
            match authentication_key(auth, secret(&auth.secret).as_deref()) {
                Ok(key) => settings.config.auth = Some(key),
                Err(why) => {
                    unsupported.push((
                        name.clone(),
                        Unsupported::AuthenticationKey {
                            profile: profile.name.clone(),
                            why,
                        },
                    ));
                    continue;
                }
            }
        }
        sessions.entry(key).or_insert(settings);
        follows.insert(name.clone(), key);
    }
    Desired {
        sessions,
        follows,
        unsupported,
    }
}

/// The BFD half of the speaker.
pub struct BfdSessions {
    /// Started with the first session, so that a node without BFD peers leaves ports 3784 and
    /// 4784 to whatever else runs there.
    driver: Option<Bfd>,
    /// The BGPPeers of each session, for Events.
    names: Arc<Mutex<BTreeMap<SessionKey, BTreeSet<String>>>>,
    metrics: Metrics,
    events: EventQueue,
    namespace: String,
    node: String,
    /// (peer, what) already reported as not supported.
    reported: BTreeSet<(String, String)>,
}

impl BfdSessions {
    /// No sessions yet.
    pub fn new(metrics: Metrics, events: EventQueue, namespace: String, node: String) -> Self {
        BfdSessions {
            driver: None,
            names: Arc::default(),
            metrics,
            events,
            namespace,
            node,
            reported: BTreeSet::new(),
        }
    }

    /// Runs the BFD sessions of the BGP sessions in `bgp` (by BGPPeer name) and makes each
    /// follow its own. `secret` finds a Secret of the speaker's namespace by name.
    pub fn apply<'a>(
        &mut self,
        config: &Config,
        peers: impl IntoIterator<Item = &'a String> + Clone,
        bgp: &mut Driver,
        secret: &dyn Fn(&str) -> Option<Arc<Secret>>,
    ) {
        let Desired {
            sessions,
            follows,
            unsupported,
        } = desired(config, peers.clone(), secret);
        self.report_unsupported(unsupported);
        let mut names: BTreeMap<SessionKey, BTreeSet<String>> = BTreeMap::new();
        for (name, key) in &follows {
            names.entry(*key).or_default().insert(name.clone());
        }
        if let Ok(mut n) = self.names.lock() {
            *n = names;
        }
        if self.driver.is_none() && !sessions.is_empty() {
            let observer = Arc::new(BfdObserver {
                metrics: self.metrics.clone(),
                events: self.events.clone(),
                names: self.names.clone(),
                namespace: self.namespace.clone(),
                node: self.node.clone(),
            });
            let (driver, failed) = Bfd::start(Options::default(), observer);
            tracing::info!(listening = ?driver.listening(), failed = failed.len(), "BFD started");
            self.driver = Some(driver);
        }
        let Some(driver) = self.driver.as_mut() else {
            return;
        };
        for key in sessions.keys() {
            // The echo counters exist (at 0) for every session, as MetalLB's do.
            let label = bfd_label(key.peer);
            let _ = self.metrics.bfd_echo_in.get_or_create(&label);
            let _ = self.metrics.bfd_echo_out.get_or_create(&label);
            let _ = self.metrics.bfd_session_up.get_or_create(&label);
        }
        for gone in driver
            .statuses()
            .keys()
            .filter(|k| !sessions.contains_key(k))
        {
            self.metrics.bfd_session_up.remove(&bfd_label(gone.peer));
        }
        driver.apply(sessions);
        for name in peers {
            let link = follows
                .get(name)
                .and_then(|k| driver.status(k).map(|rx| (*k, rx)));
            bgp.follow_bfd(name, link);
        }
    }

    fn report_unsupported(&mut self, unsupported: Vec<(String, Unsupported)>) {
        let now: BTreeMap<(String, String), &'static str> = unsupported
            .iter()
            .map(|(n, u)| ((n.clone(), u.to_string()), u.reason()))
            .collect();
        self.reported.retain(|r| now.contains_key(r));
        for ((name, why), reason) in now {
            if self.reported.insert((name.clone(), why.clone())) {
                tracing::warn!(peer = %name, "{why}");
                self.events.push(peer_event(
                    &self.namespace,
                    &name,
                    true,
                    reason,
                    format!("on node {}: {why}", self.node),
                ));
            }
        }
    }

    /// Says AdminDown on every BFD session and stops.
    pub async fn shutdown(self) {
        if let Some(d) = self.driver {
            d.shutdown(Duration::from_secs(1)).await;
        }
    }
}

/// An Event on BGPPeer `namespace/name`.
fn peer_event(
    namespace: &str,
    name: &str,
    warning: bool,
    reason: &'static str,
    message: String,
) -> Queued {
    Queued {
        warning,
        reason,
        message,
        action: "BFD",
        regarding: crate::bgp::step::bgp_peer_ref(namespace, name),
    }
}

/// The driver's reports into `metallb_bfd_*` and Events.
struct BfdObserver {
    metrics: Metrics,
    events: EventQueue,
    names: Arc<Mutex<BTreeMap<SessionKey, BTreeSet<String>>>>,
    namespace: String,
    node: String,
}

impl Observer for BfdObserver {
    fn packet_in(&self, key: &SessionKey) {
        self.metrics
            .bfd_control_in
            .get_or_create(&bfd_label(key.peer))
            .inc();
    }

    fn packet_out(&self, key: &SessionKey) {
        self.metrics
            .bfd_control_out
            .get_or_create(&bfd_label(key.peer))
            .inc();
    }

    fn state_changed(&self, key: &SessionKey, from: State, to: State, diagnostic: Diagnostic) {
        let label = bfd_label(key.peer);
        self.metrics
            .bfd_session_up
            .get_or_create(&label)
            .set(i64::from(to == State::Up));
        self.metrics.bfd_notifications.get_or_create(&label).inc();
        let event = if to == State::Up {
            self.metrics.bfd_up_events.get_or_create(&label).inc();
            Some((
                false,
                "BFDSessionUp",
                format!("BFD session with {} up on node {}", key.peer, self.node),
            ))
        } else if from == State::Up {
            self.metrics.bfd_down_events.get_or_create(&label).inc();
            Some((
                true,
                "BFDSessionDown",
                format!(
                    "BFD session with {} {} on node {} ({diagnostic}); the BGP session waits for it",
                    key.peer,
                    state_name(to),
                    self.node
                ),
            ))
        } else {
            None
        };
        let Some((warning, reason, message)) = event else {
            return;
        };
        let names = self
            .names
            .lock()
            .map(|n| n.get(key).cloned().unwrap_or_default())
            .unwrap_or_default();
        for name in names {
            self.events.push(peer_event(
                &self.namespace,
                &name,
                warning,
                reason,
                message.clone(),
            ));
        }
    }

    fn refused(&self, _from: IpAddr, why: &Refused) {
        let reason = match why {
            Refused::Malformed(_) => "malformed",
            Refused::Ttl { .. } => "ttl",
            Refused::Interface { .. } => "interface",
            Refused::NoSession => "no_session",
            Refused::Session(Refusal::OtherSession) => "other_session",
            Refused::Session(Refusal::NoDiscriminator) => "no_discriminator",
            Refused::Session(Refusal::Authentication) => "authenticated",
            Refused::Session(Refusal::AuthenticationFailed(_)) => "authentication_failed",
            Refused::Session(Refusal::AuthenticationSequence { .. }) => "authentication_sequence",
            Refused::Session(Refusal::OtherPeerSession) => "other_peer_session",
        };
        self.metrics
            .bfd_refused
            .get_or_create(&vec![("reason", reason.to_string())])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use ferrolb_config::model::BfdProfile;

    use super::*;

    fn profile(name: &str, tx: u32, echo: bool) -> BfdProfile {
        BfdProfile {
            name: name.into(),
            receive_interval_ms: 300,
            transmit_interval_ms: tx,
            detect_multiplier: 3,
            echo_interval_ms: 50,
            echo_mode: echo,
            passive_mode: false,
            minimum_ttl: 254,
            authentication: None,
        }
    }

    /// Peers with a profile get a session (shared by address, the first by name sets the
    /// timers), peers without one none; echoMode is reported.
    #[test]
    fn sessions_of_the_running_peers() {
        let mut config = Config::default();
        config
            .bfd_profiles
            .insert("fast".into(), profile("fast", 100, false));
        config
            .bfd_profiles
            .insert("echo".into(), profile("echo", 300, true));
        let mut a = ferrolb_testkit::model::peer("a", "198.18.0.254").build();
        a.bfd_profile = Some("fast".into());
        let mut b = ferrolb_testkit::model::peer("b", "198.18.0.254").build();
        b.bfd_profile = Some("echo".into());
        let mut c = ferrolb_testkit::model::peer("c", "198.18.0.253").build();
        c.bfd_profile = Some("gone".into());
        let d = ferrolb_testkit::model::peer("d", "198.18.0.252").build();
        for p in [a, b, c, d] {
            config.peers.insert(p.name.clone(), p);
        }
        let names: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
        let Desired {
            sessions,
            follows,
            unsupported,
        } = desired(&config, &names, &|_| None);
        assert_eq!(sessions.len(), 1);
        let (key, settings) = sessions.iter().next().unwrap();
        assert_eq!(key.peer, "198.18.0.254".parse::<IpAddr>().unwrap());
        assert_eq!(
            settings.config.desired_min_tx,
            Duration::from_millis(100),
            "a comes first"
        );
        assert_eq!(follows.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(unsupported.len(), 1);
        assert_eq!(unsupported[0].0, "b");
        // Only running peers count.
        assert!(desired(&config, &names[3..], &|_| None).sessions.is_empty());
    }

    /// A peer in a VRF gets no BFD session (the sockets are in the default VRF) and is
    /// reported, so the profile is not silently ignored.
    #[test]
    fn a_peer_in_a_vrf_gets_no_bfd_and_is_reported() {
        let mut config = Config::default();
        config
            .bfd_profiles
            .insert("fast".into(), profile("fast", 100, false));
        let mut red = ferrolb_testkit::model::peer("red", "198.19.253.254").build();
        red.bfd_profile = Some("fast".into());
        red.vrf = Some("red".into());
        config.peers.insert("red".into(), red);
        let d = desired(&config, &["red".to_string()], &|_| None);
        assert!(d.sessions.is_empty() && d.follows.is_empty());
        assert_eq!(d.unsupported.len(), 1);
        assert_eq!(d.unsupported[0].1.reason(), "BFDNotSupportedInVRF");
    }

    /// A profile with authentication gets its key from the Secret; without a usable key the
    /// peer gets no BFD session (it could never come up) and is reported, naming the Secret.
    #[test]
    fn authentication_keys_come_from_the_secret_or_the_peer_runs_without_bfd() {
        use ferrolb_bfd::auth::AuthType;
        use ferrolb_config::model::BfdAuthentication;
        use k8s_openapi::ByteString;
        let mut config = Config::default();
        let mut signed = profile("signed", 100, false);
        signed.authentication = Some(BfdAuthentication {
            kind: AuthType::MeticulousKeyedSha1,
            key_id: 3,
            secret: "bfd-key".into(),
        });
        config.bfd_profiles.insert("signed".into(), signed);
        let mut a = ferrolb_testkit::model::peer("a", "198.18.0.254").build();
        a.bfd_profile = Some("signed".into());
        config.peers.insert("a".into(), a);
        let names = ["a".to_string()];
        let with_key = |key: &'static [u8]| {
            move |name: &str| {
                (name == "bfd-key").then(|| {
                    Arc::new(Secret {
                        data: Some([("password".to_string(), ByteString(key.to_vec()))].into()),
                        ..Secret::default()
                    })
                })
            }
        };
        let d = desired(&config, &names, &with_key(b"0123456789"));
        let settings = d.sessions.values().next().unwrap();
        let auth = settings.config.auth.unwrap();
        assert_eq!(
            (auth.kind(), auth.key_id()),
            (AuthType::MeticulousKeyedSha1, 3)
        );
        assert!(d.unsupported.is_empty());
        for (secret, words) in [
            (
                &with_key(b"") as &dyn Fn(&str) -> Option<Arc<Secret>>,
                "1 to 20 octets",
            ),
            (&with_key(&[7; 21]), "1 to 20 octets long, not 21"),
            (&|_: &str| None, "Secret \"bfd-key\" does not exist"),
        ] {
            let d = desired(&config, &names, secret);
            assert!(d.sessions.is_empty() && d.follows.is_empty());
            assert_eq!(d.unsupported.len(), 1);
            assert_eq!(d.unsupported[0].1.reason(), "BFDAuthenticationKeyUnusable");
            let message = d.unsupported[0].1.to_string();
            assert!(message.contains(words), "{message}");
        }
    }

    /// An unnumbered peer gets no BFD session and is reported, naming its interface.
    #[test]
    fn an_unnumbered_peer_gets_no_bfd_and_is_reported() {
        let mut config = Config::default();
        config
            .bfd_profiles
            .insert("fast".into(), profile("fast", 100, false));
        let mut link = ferrolb_testkit::model::peer("link", "198.19.253.254").build();
        link.target = PeerTarget::Interface("eth1".into());
        link.bfd_profile = Some("fast".into());
        config.peers.insert("link".into(), link);
        let d = desired(&config, &["link".to_string()], &|_| None);
        assert!(d.sessions.is_empty() && d.follows.is_empty());
        assert_eq!(d.unsupported.len(), 1);
        assert_eq!(d.unsupported[0].1.reason(), "BFDNotSupportedUnnumbered");
        assert!(d.unsupported[0].1.to_string().contains("interface eth1"));
    }
}
