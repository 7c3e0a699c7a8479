//! The nemesis's workload: Services created, changed and deleted while the faults run, from
//! the run's seed, so that the checkers see allocation at work under faults, not only a still
//! cluster. The plan is pure ([`plan`]); [`apply`] sends a step to the API server and tells
//! the recorder which edits may move a Service's IPs (the IP-change checker allows a change
//! only after one of those).

use std::time::Duration;

use ferrolb_layer2::sim::Rng;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

use super::record::Recorder;

/// What the workload does to one of its Services.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Creates it: dual-stack, or IPv4 only.
    Create {
        /// Both families.
        dual: bool,
    },
    /// Deletes it.
    Delete,
    /// Changes its port: its IPs must not move.
    Ports {
        /// The new port.
        port: i32,
    },
    /// Asks for another IPv4 address (`metallb.io/loadBalancerIPs`): its IP moves.
    Request {
        /// The address asked for.
        ip: String,
    },
}

impl Action {
    /// Whether the checkers must allow the Service's IPs to change after it.
    pub fn may_move(&self) -> bool {
        !matches!(self, Action::Ports { .. })
    }
}

/// One step of the workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// When, from the start of the run.
    pub at: Duration,
    /// The Service (`w<N>`).
    pub service: String,
    /// What is done to it.
    pub action: Action,
}

/// The workload of `seed`: a step every `gap` (drawn between its bounds) until `last`, never
/// more than `most` Services at once. Requested addresses are drawn from `requestable`.
pub fn plan(
    seed: u64,
    last: Duration,
    gap: (Duration, Duration),
    most: usize,
    requestable: &[String],
) -> Vec<Step> {
    // Its own stream: the fault schedule of the same seed stays as it is.
    let mut rng = Rng::new(seed ^ 0x776f_726b_6c6f_6164);
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let mut steps = Vec::new();
    // (name, IPv4 only) of the Services that exist.
    let mut live: Vec<(String, bool)> = Vec::new();
    let mut made = 0usize;
    let mut t = Duration::ZERO;
    loop {
        t += Duration::from_millis(rng.between(ms(gap.0), ms(gap.1)).max(1));
        if t > last {
            return steps;
        }
        let roll = rng.below(100);
        let (service, action) = if live.is_empty() || (live.len() < most && roll < 35) {
            made += 1;
            let dual = rng.below(2) == 0;
            let name = format!("w{made}");
            live.push((name.clone(), !dual));
            (name, Action::Create { dual })
        } else {
            let i = rng.below(live.len() as u64) as usize;
            let (name, v4_only) = live[i].clone();
            if roll < 55 {
                live.remove(i);
                (name, Action::Delete)
            } else if roll < 80 || !v4_only || requestable.is_empty() {
                let port = 9000 + rng.below(1000) as i32;
                (name, Action::Ports { port })
            } else {
                let ip = requestable[rng.below(requestable.len() as u64) as usize].clone();
                (name, Action::Request { ip })
            }
        };
        steps.push(Step {
            at: t,
            service,
            action,
        });
    }
}

/// How long one request of the workload may take (the API server may be stopped).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends `step` to the API server. The edit is recorded before the request (its effect can
/// be seen before the answer); a refused or failed request (the API server may be one of the
/// faults) is returned for the caller to count, and changes nothing else.
pub async fn apply(api: &Api<Service>, recorder: &Recorder, step: &Step) -> anyhow::Result<()> {
    let namespace = api_namespace(api);
    if step.action.may_move() {
        recorder.edited(&format!("{namespace}/{}", step.service));
    }
    let name = step.service.as_str();
    match &step.action {
        Action::Create { dual } => {
            let mut s = ferrolb_testkit::objects::service(name)
                .external_traffic_policy("Local")
                .selector("app", "echo")
                .named_port("udp", 8081, 8081, "UDP");
            s = if *dual {
                s.ip_family_policy("RequireDualStack")
            } else {
                s.ip_families(&["IPv4"])
            };
            tokio::time::timeout(
                REQUEST_TIMEOUT,
                api.create(&PostParams::default(), &s.build()),
            )
            .await??;
        }
        Action::Delete => {
            tokio::time::timeout(REQUEST_TIMEOUT, api.delete(name, &DeleteParams::default()))
                .await??;
        }
        Action::Ports { port } => {
            let patch = serde_json::json!({"spec": {"ports": [
                {"name": "udp", "port": port, "targetPort": 8081, "protocol": "UDP"}
            ]}});
            tokio::time::timeout(
                REQUEST_TIMEOUT,
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await??;
        }
        Action::Request { ip } => {
            let patch = serde_json::json!({"metadata": {"annotations": {
                "metallb.io/loadBalancerIPs": ip
            }}});
            tokio::time::timeout(
                REQUEST_TIMEOUT,
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await??;
        }
    }
    Ok(())
}

/// The namespace `api` is scoped to (the workload's Services are namespaced).
fn api_namespace(api: &Api<Service>) -> String {
    api.namespace().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requestable() -> Vec<String> {
        (100..110).map(|i| format!("198.18.200.{i}")).collect()
    }

    #[test]
    fn a_plan_keeps_its_bounds_and_only_touches_live_services() {
        for seed in 0..50 {
            let last = Duration::from_secs(600);
            let steps = plan(
                seed,
                last,
                (Duration::from_secs(2), Duration::from_secs(10)),
                4,
                &requestable(),
            );
            assert_eq!(
                steps,
                plan(
                    seed,
                    last,
                    (Duration::from_secs(2), Duration::from_secs(10)),
                    4,
                    &requestable()
                )
            );
            assert!(steps.len() > 50, "seed {seed}: {} steps", steps.len());
            let mut live: std::collections::BTreeMap<&str, bool> = Default::default();
            for s in &steps {
                assert!(s.at <= last);
                match &s.action {
                    Action::Create { dual } => {
                        assert!(live.insert(&s.service, !dual).is_none(), "{s:?}");
                        assert!(live.len() <= 4);
                    }
                    Action::Delete => assert!(live.remove(s.service.as_str()).is_some()),
                    Action::Ports { .. } => assert!(live.contains_key(s.service.as_str())),
                    Action::Request { ip } => {
                        assert_eq!(live.get(s.service.as_str()), Some(&true), "{s:?}");
                        assert!(requestable().contains(ip));
                    }
                }
            }
        }
        // Over many seeds, every kind of step happens.
        let all: Vec<Step> = (0..20)
            .flat_map(|seed| {
                plan(
                    seed,
                    Duration::from_secs(300),
                    (Duration::from_secs(2), Duration::from_secs(10)),
                    4,
                    &requestable(),
                )
            })
            .collect();
        assert!(
            all.iter()
                .any(|s| matches!(s.action, Action::Request { .. }))
        );
        assert!(all.iter().any(|s| matches!(s.action, Action::Ports { .. })));
        assert!(all.iter().any(|s| matches!(s.action, Action::Delete)));
    }

    #[test]
    fn only_a_port_change_keeps_the_ips() {
        assert!(!Action::Ports { port: 1 }.may_move());
        assert!(Action::Delete.may_move());
        assert!(Action::Create { dual: true }.may_move());
        assert!(
            Action::Request {
                ip: "198.18.200.100".into()
            }
            .may_move()
        );
    }
}
