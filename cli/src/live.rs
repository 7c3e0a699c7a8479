//! The speakers, live: their presence Leases, and each one's report
//! (`ferrolb_explain::speaker_report`) read through the API server's proxy to its Pod, so the
//! CLI needs no route to the nodes, only `get` on `pods/proxy` in the speakers' namespace.

use std::time::Duration;

use anyhow::Context as _;
use ferrolb_explain::live::LiveSpeaker;
use ferrolb_explain::speaker_report::{self, SpeakerReport};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

/// Label on the speakers' presence Leases (`ferrolb_speaker::l2::presence::LABEL`).
const PRESENCE_LABEL: &str = "ferrolb.io/speaker-presence";

/// The speaker Pods' labels (the chart's DaemonSet with its default name).
pub const SPEAKER_POD_LABELS: &str =
    "app.kubernetes.io/name=ferrolb,app.kubernetes.io/component=speaker";

/// The metrics port when the Pod does not name one `monitoring`.
const DEFAULT_PORT: i32 = 7472;

/// How long one speaker may take to answer.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The speakers, and why none's report was read if so.
pub struct Speakers {
    /// Each speaker with a presence Lease.
    pub speakers: Vec<LiveSpeaker>,
    /// Why no report was read at all (RBAC), if so.
    pub unavailable: Option<String>,
}

/// Reads the speakers of `namespace`: their Leases (live when renewed within their duration,
/// by this machine's clock), then the report of each live one.
/// `selector` picks the speaker Pods.
pub async fn read(
    client: &kube::Client,
    namespace: &str,
    selector: &str,
) -> anyhow::Result<Speakers> {
    let leases = Api::<Lease>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(PRESENCE_LABEL))
        .await
        .context("listing the speakers' presence Leases")?
        .items;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let mut speakers: Vec<LiveSpeaker> = leases
        .into_iter()
        .filter_map(|l| {
            let spec = l.spec?;
            let node = spec.holder_identity.filter(|h| !h.is_empty())?;
            let live = spec.renew_time.is_some_and(|t| {
                now - t.0.as_second() <= i64::from(spec.lease_duration_seconds.unwrap_or(40))
            });
            Some(LiveSpeaker {
                node,
                live,
                ..LiveSpeaker::default()
            })
        })
        .collect();
    speakers.sort_by(|a, b| a.node.cmp(&b.node));
    let pods = match Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(selector))
        .await
    {
        Ok(list) => list.items,
        Err(kube::Error::Api(e)) if e.code == 403 => {
            return Ok(Speakers {
                speakers,
                unavailable: Some(forbidden(namespace)),
            });
        }
        Err(e) => return Err(e).context("listing the speaker Pods"),
    };
    let asks = speakers.iter().filter(|s| s.live).map(|s| {
        let pod = pods.iter().find(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(s.node.as_str())
                && p.metadata.deletion_timestamp.is_none()
        });
        async move {
            match pod {
                Some(pod) => ask(client, namespace, pod).await,
                None => Err(Asked::Failed(format!(
                    "no speaker Pod ({selector}) on this node"
                ))),
            }
        }
    });
    let answers = futures::future::join_all(asks).await;
    let mut unavailable = None;
    for (s, answer) in speakers.iter_mut().filter(|s| s.live).zip(answers) {
        match answer {
            Ok(report) => s.report = Some(report),
            Err(Asked::Forbidden) => unavailable = Some(forbidden(namespace)),
            Err(Asked::Failed(e)) => s.error = Some(e),
        }
    }
    Ok(Speakers {
        speakers,
        unavailable,
    })
}

fn forbidden(namespace: &str) -> String {
    format!(
        "not allowed to list Pods or get pods/proxy in {namespace}; bind the Role ferrolb-explain there too (docs/explain.md)"
    )
}

enum Asked {
    Forbidden,
    Failed(String),
}

/// One speaker's report, through `/api/v1/namespaces/NS/pods/[https:]POD:PORT/proxy/PATH`.
async fn ask(client: &kube::Client, namespace: &str, pod: &Pod) -> Result<SpeakerReport, Asked> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let container = pod.spec.as_ref().and_then(|s| s.containers.first());
    let port = container
        .and_then(|c| c.ports.as_ref())
        .and_then(|ports| {
            ports
                .iter()
                .find(|p| p.name.as_deref() == Some("monitoring"))
        })
        .map_or(DEFAULT_PORT, |p| p.container_port);
    // The chart serves metrics over TLS when it is given a certificate.
    let tls = container
        .and_then(|c| c.env.as_ref())
        .is_some_and(|env| env.iter().any(|e| e.name == "FERROLB_METRICS_TLS_CERT"));
    let scheme = if tls { "https:" } else { "" };
    let path = format!(
        "/api/v1/namespaces/{namespace}/pods/{scheme}{name}:{port}/proxy{}",
        speaker_report::PATH
    );
    let request = http::Request::get(&path)
        .body(Vec::new())
        .map_err(|e| Asked::Failed(e.to_string()))?;
    let text = match tokio::time::timeout(TIMEOUT, client.request_text(request)).await {
        Err(_) => {
            return Err(Asked::Failed(format!(
                "no answer within {}s from Pod {name}",
                TIMEOUT.as_secs()
            )));
        }
        Ok(Err(kube::Error::Api(e))) if e.code == 403 && e.reason == "Forbidden" => {
            return Err(Asked::Forbidden);
        }
        Ok(Err(e)) => return Err(Asked::Failed(format!("Pod {name}: {e}"))),
        Ok(Ok(text)) => text,
    };
    let report: SpeakerReport = serde_json::from_str(&text)
        .map_err(|e| Asked::Failed(format!("Pod {name} answered something unreadable: {e}")))?;
    if report.schema != speaker_report::SCHEMA {
        return Err(Asked::Failed(format!(
            "Pod {name} speaks schema {:?}, this CLI reads {:?}",
            report.schema,
            speaker_report::SCHEMA
        )));
    }
    Ok(report)
}
