//! Pods: a network namespace with an echo server, routed through its node, and its Pod object.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};

use super::*;
use crate::cluster;
use crate::cmd::{ip_in, run, sysctl_in};
use crate::process::{self};
use crate::topology::Role;

impl Lab {
    /// Creates a pod on `node`: a namespace with an echo server, routed through the node, and a
    /// Ready Pod object with these labels.
    pub async fn add_pod(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        labels: &BTreeMap<String, String>,
    ) -> anyhow::Result<LabPod> {
        if self.topology.options.kubelet {
            return self.add_kubelet_pod(namespace, name, node, labels).await;
        }
        let Some(host) = self.topology.host(node) else {
            bail!("no node {node:?}")
        };
        let Role::Node { index, .. } = host.role else {
            bail!("{node:?} is not a node")
        };
        let (netns, veth, host_number) = self.reserve_pod(namespace, name, node)?;
        let fam = self.topology.options.families;
        let ip4 = format!("198.19.{index}.{host_number}");
        let ip6 = format!("fd00:19:{index:x}::{host_number:x}");
        let mut ips = Vec::new();
        if fam.v4() {
            ips.push(ip4.clone());
        }
        if fam.v6() {
            ips.push(ip6.clone());
        }
        run("ip", &["netns", "add", &netns])?;
        let result: anyhow::Result<LabPod> = (|| {
            wire_pod(&host.netns, &netns, &veth, &ip4, &ip6)?;
            let log = log_path(&self.dir, &format!("pod-{namespace}-{name}"));
            let process = process::spawn(
                &self.lab_exe,
                &format!("echo {namespace}/{name}"),
                Some(&netns),
                &self.lab_exe.display().to_string(),
                &s(&["echo", "--name", name]),
                &log,
            )?;
            Ok(LabPod {
                namespace: namespace.into(),
                name: name.into(),
                node: node.into(),
                netns: netns.clone(),
                host_number,
                ips: ips.clone(),
                process: Some(process),
                kubelet: false,
            })
        })();
        let pod = match result {
            Ok(pod) => pod,
            Err(e) => {
                let _ = run("ip", &["netns", "del", &netns]);
                let _ = ip_in(&host.netns, &["link", "del", &veth]);
                self.forget_pod(&netns)?;
                return Err(e);
            }
        };
        self.record_pod(&pod)?;
        let client = self.client().await?;
        let host_ip = host.interfaces[0].ipv4.to_string();
        cluster::create_pod(&client, namespace, name, node, &host_ip, labels, &ips).await?;
        Ok(pod)
    }

    /// A free pod address on `node` and a pod number, recorded in the lab's state at once (so
    /// concurrent calls never share an address and `down` removes the namespace even if the
    /// pod fails half-way): its namespace, its veth's name on the node, its host number.
    fn reserve_pod(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
    ) -> anyhow::Result<(String, String, u8)> {
        let _guard = STATE_LOCK
            .lock()
            .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
        let mut state = State::load(&self.dir)?.context("the lab is not up")?;
        let used: Vec<u8> = state
            .pods
            .iter()
            .filter(|p| p.node == node)
            .map(|p| p.host_number)
            .collect();
        // The lower half of the node's pod CIDR: kubelet nodes' CNI hands out the upper.
        let host_number = (10..=127)
            .find(|n| !used.contains(n))
            .context("no pod address left on this node")?;
        let n = state.next_pod;
        state.next_pod += 1;
        state.pods.push(LabPod {
            namespace: namespace.into(),
            name: name.into(),
            node: node.into(),
            netns: format!("flb-pod{n}"),
            host_number,
            ips: Vec::new(),
            process: None,
            kubelet: false,
        });
        state.save(&self.dir)?;
        Ok((format!("flb-pod{n}"), format!("pv{n}"), host_number))
    }

    /// Replaces the reserved pod's record with the running pod.
    fn record_pod(&self, pod: &LabPod) -> anyhow::Result<()> {
        let _guard = STATE_LOCK
            .lock()
            .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
        let mut state = State::load(&self.dir)?.context("the lab is not up")?;
        if let Some(p) = state.pods.iter_mut().find(|p| p.netns == pod.netns) {
            *p = pod.clone();
        }
        state.save(&self.dir)?;
        Ok(())
    }

