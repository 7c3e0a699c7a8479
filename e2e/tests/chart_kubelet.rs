//! The Helm chart on kubelet nodes (`up --kubelet`): real kubelets and containerd run what
//! `helm install` creates, from the images `images/build-oci.sh` builds and the lab imports into
//! every node. What only a kubelet exercises is tested here: the Deployment and the DaemonSet
//! scheduled and rolled, the images found without a pull, the security context as the runtime
//! enforces it (capabilities, user, read-only root, no new privileges, seccomp), the
//! ServiceAccount token, the downward API and the gossip Secret mounted into the pods, and
//! hostNetwork.
//!
//! Every test installs the release `ferrolb` into `metallb-system` (the CRDs with it: one release
//! owns them, as an operator's would), and uninstalls it at its end, also when it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use ferrolb_e2e::cluster::wait_for;
use ferrolb_e2e::ferrolb::NAMESPACE;
use ferrolb_e2e::helm::{self, RELEASE};
use ferrolb_e2e::lab::bin_dir;
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::service::lb_service;
use ferrolb_e2e::suite::{self, Suite};
use ferrolb_e2e::{Lab, Options, bench, helm_demo};
use ferrolb_testkit::trial::Arguments;
use serde_json::{Value, json};

/// On the lab segment, so the client reaches it by ARP (the layer 2 range of docs/lab.md).
const POOL: &str = "198.18.200.96/28";
/// CAP_NET_RAW and CAP_NET_BIND_SERVICE as bits of /proc/PID/status's capability sets.
const NET_RAW: u64 = 1 << 13;
const NET_BIND_SERVICE: u64 = 1 << 10;

/// The release, installed for one test and uninstalled when the test ends, however it ends.
struct Release<'a> {
    lab: &'a Lab,
}

impl<'a> Release<'a> {
    fn install(lab: &'a Lab, extra: &[&str]) -> anyhow::Result<Self> {
        // A release left by a failed run would make `upgrade --install` an upgrade.
        let _ = helm::helm(lab, &["uninstall", RELEASE, "-n", NAMESPACE, "--wait"]);
        let release = Release { lab };
        helm::install(lab, RELEASE, NAMESPACE, extra)?;
        Ok(release)
    }
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let _ = helm::helm(self.lab, &["uninstall", RELEASE, "-n", NAMESPACE, "--wait"]);
        let _ = self.lab.kubectl(&[
            "delete",
            "ipaddresspools,l2advertisements",
            "--all",
            "-n",
            NAMESPACE,
            "--ignore-not-found",
        ]);
    }
}

/// The pool and L2Advertisement, and a LoadBalancer Service `web` (HTTP on 80, the UDP echo on
/// 8081 for the outage probe) over two echo pods on node1 and node2; the Service's IP once the
/// client's requests through it are answered.
async fn serve(lab: &Lab, app: &mut TestScope, namespace: &str) -> anyhow::Result<String> {
    lab.apply(&format!(
        "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {{name: chart, namespace: {NAMESPACE}}}\nspec: {{addresses: ['{POOL}']}}\n---\napiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata: {{name: chart, namespace: {NAMESPACE}}}\nspec: {{ipAddressPools: [chart]}}\n"
    ))?;
    app.deploy("web", &["node1", "node2"]).await?;
    lab.apply(
        &json!(
            lb_service("web")
                .namespace(namespace)
                .selector("app", "web")
                .named_port("udp", 8081, 8081, "UDP")
                .build()
        )
        .to_string(),
    )?;
    let ip = wait_for(
        &format!("Service {namespace}/web to get an IP"),
        Duration::from_secs(60),
        || async {
            let ip = lab
                .kubectl(&[
                    "get",
                    "service",
                    "-n",
                    namespace,
                    "web",
                    "-o",
                    "jsonpath={.status.loadBalancer.ingress[0].ip}",
                ])
                .map_err(|e| e.to_string())?;
            Ok((!ip.trim().is_empty()).then(|| ip.trim().to_string()))
        },
    )
    .await?;
    let who = answers(lab, &ip).await?;
    ensure!(who.starts_with("web-"), "{ip} answered by {who:?}");
    Ok(ip)
}

