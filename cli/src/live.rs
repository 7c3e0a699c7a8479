//! The speakers, live: their presence Leases, and each one's report
//! (`ferrolb_explain::speaker_report`) read through the API server's proxy to its Pod, so the
//! CLI needs no route to the nodes, only `get` on `pods/proxy` in the speakers' namespace. The
//! speaker checks that permission itself with the user's bearer token, which the CLI sends in
//! `speaker_report::TOKEN_HEADER` (the API server does not pass `Authorization` on).

use std::time::Duration;

use anyhow::Context as _;
use ferrolb_explain::live::LiveSpeaker;
use ferrolb_explain::speaker_report::{self, SpeakerReport};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

/// Label on the speakers' presence Leases.
const PRESENCE_LABEL: &str = ferrolb_runtime::voters::PRESENCE_LABEL;

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
    /// Why no report was read at all (RBAC, no path to the speakers), if so.
    pub unavailable: Option<String>,
    /// The presence Leases could not be read: which speakers run is not known.
    pub unknown: bool,
}

/// Reads the speakers of `namespace`: their Leases (live when renewed within their duration,
/// by this machine's clock), then the report of each live one.
/// `selector` picks the speaker Pods.
/// `token` is the user's bearer token, which the speakers ask for.
pub async fn read(
    client: &kube::Client,
    token: Option<&str>,
    namespace: &str,
    selector: &str,
) -> anyhow::Result<Speakers> {
    let leases = match Api::<Lease>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(PRESENCE_LABEL))
        .await
    {
        Ok(list) => list.items,
        Err(kube::Error::Api(e)) if e.code == 403 => {
            return Ok(Speakers {
                speakers: Vec::new(),
                unavailable: Some(format!(
                    "not allowed to list the speakers' presence Leases in {namespace}; bind the ClusterRole ferrolb-explain (docs/explain.md)"
                )),
                unknown: true,
            });
        }
        Err(e) => return Err(e).context("listing the speakers' presence Leases"),
    };
    // The speakers renew by their clocks, which agree with the API server's; this machine's
    // may not: judge freshness by the API server's time when it says it.
    let now = server_time(client)
        .await
        .unwrap_or_else(|| k8s_openapi::jiff::Timestamp::now().as_second());
    let mut speakers = from_leases(leases, now);
    let pods = match Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(selector))
        .await
    {
        Ok(list) => list.items,
        Err(kube::Error::Api(e)) if e.code == 403 => {
            return Ok(Speakers {
                speakers,
                unavailable: Some(forbidden(namespace)),
                unknown: false,
            });
        }
        Err(e) => return Err(e).context("listing the speaker Pods"),
    };
    let asks = speakers.iter().filter(|s| s.live).map(|s| {
        let pod = running_pod(&pods, &s.node);
        ask_node(client, token, namespace, selector, pod, s.node.clone())
    });
    let answers = futures::future::join_all(asks).await;
    let unavailable = take_answers(&mut speakers, answers, namespace, token.is_some());
    Ok(Speakers {
        speakers,
        unavailable,
        unknown: false,
    })
}

/// The field manager of the speakers' presence Lease writes.
const SPEAKER_MANAGER: &str = "ferrolb-speaker";

/// When the API server last took a renewal of `lease` (seconds): the time of the speaker's
/// managed-fields entry, which the API server stamps with its own clock at every apply that
/// changes the Lease, so a speaker whose wall clock is off is judged right (issue 33). Without
/// that entry, the `renewTime` the speaker wrote.
fn renewed_at(lease: &Lease) -> Option<i64> {
    let applied = lease
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|f| f.manager.as_deref() == Some(SPEAKER_MANAGER))
        .filter_map(|f| f.time.as_ref().map(|t| t.0.as_second()))
        .max();
    applied.or_else(|| Some(lease.spec.as_ref()?.renew_time.as_ref()?.0.as_second()))
}

/// One speaker per presence Lease that is not being deleted and has a holder, sorted by node;
/// live when the API server took its last renewal within its duration of `now` (seconds).
fn from_leases(leases: Vec<Lease>, now: i64) -> Vec<LiveSpeaker> {
    let mut speakers: Vec<LiveSpeaker> = leases
        .into_iter()
        .filter(|l| l.metadata.deletion_timestamp.is_none())
        .filter_map(|l| {
            let at = renewed_at(&l);
            let spec = l.spec?;
            let node = spec.holder_identity.filter(|h| !h.is_empty())?;
            let live = at
                .is_some_and(|at| now - at <= i64::from(spec.lease_duration_seconds.unwrap_or(40)));
            Some(LiveSpeaker {
                node,
                live,
                ..LiveSpeaker::default()
            })
        })
        .collect();
    speakers.sort_by(|a, b| a.node.cmp(&b.node));
    speakers
}

/// The running speaker Pod on `node`, the newest if there are several (a rolling update): an
/// evicted or pending one never answers.
fn running_pod<'a>(pods: &'a [Pod], node: &str) -> Option<&'a Pod> {
    pods.iter()
        .filter(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                && p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .max_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0))
}

