//! The live report `kubectl ferrolb explain` reads (`ferrolb_explain::speaker_report`): the
//! work loop stores what each step decided, the BGP half the routes per peer with the
//! sessions' status channels, and the metrics server renders it on request, with each session's
//! state read at that moment (sessions change between steps).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::bgp::driver::PeerStatus;
use crate::l2::interfaces::Interface;
use crate::l2::plan::Plan;
use crate::report::auth::{Authorizer, Decision};
use crate::report::{self, Standing};
use crate::view::ServiceView;
use ferrolb_explain::speaker_report::{
    BgpReport, NodeState, PATH, PeerReport, SCHEMA, SpeakerReport, TOKEN_HEADER,
};
use tokio::sync::watch;

/// The shared report; cheap to clone.
#[derive(Clone)]
pub struct Live(Arc<Mutex<Inner>>);

struct Inner {
    report: SpeakerReport,
    /// What the last layer 2 step decided, kept as it was: turned into the report only when
    /// asked, not on every step.
    layer2: Option<Layer2Step>,
    /// The running sessions' status, by BGPPeer name.
    sessions: BTreeMap<String, watch::Receiver<PeerStatus>>,
}

/// What one layer 2 step decided, for the report.
pub struct Layer2Step {
    /// The node as the speaker saw it.
    pub node: NodeState,
    /// The plan, with every Service's owner and takeover order.
    pub plan: Plan,
    /// The membership check's verdict.
    pub standing: Standing,
    /// The candidates the plan was made with.
    pub members: Vec<String>,
    /// The usable interfaces.
    pub interfaces: BTreeMap<String, Interface>,
    /// The Services planned.
    pub services: Vec<ServiceView>,
}

impl Live {
    /// An empty report for `node` (not planned yet).
    pub fn new(node: &str) -> Self {
        Self(Arc::new(Mutex::new(Inner {
            report: SpeakerReport {
                schema: SCHEMA.into(),
                node: node.into(),
                ..SpeakerReport::default()
            },
            layer2: None,
            sessions: BTreeMap::new(),
        })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What a layer 2 step decided.
    pub fn set_layer2(&self, step: Layer2Step) {
        self.lock().layer2 = Some(step);
    }

    /// What the BGP half planned, with the status channels of the sessions it runs.
    pub fn set_bgp(
        &self,
        peers: Vec<PeerReport>,
        sessions: BTreeMap<String, watch::Receiver<PeerStatus>>,
    ) {
        let mut inner = self.lock();
        inner.report.bgp = BgpReport { peers };
        inner.sessions = sessions;
    }

    /// The report now.
    pub fn report(&self) -> SpeakerReport {
        let inner = self.lock();
        let mut report = inner.report.clone();
        if let Some(step) = &inner.layer2 {
            report.planned = true;
            report.node_state = step.node.clone();
            report.layer2 = report::layer2(
                &step.plan,
                &step.standing,
                step.members.iter().cloned(),
                &step.interfaces,
                &step.services,
            );
        }
        for peer in &mut report.bgp.peers {
            if let Some(status) = inner.sessions.get(&peer.name) {
                let status = status.borrow();
                peer.state = format!("{:?}", status.state);
                peer.last_error = status.last_error.clone();
                peer.announced = status.announced;
                peer.updates_sent = status.updates_sent;
            }
        }
        report
    }

    /// The page the metrics server serves: the report to callers `auth` allows, a short
    /// plain-text refusal to the others.
    pub fn page(&self, auth: Arc<Authorizer>) -> ferrolb_runtime::server::JsonPages {
        let live = self.clone();
        let answer: ferrolb_runtime::server::JsonPage = Arc::new(move |headers| {
            let live = live.clone();
            let auth = auth.clone();
            Box::pin(async move {
                let decision = auth.decide(&headers).await;
                let body = match decision {
                    Decision::Allowed => serde_json::to_string(&live.report()).unwrap_or_default(),
                    Decision::Unauthenticated => format!(
                        "send a bearer token (Authorization, or {TOKEN_HEADER} through the API server's proxy)\n"
                    ),
                    Decision::Forbidden => {
                        "not allowed: the report needs get on this speaker's pods/proxy\n".into()
                    }
                    Decision::Unavailable => "could not check the caller now; try again\n".into(),
                };
                (decision.status(), body)
            })
        });
        vec![(PATH, answer)]
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use ferrolb_bgp::fsm::State;

    /// A session's state is read when the report is asked for, not when the loop last planned.
    #[test]
    fn session_state_is_read_when_asked() {
        let live = Live::new("node1");
        assert!(!live.report().planned);
        let (tx, rx) = watch::channel(PeerStatus::default());
        live.set_bgp(
            vec![PeerReport {
                name: "router".into(),
                state: "Idle".into(),
                ..Default::default()
            }],
            BTreeMap::from([("router".to_string(), rx)]),
        );
        assert_eq!(live.report().bgp.peers[0].state, "Idle");
        tx.send_modify(|s| {
            s.state = State::Established;
            s.announced = 2;
        });
        let r = live.report();
        assert_eq!(r.bgp.peers[0].state, "Established");
        assert_eq!(r.bgp.peers[0].announced, 2);
        assert_eq!(r.schema, SCHEMA);
        let page = live.page(Arc::new(Authorizer::new(
            OnlyT,
            crate::report::auth::CachePolicy::default(),
        )));
        let ask = |auth: Option<&str>| {
            let mut headers = http::HeaderMap::new();
            if let Some(value) = auth {
                headers.insert(TOKEN_HEADER, value.parse().unwrap());
            }
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
                .block_on((page[0].1)(headers))
        };
        let (status, body) = ask(Some("Bearer t"));
        assert_eq!(status, http::StatusCode::OK);
        assert!(body.contains("\"Established\""), "{body}");
        let (status, body) = ask(None);
        assert_eq!(status, http::StatusCode::UNAUTHORIZED);
        assert!(!body.contains("router"), "{body}");
    }

    /// Takes the token `t`, and nothing else.
    struct OnlyT;

    impl crate::report::auth::Reviewer for OnlyT {
        fn review<'a>(
            &'a self,
            token: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<Decision, crate::report::auth::ReviewError>>
        {
            let decision = if token == "t" {
                Decision::Allowed
            } else {
                Decision::Unauthenticated
            };
            Box::pin(async move { Ok(decision) })
        }
    }
}
