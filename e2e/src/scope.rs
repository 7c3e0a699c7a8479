//! A test's own corner of the lab: a Kubernetes namespace, its pods and its processes, all
//! removed when the scope is dropped, also when the test fails.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use crate::cluster::wait_for;
use crate::lab::{Lab, LabPod};
use crate::process::{self, LabProcess};

/// Resources of one test.
pub struct TestScope {
    /// The lab.
    pub lab: Lab,
    /// The test's Kubernetes namespace.
    pub namespace: String,
    pods: Vec<LabPod>,
    processes: Vec<LabProcess>,
}

impl TestScope {
    /// Creates the namespace `name` (deleted with the scope).
    pub async fn new(lab: &Lab, name: &str) -> anyhow::Result<Self> {
        let client = lab.client().await?;
        let namespaces: Api<Namespace> = Api::all(client);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match namespaces.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e).context(format!("creating namespace {name}")),
        }
        Ok(Self {
            lab: lab.clone(),
            namespace: name.into(),
            pods: Vec::new(),
            processes: Vec::new(),
        })
    }

    /// Starts pods labelled `app=<app>`, one on each of `nodes` (a Deployment's worth).
    pub async fn deploy(&mut self, app: &str, nodes: &[&str]) -> anyhow::Result<Vec<LabPod>> {
        let labels = BTreeMap::from([("app".to_string(), app.to_string())]);
        let mut made = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let pod = self
                .lab
                .add_pod(&self.namespace, &format!("{app}-{i}"), node, &labels)
                .await?;
            self.pods.push(pod.clone());
            made.push(pod);
        }
        Ok(made)
    }

    /// Starts a process in a host for the length of the test.
    pub fn spawn(
        &mut self,
        name: &str,
        host: &str,
        program: &Path,
        args: &[String],
    ) -> anyhow::Result<LabProcess> {
        let netns = self.lab.netns_of(host)?;
        let log = self
            .lab
            .dir
            .join("logs")
            .join(format!("{}-{name}.log", self.namespace));
        let p = process::spawn(
            &self.lab.lab_exe,
            name,
            Some(&netns),
            &program.display().to_string(),
            args,
            &log,
        )?;
        self.processes.push(p.clone());
        Ok(p)
    }

    /// Waits until the Service's EndpointSlices list `count` ready endpoints (per family).
    pub async fn wait_ready_endpoints(&self, service: &str, count: usize) -> anyhow::Result<()> {
        let client = self.lab.client().await?;
        let slices: Api<EndpointSlice> = Api::namespaced(client, &self.namespace);
        let selector = format!("kubernetes.io/service-name={service}");
        wait_for(
            &format!(
                "{count} ready endpoints of Service {}/{service}",
                self.namespace
            ),
            Duration::from_secs(60),
            || {
                let slices = slices.clone();
                let selector = selector.clone();
                async move {
                    let list = slices
                        .list(&ListParams::default().labels(&selector))
                        .await
                        .map_err(|e| e.to_string())?;
                    let mut per_family: BTreeMap<String, usize> = BTreeMap::new();
                    for slice in &list.items {
                        let ready = slice
                            .endpoints
                            .iter()
                            .filter(|e| {
                                e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false)
                            })
                            .count();
                        *per_family.entry(slice.address_type.clone()).or_default() += ready;
                    }
                    if !per_family.is_empty() && per_family.values().all(|n| *n >= count) {
                        Ok(Some(()))
                    } else {
                        Err(format!("ready endpoints per family: {per_family:?}"))
                    }
                }
            },
        )
        .await
    }
}

impl Drop for TestScope {
    fn drop(&mut self) {
        for p in &self.processes {
            process::stop(p, Duration::from_secs(3));
        }
        let lab = self.lab.clone();
        let pods = std::mem::take(&mut self.pods);
        let namespace = self.namespace.clone();
        // Drop runs outside any runtime (tests block_on inside their scope's lifetime).
        let cleanup = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                for pod in &pods {
                    if let Err(e) = lab.remove_pod(pod).await {
                        eprintln!("cleanup: removing pod {}: {e:#}", pod.name);
                    }
                }
                if let Ok(client) = lab.client().await {
                    let namespaces: Api<Namespace> = Api::all(client);
                    let _ = namespaces
                        .delete(&namespace, &DeleteParams::default())
                        .await;
                }
            });
        });
        let _ = cleanup.join();
    }
}