    /// On a kubelet node: a real Pod of the echo image, bound to `node`, once Ready.
    async fn add_kubelet_pod(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        labels: &BTreeMap<String, String>,
    ) -> anyhow::Result<LabPod> {
        let client = self.client().await?;
        let pods: Api<Pod> = Api::namespaced(client, namespace);
        let tag = super::images::layout_tag(&super::images::oci_dir().join("ferrolb-echo"))?;
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {
                "nodeName": node,
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "echo",
                    "image": format!("{}:{tag}", super::images::ECHO_IMAGE),
                    "imagePullPolicy": "Never",
                    "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "ports": [
                        {"name": "http", "containerPort": crate::echo::HTTP_PORT, "protocol": "TCP"},
                        {"name": "udp", "containerPort": crate::echo::UDP_PORT, "protocol": "UDP"},
                    ],
                    "readinessProbe": {"tcpSocket": {"port": crate::echo::HTTP_PORT}, "periodSeconds": 1},
                    "securityContext": {
                        "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                        "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]},
                    },
                }],
            },
        }))?;
        pods.patch(
            name,
            &kube::api::PatchParams::apply("ferrolb-lab").force(),
            &kube::api::Patch::Apply(&pod),
        )
        .await
        .with_context(|| format!("creating Pod {namespace}/{name}"))?;
        let ips = cluster::wait_for(
            &format!("Pod {namespace}/{name} on {node} to be Ready"),
            Duration::from_secs(120),
            || {
                let pods = pods.clone();
                async move {
                    let p = pods.get(name).await.map_err(|e| e.to_string())?;
                    let status = p.status.unwrap_or_default();
                    let ready = status
                        .conditions
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    let ips: Vec<String> = status
                        .pod_ips
                        .unwrap_or_default()
                        .into_iter()
                        .map(|i| i.ip)
                        .collect();
                    if ready && !ips.is_empty() {
                        Ok(Some(ips))
                    } else {
                        Err(format!("phase {:?}, ready {ready}", status.phase))
                    }
                }
            },
        )
        .await?;
        let pod = LabPod {
            namespace: namespace.into(),
            name: name.into(),
            node: node.into(),
            netns: String::new(),
            host_number: 0,
            ips,
            process: None,
            kubelet: true,
        };
        let _guard = STATE_LOCK
            .lock()
            .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
        let mut state = State::load(&self.dir)?.context("the lab is not up")?;
        state.pods.push(pod.clone());
        state.save(&self.dir)?;
        Ok(pod)
    }

    /// Removes a pod: its Pod object, process, namespace and node route.
    pub async fn remove_pod(&self, pod: &LabPod) -> anyhow::Result<()> {
        let client = self.client().await?;
        let pods: Api<Pod> = Api::namespaced(client, &pod.namespace);
        // A kubelet's pod goes once its kubelet has stopped it (its grace period is 1 s); the
        // lab's own pods are stopped here, so their objects can go at once.
        let grace = if pod.kubelet { None } else { Some(0) };
        let _ = pods
            .delete(
                &pod.name,
                &DeleteParams {
                    grace_period_seconds: grace,
                    ..Default::default()
                },
            )
            .await;
        remove_pod_local(pod);
        if pod.kubelet {
            cluster::wait_for(
                &format!("Pod {}/{} to be gone", pod.namespace, pod.name),
                Duration::from_secs(60),
                || {
                    let pods = pods.clone();
                    async move {
                        match pods.get_opt(&pod.name).await {
                            Ok(None) => Ok(Some(())),
                            Ok(Some(_)) => Err("still there".into()),
                            Err(e) => Err(e.to_string()),
                        }
                    }
                },
            )
            .await?;
            let _guard = STATE_LOCK
                .lock()
                .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
            if let Some(mut state) = State::load(&self.dir)? {
                state
                    .pods
                    .retain(|p| !(p.kubelet && p.namespace == pod.namespace && p.name == pod.name));
                state.save(&self.dir)?;
            }
            return Ok(());
        }
        self.forget_pod(&pod.netns)
    }

    fn forget_pod(&self, netns: &str) -> anyhow::Result<()> {
        let _guard = STATE_LOCK
            .lock()
            .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
        if let Some(mut state) = State::load(&self.dir)? {
            state.pods.retain(|p| p.netns != netns);
            state.save(&self.dir)?;
        }
        Ok(())
    }
}

pub(super) fn remove_pod_local(pod: &LabPod) {
    if pod.kubelet {
        // Its kubelet removes it (and `down` every container with its node).
        return;
    }
    if let Some(p) = &pod.process {
        process::stop(p, Duration::from_secs(2));
    }
    // Deleting the namespace deletes the veth pair and with it the node's route.
    let _ = run("ip", &["netns", "del", &pod.netns]);
}

/// Routed pod networking for pod namespace `netns` on the node in `node_netns`: a veth `veth`
/// (`eth0` in the pod) with the pod's addresses; the node answers at 169.254.1.1 / fe80::1 on
/// every pod link, so all pod traffic crosses the node's IP stack (and kube-proxy's conntrack).
fn wire_pod(node_netns: &str, netns: &str, veth: &str, ip4: &str, ip6: &str) -> anyhow::Result<()> {
    ip_in(netns, &["link", "set", "lo", "up"])?;
    sysctl_in(netns, "net.ipv6.conf.all.accept_dad", "0")?;
    sysctl_in(netns, "net.ipv6.conf.default.accept_dad", "0")?;
    run(
        "ip",
        &[
            "link", "add", veth, "netns", node_netns, "type", "veth", "peer", "name", "eth0",
            "netns", netns,
        ],
    )?;
    ip_in(node_netns, &["addr", "add", "169.254.1.1/32", "dev", veth])?;
    ip_in(
        node_netns,
        &["addr", "add", "fe80::1/64", "dev", veth, "nodad"],
    )?;
    ip_in(node_netns, &["link", "set", veth, "up"])?;
    ip_in(
        node_netns,
        &["route", "replace", &format!("{ip4}/32"), "dev", veth],
    )?;
    ip_in(
        node_netns,
        &["-6", "route", "replace", &format!("{ip6}/128"), "dev", veth],
    )?;
    ip_in(netns, &["addr", "add", &format!("{ip4}/32"), "dev", "eth0"])?;
    ip_in(
        netns,
        &["addr", "add", &format!("{ip6}/128"), "dev", "eth0", "nodad"],
    )?;
    ip_in(netns, &["link", "set", "eth0", "up"])?;
    ip_in(
        netns,
        &[
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ],
    )?;
    ip_in(
        netns,
        &[
            "route",
            "add",
            "default",
            "via",
            "169.254.1.1",
            "dev",
            "eth0",
        ],
    )?;
    ip_in(
        netns,
        &[
            "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0",
        ],
    )?;
    Ok(())
}