/// The report of the speaker on `node` from its `pod`, which must answer for that node.
async fn ask_node(
    client: &kube::Client,
    token: Option<&str>,
    namespace: &str,
    selector: &str,
    pod: Option<&Pod>,
    node: String,
) -> Result<SpeakerReport, Asked> {
    match pod {
        Some(pod) => match ask(client, token, namespace, pod).await {
            Ok(report) if report.node != node => Err(Asked::Failed(format!(
                "its Pod answered for node {:?}",
                report.node
            ))),
            other => other,
        },
        None => Err(Asked::Failed(format!(
            "no running speaker Pod ({selector}) on this node"
        ))),
    }
}

/// Stores the live speakers' `answers` (in their order) on them; returns why no report was
/// read at all, if so.
fn take_answers(
    speakers: &mut [LiveSpeaker],
    answers: Vec<Result<SpeakerReport, Asked>>,
    namespace: &str,
    sent_token: bool,
) -> Option<String> {
    let mut unavailable = None;
    let mut failures = Vec::new();
    let mut answered = 0;
    for (s, answer) in speakers.iter_mut().filter(|s| s.live).zip(answers) {
        match answer {
            Ok(report) => {
                s.report = Some(report);
                answered += 1;
            }
            Err(Asked::Forbidden) => unavailable = Some(forbidden(namespace)),
            Err(Asked::Refused(status)) => {
                unavailable = Some(refused(status, namespace, sent_token));
            }
            Err(Asked::Failed(e)) => failures.push((s.node.clone(), e)),
        }
    }
    if answered == 0 && failures.len() > 1 && unavailable.is_none() {
        // Every speaker failing the same way is the path (the API server cannot reach the
        // nodes' metrics port, a firewall), not every speaker broken: a note, not a problem on
        // each Service.
        unavailable = Some(format!(
            "no speaker answered through the API server's proxy (the API server may not reach the nodes' metrics port); {}: {}",
            failures[0].0, failures[0].1
        ));
    } else {
        for (node, e) in failures {
            if let Some(s) = speakers.iter_mut().find(|s| s.node == node) {
                s.error = Some(e);
            }
        }
    }
    unavailable
}

/// The API server's clock, from the `Date` header of a request for its version (seconds).
async fn server_time(client: &kube::Client) -> Option<i64> {
    let request = http::Request::get("/version").body(Vec::new()).ok()?;
    let response =
        tokio::time::timeout(TIMEOUT, client.send(request.map(kube::client::Body::from)))
            .await
            .ok()?
            .ok()?;
    http_date(response.headers().get(http::header::DATE)?.to_str().ok()?)
}

/// An HTTP `Date` header (RFC 9110's IMF-fixdate, an RFC 2822 date) in seconds.
fn http_date(text: &str) -> Option<i64> {
    let parsed = k8s_openapi::jiff::fmt::rfc2822::parse(text).ok()?;
    Some(parsed.timestamp().as_second())
}

fn forbidden(namespace: &str) -> String {
    format!(
        "not allowed to list Pods or get pods/proxy in {namespace}; bind the Role ferrolb-explain there too (docs/explain.md)"
    )
}

/// Why a speaker refused the report: it answers only callers whose bearer token allows `get` on
/// its Pod's pods/proxy (401: no token or one it could not verify, 403: not allowed).
fn refused(status: u16, namespace: &str, sent_token: bool) -> String {
    match (status, sent_token) {
        (401, false) => "the speakers answer only callers that send a bearer token, and this kubeconfig's user has none (a client certificate?): use one with a token, e.g. of a ServiceAccount bound to the Role ferrolb-explain (docs/explain.md)".into(),
        (401, true) => "the speakers did not accept this kubeconfig's token (401)".into(),
        _ => format!(
            "the speakers refused this kubeconfig's user ({status}): it needs get on pods/proxy in {namespace}, the Role ferrolb-explain (docs/explain.md)"
        ),
    }
}

enum Asked {
    /// The API server refused the proxy request (RBAC).
    Forbidden,
    /// The speaker refused the caller (its HTTP status).
    Refused(u16),
    Failed(String),
}

/// The bearer token `config`'s user presents to the API server, as kube's client would send it
/// (a static token, a token file, an exec plugin's or an auth provider's); `None` for a client
/// certificate or basic authentication, which cannot be passed on.
pub async fn bearer_token(config: &kube::Config) -> Option<String> {
    use kube::client::ConfigExt as _;
    use tower::ServiceExt as _;
    let auth = config.auth_layer().ok()??;
    // Runs the auth layer over a service that only keeps the header it set.
    let keep = tower::service_fn(|request: http::Request<kube::client::Body>| async move {
        let value = request.headers().get(http::header::AUTHORIZATION).cloned();
        // The auth layer wants a response: the header is its body.
        Ok::<_, tower::BoxError>(http::Response::new(value))
    });
    let request = http::Request::get("/")
        .body(kube::client::Body::empty())
        .ok()?;
    let value = tower::ServiceBuilder::new()
        .layer(auth)
        .service(keep)
        .oneshot(request)
        .await
        .ok()?
        .into_body()?;
    bearer(value.to_str().ok()?)
}