/// The client's request to `ip` is answered (by a pod: its name and the source it saw).
async fn answers(lab: &Lab, ip: &str) -> anyhow::Result<String> {
    let url = ferrolb_e2e::lab::http_url(ip);
    wait_for(
        &format!("{url} to answer from the client"),
        Duration::from_secs(60),
        || async {
            let out = lab
                .exec_output("client", "curl", &["-sS", "--max-time", "2", "-g", &url])
                .map_err(|e| e.to_string())?;
            if out.status.success() {
                Ok(Some(
                    String::from_utf8_lossy(&out.stdout).trim().to_string(),
                ))
            } else {
                Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
            }
        },
    )
    .await
}

/// The release's pods of `component` (controller or speaker): name, node, uid, image and
/// container ID of each running one.
fn pods(lab: &Lab, component: &str) -> anyhow::Result<Vec<Value>> {
    let out = lab.kubectl(&[
        "get",
        "pods",
        "-n",
        NAMESPACE,
        "-l",
        &format!("app.kubernetes.io/component={component}"),
        "-o",
        "json",
    ])?;
    let list: Value = serde_json::from_str(&out)?;
    Ok(list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect())
}

/// The longest outage a rolling update or a deleted speaker pod may cause. The probe counts the
/// gap from the last answer to its end too, so a Service that stopped answering fails this.
/// Clean stops hand the IPs over (measured in tens of milliseconds); this bound leaves room for a
/// loaded machine, and is far below the failure timeout's handling of a crash.
const OUTAGE_BOUND_MS: f64 = 5_000.0;

fn bounded(report: &ferrolb_e2e::probe::Report) -> anyhow::Result<()> {
    ensure!(
        report.received > 0 && report.max_gap_ms < OUTAGE_BOUND_MS,
        "outage of {:.0} ms (at {:.0} ms; {} of {} answered), bound {OUTAGE_BOUND_MS} ms",
        report.max_gap_ms,
        report.gap_start_ms,
        report.received,
        report.sent
    );
    Ok(())
}

/// What the kernel says about a process: a field of /proc/PID/status.
fn status_field(pid: i32, name: &str) -> anyhow::Result<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|v| v.trim().to_string())
        .with_context(|| format!("{name} in /proc/{pid}/status"))
}

fn caps(pid: i32, set: &str) -> anyhow::Result<u64> {
    Ok(u64::from_str_radix(&status_field(pid, set)?, 16)?)
}

/// The host PID of a pod's first container.
fn pid_of(lab: &Lab, pod: &Value) -> anyhow::Result<i32> {
    let node = pod["spec"]["nodeName"].as_str().context("no node")?;
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .context("no container ID")?;
    lab.container_pid(node, id)
}

/// Whether `/` of the process is mounted read-only (its mount namespace's root).
fn root_read_only(pid: i32) -> anyhow::Result<bool> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    let root = info
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .context("no / in mountinfo")?;
    Ok(root
        .split_whitespace()
        .nth(5)
        .is_some_and(|opts| opts.split(',').any(|o| o == "ro")))
}

