//! `ferrolb status` on clusters of 100 to 5,000 LoadBalancer Services: the whole report, every
//! Service explained. With one allocator replay shared by all Services the time per Service
//! stays flat; one replay per Service (before) made it grow with the number of Services.
//!
//! Run: `cargo bench -p ferrolb-explain --bench status -- --warm-up-time 1 --measurement-time 3`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use ferrolb_config::model::{Config, L2Advertisement};
use ferrolb_explain::live::LiveSpeaker;
use ferrolb_explain::service::Snapshot;
use ferrolb_explain::speaker_report::{Layer2Report, Layer2Service, SCHEMA, SpeakerReport};
use ferrolb_explain::status::status;
use ferrolb_testkit::model::pool;
use ferrolb_testkit::objects::service;
use k8s_openapi::api::core::v1::ServicePort;

/// `n` Services in pool `big` (a /16), each holding one address, covered by one L2Advertisement,
/// and three speakers whose live reports list every one of them (as they do).
fn snapshot(n: usize) -> Snapshot {
    let mut config = Config::default();
    config
        .pools
        .insert("big".into(), pool("big", &["198.18.0.0/16"]));
    config.l2_advertisements.insert(
        "l2".into(),
        L2Advertisement {
            name: "l2".into(),
            ..Default::default()
        },
    );
    let services = (0..n)
        .map(|i| {
            service(&format!("svc{i}"))
                .namespace("ns")
                .add_port(ServicePort {
                    port: 80,
                    ..Default::default()
                })
                .ingress(&[&format!("198.18.{}.{}", i / 256, i % 256)])
                .build()
        })
        .collect();
    let nodes = ["node1", "node2", "node3"];
    let speakers = nodes
        .iter()
        .map(|node| LiveSpeaker {
            node: node.to_string(),
            live: true,
            error: None,
            report: Some(SpeakerReport {
                schema: SCHEMA.into(),
                node: node.to_string(),
                planned: true,
                layer2: Layer2Report {
                    quorum: true,
                    services: (0..n)
                        .map(|i| Layer2Service {
                            service: format!("ns/svc{i}"),
                            owner: Some(nodes[i % 3].to_string()),
                            takeover: nodes.iter().map(|n| n.to_string()).collect(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                },
                ..Default::default()
            }),
        })
        .collect();
    Snapshot {
        namespace: "metallb-system".into(),
        config,
        services,
        speakers,
        ..Default::default()
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("status");
    for n in [100usize, 1_000, 5_000] {
        let s = snapshot(n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &s, |b, s| {
            b.iter(|| black_box(status(s)))
        });
    }
    group.finish();
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(10)
        .configure_from_args();
    bench(&mut c);
    c.final_summary();
}