/// The token of an `Authorization: Bearer` value.
fn bearer(value: &str) -> Option<String> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_string())
}

/// One speaker's report, through `/api/v1/namespaces/NS/pods/[https:]POD:PORT/proxy/PATH`.
async fn ask(
    client: &kube::Client,
    token: Option<&str>,
    namespace: &str,
    pod: &Pod,
) -> Result<SpeakerReport, Asked> {
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
    let mut request = http::Request::get(&path);
    if let Some(token) = token {
        request = request.header(speaker_report::TOKEN_HEADER, format!("Bearer {token}"));
    }
    let request = request
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
        // The speaker's own refusal (plain text, not the API server's Status).
        Ok(Err(kube::Error::Api(e))) if e.code == 401 || e.code == 403 => {
            return Err(Asked::Refused(e.code));
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A speaker whose clock is 90 s behind writes an old `renewTime`; the API server's stamp
    /// of its last apply says it is live. A dead one whose clock was ahead is not.
    #[test]
    fn liveness_is_judged_by_the_api_servers_clock() {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, MicroTime, Time};
        use k8s_openapi::jiff::Timestamp;
        let now = 1_800_000_000;
        let lease = |node: &str, written: i64, applied: Option<i64>| {
            let mut l = Lease {
                spec: Some(LeaseSpec {
                    holder_identity: Some(node.into()),
                    lease_duration_seconds: Some(40),
                    renew_time: Some(MicroTime(Timestamp::from_second(written).unwrap())),
                    ..Default::default()
                }),
                ..Default::default()
            };
            l.metadata.managed_fields = applied.map(|at| {
                vec![ManagedFieldsEntry {
                    manager: Some(SPEAKER_MANAGER.into()),
                    operation: Some("Apply".into()),
                    time: Some(Time(Timestamp::from_second(at).unwrap())),
                    ..Default::default()
                }]
            });
            l
        };
        let speakers = from_leases(
            vec![
                lease("behind", now - 95, Some(now - 5)),
                lease("ahead-dead", now + 90, Some(now - 120)),
                lease("no-fields", now - 10, None),
            ],
            now,
        );
        let live: Vec<(&str, bool)> = speakers.iter().map(|s| (s.node.as_str(), s.live)).collect();
        assert_eq!(
            live,
            [("ahead-dead", false), ("behind", true), ("no-fields", true)]
        );
    }

    /// The token the kubeconfig gives the API server is the one sent to the speakers; a client
    /// certificate gives none.
    #[tokio::test]
    async fn the_kubeconfigs_bearer_token_is_found() {
        let dir = std::env::temp_dir().join(format!("ferrolb-cli-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token_file = dir.join("token");
        std::fs::write(&token_file, "from-a-file").unwrap();
        let kubeconfig = |user: &str| {
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443\ncontexts:\n- name: c\n  context:\n    cluster: k\n    user: u\nusers:\n- name: u\n  user:\n{user}\n"
            )
        };
        let token_of = async |user: &str| {
            let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig(user)).unwrap();
            let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap();
            bearer_token(&config).await
        };
        assert_eq!(
            token_of("    token: abc.def").await.as_deref(),
            Some("abc.def")
        );
        assert_eq!(
            token_of(&format!("    tokenFile: {}", token_file.display()))
                .await
                .as_deref(),
            Some("from-a-file")
        );
        assert_eq!(
            token_of("    username: alice\n    password: secret").await,
            None
        );
        assert_eq!(
            token_of("    client-certificate-data: Y2VydA==\n    client-key-data: a2V5").await,
            None
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A speaker's refusal is one note for all, saying what to do.
    #[test]
    fn a_refusal_says_what_is_missing() {
        let mut speakers = vec![LiveSpeaker {
            node: "n1".into(),
            live: true,
            ..LiveSpeaker::default()
        }];
        let note = take_answers(&mut speakers, vec![Err(Asked::Refused(401))], "ns", false);
        assert!(note.unwrap().contains("has none"));
        let note = take_answers(&mut speakers, vec![Err(Asked::Refused(401))], "ns", true);
        assert!(note.unwrap().contains("did not accept"));
        let note = take_answers(&mut speakers, vec![Err(Asked::Refused(403))], "ns", true);
        assert!(note.unwrap().contains("pods/proxy in ns"));
        assert!(speakers[0].error.is_none() && speakers[0].report.is_none());
    }

    #[test]
    fn the_api_servers_date_is_read() {
        assert_eq!(
            http_date("Thu, 03 Dec 2026 14:30:00 GMT"),
            Some(1_796_308_200)
        );
        assert_eq!(http_date("yesterday"), None);
    }
}