/// The speakers and the controller as the runtime runs them: the speaker with exactly the
/// capabilities `speaker_caps`, as root, in its node's network namespace; the controller as
/// user 65532 with none; both with a read-only root, no new privileges, the runtime's seccomp
/// filter, and the ServiceAccount token and the downward API in place.
fn check_security_context(lab: &Lab, speaker_caps: u64) -> anyhow::Result<()> {
    let speakers = pods(lab, "speaker")?;
    ensure!(
        speakers.len() == lab.topology.nodes().count(),
        "{} speakers",
        speakers.len()
    );
    for pod in &speakers {
        let name = pod["metadata"]["name"].as_str().unwrap_or("?");
        let node = pod["spec"]["nodeName"].as_str().context("no node")?;
        let pid = pid_of(lab, pod)?;
        for set in ["CapEff", "CapPrm", "CapBnd"] {
            let have = caps(pid, set)?;
            ensure!(
                have == speaker_caps,
                "speaker {name}: {set} {have:#x}, want {speaker_caps:#x}"
            );
        }
        for set in ["CapInh", "CapAmb"] {
            ensure!(caps(pid, set)? == 0, "speaker {name}: {set} not empty");
        }
        ensure!(
            status_field(pid, "Uid")?.starts_with("0\t"),
            "speaker {name} runs as root"
        );
        ensure!(
            status_field(pid, "NoNewPrivs")? == "1",
            "speaker {name}: NoNewPrivs"
        );
        ensure!(
            status_field(pid, "Seccomp")? == "2",
            "speaker {name}: no seccomp filter"
        );
        ensure!(root_read_only(pid)?, "speaker {name}: / is writable");
        // hostNetwork: the speaker's network namespace is its node's.
        let ns =
            |path: &str| std::fs::metadata(path).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        let host = lab.topology.host(node).context("node")?;
        ensure!(
            ns(&format!("/proc/{pid}/ns/net"))? == ns(&format!("/run/netns/{}", host.netns))?,
            "speaker {name} is not in {node}'s network namespace"
        );
        // The downward API and the mounted gossip key reached the process.
        let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
        let environ = String::from_utf8_lossy(&environ);
        ensure!(
            environ
                .split('\0')
                .any(|v| v == format!("NODE_NAME={node}")),
            "speaker {name}: NODE_NAME is not {node}"
        );
        let key = std::fs::read(format!("/proc/{pid}/root/etc/ml_secret_key/secretkey"))
            .or_else(|_| {
                let path = environ
                    .split('\0')
                    .find_map(|v| v.strip_prefix("FERROLB_GOSSIP_KEY_FILE="))
                    .unwrap_or("/etc/ml_secret_key/secretkey");
                std::fs::read(format!("/proc/{pid}/root{path}"))
            })
            .with_context(|| format!("speaker {name}: reading the mounted gossip key"))?;
        ensure!(
            key.len() >= 32,
            "speaker {name}: gossip key of {} bytes",
            key.len()
        );
    }
    let controllers = pods(lab, "controller")?;
    ensure!(!controllers.is_empty(), "no controller pod");
    for pod in &controllers {
        let name = pod["metadata"]["name"].as_str().unwrap_or("?");
        let pid = pid_of(lab, pod)?;
        ensure!(
            caps(pid, "CapEff")? == 0 && caps(pid, "CapBnd")? == 0,
            "controller {name} holds capabilities"
        );
        ensure!(
            status_field(pid, "Uid")?.starts_with("65532\t"),
            "controller {name}: uid {}",
            status_field(pid, "Uid")?
        );
        ensure!(
            status_field(pid, "NoNewPrivs")? == "1",
            "controller {name}: NoNewPrivs"
        );
        ensure!(
            status_field(pid, "Seccomp")? == "2",
            "controller {name}: no seccomp filter"
        );
        ensure!(root_read_only(pid)?, "controller {name}: / is writable");
        let token = std::fs::read_to_string(format!(
            "/proc/{pid}/root/var/run/secrets/kubernetes.io/serviceaccount/token"
        ))
        .with_context(|| format!("controller {name}: no ServiceAccount token"))?;
        ensure!(
            token.split('.').count() == 3,
            "controller {name}: the token is not a JWT"
        );
    }
    Ok(())
}

/// helm install serves an IP, and the runtime enforces the chart's security context.
async fn install_serves_with_the_security_context_enforced(lab: &Lab) -> anyhow::Result<()> {
    let _release = Release::install(lab, &[])?;
    let wide = helm_demo::running_and_ready(lab).await?;
    eprintln!("{wide}");
    let mut app = TestScope::new(lab, "chart-k-install").await?;
    serve(lab, &mut app, "chart-k-install").await?;
    check_security_context(lab, NET_RAW)
}

