//! The live report `kubectl ferrolb explain` reads (`ferrolb_explain::speaker_report`): the
//! work loop stores what each step decided, the BGP half the routes per peer with the
//! sessions' status channels, and the metrics server renders it on request, with each session's
//! state read at that moment (sessions change between steps).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::bgp::driver::PeerStatus;
use crate::l2::interfaces::Interface;
use crate::l2::planner::Planner;
use crate::report::auth::{Authorizer, Decision};
use crate::report::{self, Standing};
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
    /// The membership check's verdict.
    pub standing: Standing,
    /// The usable interfaces.
    pub interfaces: BTreeMap<String, Interface>,
    /// The planner, shared with the work loop: the plan, the Services and the candidates it
    /// was made with, read only when the report is asked for (the takeover order is
    /// computed then).
    pub planner: Arc<Mutex<Planner>>,
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
        // Copied under the locks; the takeover order (a score per node and Service) is
        // computed after both are released, so a report never holds up the work loop.
        let layer2 = inner.layer2.as_ref().map(|step| {
            let planner = step.planner.lock().unwrap_or_else(PoisonError::into_inner);
            (
                step.node.clone(),
                step.standing.clone(),
                step.interfaces.clone(),
                planner.snapshot(),
            )
        });
        for peer in &mut report.bgp.peers {
            if let Some(status) = inner.sessions.get(&peer.name) {
                let status = status.borrow();
                peer.state = format!("{:?}", status.state);
                peer.last_error = status.last_error.clone();
                peer.announced = status.announced;
                peer.updates_sent = status.updates_sent;
            }
        }
        drop(inner);
        if let Some((node, standing, interfaces, snapshot)) = layer2 {
            report.planned = true;
            report.node_state = node;
            report.layer2 = report::layer2(
                &snapshot.plan,
                &snapshot.takeover(),
                &standing,
                snapshot.members.keys().cloned(),
                &interfaces,
                &snapshot.services,
            );
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
                    // The takeover order costs a score per node and Service: off the
                    // runtime's threads.
                    Decision::Allowed => tokio::task::spawn_blocking(move || live.report())
                        .await
                        .ok()
                        .and_then(|r| serde_json::to_string(&r).ok())
                        .unwrap_or_default(),
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