/// A user with no spare addresses installs the chart with one value, and a LoadBalancer Service
/// with no pool anywhere gets its nodes' addresses and answers on them (docs/k3s.md): the
/// controller and speaker pods as the chart runs them, presence group and RBAC included.
async fn node_addresses_serve_with_no_pool_from_one_value(lab: &Lab) -> anyhow::Result<()> {
    let _release = Release::install(lab, &["--set", "controller.nodeAddresses.enabled=true"])?;
    helm_demo::running_and_ready(lab).await?;
    lab.kubectl(&[
        "delete",
        "ipaddresspools",
        "--all",
        "-n",
        NAMESPACE,
        "--ignore-not-found",
    ])?;
    let namespace = "chart-k-nodes";
    let mut app = TestScope::new(lab, namespace).await?;
    app.deploy("web", &["node1", "node2"]).await?;
    lab.apply(
        &json!(
            lb_service("web")
                .namespace(namespace)
                .selector("app", "web")
                .build()
        )
        .to_string(),
    )?;
    let mut want: Vec<String> = lab
        .topology
        .nodes()
        .map(|h| h.interfaces[0].ipv4.to_string())
        .collect();
    want.sort();
    let ips = wait_for(
        &format!("Service {namespace}/web to list every node's address"),
        Duration::from_secs(90),
        || async {
            let ips = lab
                .kubectl(&[
                    "get",
                    "service",
                    "-n",
                    namespace,
                    "web",
                    "-o",
                    "jsonpath={.status.loadBalancer.ingress[*].ip}",
                ])
                .map_err(|e| e.to_string())?;
            let ips: Vec<String> = ips.split_whitespace().map(str::to_string).collect();
            if ips == want {
                Ok(Some(ips))
            } else {
                Err(format!("ingress {ips:?}"))
            }
        },
    )
    .await?;
    for ip in &ips {
        let who = answers(lab, ip).await?;
        ensure!(who.starts_with("web-"), "{ip} answered by {who:?}");
    }
    Ok(())
}

/// `helm upgrade` to a new image tag (and BGP listening): the Deployment and the DaemonSet roll
/// every pod, one speaker at a time; the IP stays and keeps answering, the outage is measured;
/// the gossip key stays; the new speakers hold NET_BIND_SERVICE too and listen on 179.
async fn upgrade_rolls_every_pod_and_keeps_the_ip(lab: &Lab) -> anyhow::Result<()> {
    let _release = Release::install(lab, &[])?;
    helm_demo::running_and_ready(lab).await?;
    let mut app = TestScope::new(lab, "chart-k-upgrade").await?;
    let ip = serve(lab, &mut app, "chart-k-upgrade").await?;
    let key = gossip_key(lab)?;
    let leases = presence_leases(lab)?;
    ensure!(leases.len() == 3, "presence Leases before: {leases:?}");
    let before: Vec<String> = [pods(lab, "speaker")?, pods(lab, "controller")?]
        .concat()
        .iter()
        .filter_map(|p| p["metadata"]["uid"].as_str().map(str::to_string))
        .collect();
    // The same images under a new tag: what a release upgrade brings, without a registry.
    let tag = "0.1.0-upgrade";
    for image in [
        "ghcr.io/ferrolb/ferrolb-controller",
        "ghcr.io/ferrolb/ferrolb-speaker",
    ] {
        let current = ferrolb_e2e::lab::images::layout_tag(
            &ferrolb_e2e::lab::images::oci_dir().join(image.rsplit('/').next().unwrap_or(image)),
        )?;
        lab.tag_image(&format!("{image}:{current}"), tag)?;
    }
    let probe = bench::start_probe(lab, "client", &ip, Duration::from_secs(90))?;
    let started = Instant::now();
    let upgraded = helm::install(
        lab,
        RELEASE,
        NAMESPACE,
        &[
            "--reuse-values",
            "--set",
            &format!("controller.image.tag={tag}"),
            "--set",
            &format!("speaker.image.tag={tag}"),
            "--set",
            "speaker.bgpListen={0.0.0.0:179}",
        ],
    );
    let rolled_in = started.elapsed();
    let report = bench::finish_probe(probe)?;
    upgraded?;
    helm_demo::running_and_ready(lab).await?;
    eprintln!(
        "upgrade: rolled in {rolled_in:.1?}; probe of {ip}: {} of {} answered, longest gap {:.0} ms at {:.0} ms",
        report.received, report.sent, report.max_gap_ms, report.gap_start_ms
    );
    ensure!(
        rolled_in < Duration::from_secs(85),
        "the roll took {rolled_in:?}, longer than the probe ran"
    );
    bounded(&report)?;
    let after = [pods(lab, "speaker")?, pods(lab, "controller")?].concat();
    for pod in &after {
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        ensure!(
            !before.iter().any(|b| b == uid),
            "pod {} was not replaced",
            pod["metadata"]["name"]
        );
        let image = pod["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or_default();
        ensure!(
            image.ends_with(&format!(":{tag}")),
            "pod {} runs {image}",
            pod["metadata"]["name"]
        );
    }
    let now = lab.kubectl(&[
        "get",
        "service",
        "-n",
        "chart-k-upgrade",
        "web",
        "-o",
        "jsonpath={.status.loadBalancer.ingress[0].ip}",
    ])?;
    ensure!(
        now.trim() == ip,
        "the upgrade moved the IP from {ip} to {now}"
    );
    ensure!(
        gossip_key(lab)? == key,
        "the upgrade changed the gossip key"
    );
    // The speakers' presence Leases are the same objects: the roll neither deleted them (the
    // restart hold keeps them for the successors) nor let the garbage collector take them
    // with the replaced Pods (their owner is the DaemonSet).
    let now_leases = presence_leases(lab)?;
    ensure!(
        now_leases == leases,
        "presence Leases before the roll {leases:?}, after {now_leases:?}"
    );
    let who = answers(lab, &ip).await?;
    ensure!(who.starts_with("web-"), "answered by {who:?}");
    // Listening for BGP: NET_BIND_SERVICE added, and port 179 held by the speaker.
    check_security_context(lab, NET_RAW | NET_BIND_SERVICE)?;
    let listening = lab.exec("node1", "ss", &["-Htlnp", "sport", "=", ":179"])?;
    ensure!(
        listening.contains("ferrolb-speaker"),
        "node1 port 179: {listening:?}"
    );
    println!(
        "chart-kubelet upgrade: roll {:.1} s, longest gap {:.0} ms ({} of {} answered)",
        rolled_in.as_secs_f64(),
        report.max_gap_ms,
        report.received,
        report.sent
    );
    Ok(())
}

fn gossip_key(lab: &Lab) -> anyhow::Result<String> {
    lab.kubectl(&[
        "get",
        "secret",
        "-n",
        NAMESPACE,
        &format!("{RELEASE}-memberlist"),
        "-o",
        "jsonpath={.data.secretkey}",
    ])
}

/// The owner's speaker pod deleted: the DaemonSet makes a new one on the same node, which
/// becomes Ready; the IP stays and answers again.
async fn deleted_speaker_pod_is_recreated(lab: &Lab) -> anyhow::Result<()> {
    let _release = Release::install(lab, &[])?;
    helm_demo::running_and_ready(lab).await?;
    let mut app = TestScope::new(lab, "chart-k-delete").await?;
    let ip = serve(lab, &mut app, "chart-k-delete").await?;
    let owner = ferrolb_e2e::service::wait_l2_owner(lab, "chart-k-delete", "web").await?;
    let victim = pods(lab, "speaker")?
        .into_iter()
        .find(|p| p["spec"]["nodeName"] == owner.as_str())
        .with_context(|| format!("no speaker pod on the owner {owner:?}"))?;
    let victim_name = victim["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let probe = bench::start_probe(lab, "client", &ip, Duration::from_secs(40))?;
    std::thread::sleep(Duration::from_secs(2));
    lab.kubectl(&[
        "delete",
        "pod",
        "-n",
        NAMESPACE,
        &victim_name,
        "--wait=false",
    ])?;
    let replaced = wait_for(
        &format!("the DaemonSet to replace {victim_name} on {owner}"),
        Duration::from_secs(60),
        || async {
            let speakers = pods(lab, "speaker").map_err(|e| e.to_string())?;
            let new = speakers.into_iter().find(|p| {
                p["spec"]["nodeName"] == owner.as_str()
                    && p["metadata"]["name"] != victim_name.as_str()
                    && p["status"]["conditions"].as_array().is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
            });
            Ok(new.map(|p| {
                p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            }))
        },
    )
    .await?;
    let report = bench::finish_probe(probe)?;
    eprintln!(
        "speaker pod {victim_name} on {owner} replaced by {replaced}; probe of {ip}: {} of {} answered, longest gap {:.0} ms",
        report.received, report.sent, report.max_gap_ms
    );
    bounded(&report)?;
    let now = lab.kubectl(&[
        "get",
        "service",
        "-n",
        "chart-k-delete",
        "web",
        "-o",
        "jsonpath={.status.loadBalancer.ingress[0].ip}",
    ])?;
    ensure!(now.trim() == ip, "the IP moved from {ip} to {now}");
    let who = answers(lab, &ip).await?;
    ensure!(who.starts_with("web-"), "answered by {who:?}");
    println!(
        "chart-kubelet speaker pod deleted: longest gap {:.0} ms ({} of {} answered)",
        report.max_gap_ms, report.received, report.sent
    );
    Ok(())
}

/// A speaker container without NET_RAW (its DaemonSet patched as a policy engine or a
/// hand edit might) fails at start and says why; the roll stops at that one node.
async fn speaker_without_net_raw_fails_clearly(lab: &Lab) -> anyhow::Result<()> {
    let _release = Release::install(lab, &[])?;
    helm_demo::running_and_ready(lab).await?;
    let daemonset = format!("{RELEASE}-speaker");
    lab.kubectl(&[
        "patch", "daemonset", "-n", NAMESPACE, &daemonset, "--type=json", "-p",
        r#"[{"op":"replace","path":"/spec/template/spec/containers/0/securityContext/capabilities/add","value":[]}]"#,
    ])?;
    let message = "needs the capability NET_RAW";
    let (pod, log) = wait_for(
        "a speaker pod without NET_RAW to fail and say why",
        Duration::from_secs(90),
        || async {
            for pod in pods(lab, "speaker").map_err(|e| e.to_string())? {
                let name = pod["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let restarted = pod["status"]["containerStatuses"][0]["restartCount"]
                    .as_u64()
                    .unwrap_or(0)
                    > 0;
                if !restarted {
                    continue;
                }
                let log = lab
                    .kubectl(&["logs", "-n", NAMESPACE, &name, "--previous"])
                    .unwrap_or_default();
                if log.contains(message) {
                    return Ok(Some((name, log)));
                }
            }
            Err("no speaker has failed yet".to_string())
        },
    )
    .await?;
    eprintln!("{pod}: {}", log.lines().last().unwrap_or_default());
    // The others still run: a rolling update stops at the first pod that does not become Ready.
    let ready = pods(lab, "speaker")?
        .iter()
        .filter(|p| {
            p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
        .count();
    ensure!(
        ready == lab.topology.nodes().count() - 1,
        "{ready} speakers Ready while one fails"
    );
    Ok(())
}

/// `helm uninstall` removes every object of the release: no workload, pod, Secret,
/// ServiceAccount, RBAC object, Service, webhook or container is left, and the CRDs stay (as
/// MetalLB's chart keeps its own). What the running components wrote for themselves names an
/// owner the release removes (the speakers' DaemonSet; the controller's ServiceAccount), so the
/// garbage collector takes it too: the namespace ends as Kubernetes made it, plus Events and
/// the configuration the user applied. The Service stays up through the uninstall, so its
/// status objects go with their owners, not with the Service.
async fn uninstall_removes_the_release_and_keeps_the_crds(lab: &Lab) -> anyhow::Result<()> {
    let release = Release::install(lab, &[])?;
    helm_demo::running_and_ready(lab).await?;
    let mut app = TestScope::new(lab, "chart-k-uninstall").await?;
    serve(lab, &mut app, "chart-k-uninstall").await?;
    // Before: each record names its owner, the live object: the speakers' the DaemonSet
    // (which a rolling update keeps), the controller's its ServiceAccount.
    let uid_of = |kind: &str, name: &str| {
        lab.kubectl(&[
            "get",
            kind,
            name,
            "-n",
            NAMESPACE,
            "-o",
            "jsonpath={.metadata.uid}",
        ])
    };
    let speakers = (
        "DaemonSet".to_string(),
        format!("{RELEASE}-speaker"),
        uid_of("daemonset", &format!("{RELEASE}-speaker"))?,
    );
    let account = (
        "ServiceAccount".to_string(),
        format!("{RELEASE}-controller"),
        uid_of("serviceaccount", &format!("{RELEASE}-controller"))?,
    );
    wait_for(
        "the components' records to name their owners",
        Duration::from_secs(60),
        || async {
            let mut wrong = Vec::new();
            let mut seen = BTreeMap::new();
            for kind in [
                "leases",
                "configurationstates.metallb.io",
                "servicel2statuses.metallb.io",
            ] {
                for r in records(lab, kind).map_err(|e| e.to_string())? {
                    let want = if kind == "servicel2statuses.metallb.io"
                        || r.name.starts_with(&format!("{RELEASE}-speaker-"))
                    {
                        &speakers
                    } else {
                        &account
                    };
                    if r.owners != [want.clone()] {
                        wrong.push(format!(
                            "{kind}/{}: owners {:?}, want {want:?}",
                            r.name, r.owners
                        ));
                    }
                    *seen.entry(kind).or_insert(0) += 1;
                }
            }
            // The leader Lease, three presence Leases, ConfigurationState, one ServiceL2Status.
            let complete = seen.get("leases").is_some_and(|n| *n >= 4)
                && seen.contains_key("configurationstates.metallb.io")
                && seen.contains_key("servicel2statuses.metallb.io");
            if wrong.is_empty() && complete {
                Ok(Some(()))
            } else {
                Err(format!("{wrong:?}; seen {seen:?}"))
            }
        },
    )
    .await?;
    drop(release);
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    // The workloads' pods go after them (deleted in the background, then stopped by their
    // kubelets within their grace period).
    wait_for(&format!("nothing of the release left in {NAMESPACE}"), Duration::from_secs(120), || async {
        let left = lab
            .kubectl(&[
                "get",
                "deployments,daemonsets,replicasets,pods,secrets,configmaps,serviceaccounts,roles,rolebindings,services",
                "-n", NAMESPACE, "-l", &selector, "-o", "name",
            ])
            .map_err(|e| e.to_string())?;
        if left.trim().is_empty() { Ok(Some(())) } else { Err(left) }
    })
    .await?;
    let cluster = lab.kubectl(&[
        "get",
        "clusterroles,clusterrolebindings,validatingwebhookconfigurations,mutatingwebhookconfigurations",
        "-l", &selector, "-o", "name",
    ])?;
    ensure!(cluster.trim().is_empty(), "left cluster-wide: {cluster}");
    let secrets = lab.kubectl(&["get", "secrets", "-n", NAMESPACE, "-o", "name"])?;
    ensure!(
        !secrets.contains("memberlist"),
        "the gossip Secret stayed: {secrets}"
    );
    // Everything else in the namespace: only what Kubernetes keeps in any namespace, Events
    // and the configuration the user applied. The garbage collector works after the owners
    // are gone, so this is awaited.
    let kinds = lab.kubectl(&[
        "api-resources",
        "--namespaced",
        "--verbs=list",
        "-o",
        "name",
    ])?;
    let kinds: Vec<&str> = kinds.lines().filter(|k| !k.starts_with("events")).collect();
    let expected = |name: &str| {
        matches!(
            name,
            "configmap/kube-root-ca.crt" | "serviceaccount/default"
        ) || name.starts_with("ipaddresspool.metallb.io/")
            || name.starts_with("l2advertisement.metallb.io/")
    };
    wait_for(
        &format!("nothing but Kubernetes' own and the user's objects in {NAMESPACE}"),
        Duration::from_secs(60),
        || async {
            let left = lab
                .kubectl(&["get", &kinds.join(","), "-n", NAMESPACE, "-o", "name"])
                .map_err(|e| e.to_string())?;
            let unexpected: Vec<&str> = left.lines().filter(|n| !expected(n)).collect();
            if unexpected.is_empty() {
                Ok(Some(()))
            } else {
                Err(format!("left: {unexpected:?}"))
            }
        },
    )
    .await?;
    drop(app);
    let crds = lab.kubectl(&["get", "crds", "-o", "name"])?;
    ensure!(
        crds.contains("ipaddresspools.metallb.io"),
        "the CRDs went too: {crds}"
    );
    // No container of the release is left on any node.
    wait_for(
        "every node's containers of the release to be gone",
        Duration::from_secs(60),
        || async {
            let mut left = Vec::new();
            for rt in lab.kubelet_nodes() {
                let containers = ferrolb_e2e::lab::kubelet::ctr(&rt, &["containers", "ls"])
                    .map_err(|e| e.to_string())?;
                left.extend(
                    containers
                        .lines()
                        .filter(|l| {
                            l.contains("ferrolb-controller") || l.contains("ferrolb-speaker")
                        })
                        .map(|l| format!("{}: {l}", rt.node)),
                );
            }
            if left.is_empty() {
                Ok(Some(()))
            } else {
                Err(left.join("; "))
            }
        },
    )
    .await?;
    Ok(())
}

/// An object the components wrote for themselves, as the API server has it.
#[derive(Debug)]
struct Record {
    name: String,
    uid: String,
    /// Its owner references: (kind, name, uid) each.
    owners: Vec<(String, String, String)>,
}

/// The objects of `kind` in the release namespace.
fn records(lab: &Lab, kind: &str) -> anyhow::Result<Vec<Record>> {
    let list: serde_json::Value =
        serde_json::from_str(&lab.kubectl(&["get", kind, "-n", NAMESPACE, "-o", "json"])?)
            .with_context(|| format!("{kind}: kubectl's JSON"))?;
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| Record {
            name: text(&o["metadata"]["name"]),
            uid: text(&o["metadata"]["uid"]),
            owners: o["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| (text(&r["kind"]), text(&r["name"]), text(&r["uid"])))
                .collect(),
        })
        .collect())
}

/// The speakers' presence Leases, by name, with their UIDs.
fn presence_leases(lab: &Lab) -> anyhow::Result<BTreeMap<String, String>> {
    Ok(records(lab, "leases")?
        .into_iter()
        .filter(|r| r.name.starts_with(&format!("{RELEASE}-speaker-")))
        .map(|r| (r.name, r.uid))
        .collect())
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let helm = bin_dir().join("helm");
    let no_helm =
        (!helm.is_file()).then(|| format!("needs helm ({}): run e2e/install-deps", helm.display()));
    let conclusion = Suite::<Lab>::new("chart-kubelet")
        .options(Options {
            kubelet: true,
            ..Options::default()
        })
        .one_at_a_time()
        .requires(no_helm.map_or(Ok(()), Err))
        .test(
            "install_serves_an_ip_with_the_security_context_enforced_by_the_runtime",
            |lab| {
                Box::pin(
                    async move { install_serves_with_the_security_context_enforced(&lab).await },
                )
            },
        )
        .test(
            "upgrade_to_a_new_tag_rolls_every_pod_keeps_the_ip_and_measures_the_outage",
            |lab| Box::pin(async move { upgrade_rolls_every_pod_and_keeps_the_ip(&lab).await }),
        )
        .test(
            "node_addresses_serve_a_service_with_no_pool_from_one_chart_value",
            |lab| {
                Box::pin(
                    async move { node_addresses_serve_with_no_pool_from_one_value(&lab).await },
                )
            },
        )
        .test(
            "a_deleted_speaker_pod_is_recreated_by_the_daemonset_and_the_ip_stays",
            |lab| Box::pin(async move { deleted_speaker_pod_is_recreated(&lab).await }),
        )
        .test(
            "a_speaker_without_net_raw_fails_at_start_with_a_clear_error",
            |lab| Box::pin(async move { speaker_without_net_raw_fails_clearly(&lab).await }),
        )
        .test(
            "uninstall_removes_every_object_and_container_of_the_release_and_keeps_the_crds",
            |lab| {
                Box::pin(
                    async move { uninstall_removes_the_release_and_keeps_the_crds(&lab).await },
                )
            },
        )
        .run(&args, |lab| Box::pin(async move { Ok(lab) }));
    suite::exit_code(&[conclusion])
}
