//! Differential allocation against MetalLB (issue #16 item 3): MetalLB's controller and ours run
//! side by side in the lab on the same pools, each serving its own `loadBalancerClass`; random
//! but reproducible sequences of operations (pools with CIDRs and ranges, `autoAssign`,
//! `avoidBuggyIPs`, `serviceAllocation`; Services with requested IPs, pool annotations, sharing
//! keys, family policies and ports; deletions and pool edits) are applied to both worlds alike,
//! and after every step each Service's IPs (or its refusal) must be the same in both.
//!
//! Where MetalLB is not deterministic the invariants are compared instead, and only there:
//! - pools with `autoAssign` and no `serviceAllocation` are tried by MetalLB in random order, so
//!   the generator never has two of them at once;
//! - after a pool edit or deletion, Services that must move are re-allocated by MetalLB in its
//!   cache's order (random); for those steps the same Services must hold addresses, each from a
//!   pool of the same name, and the Services whose IPs differ are then deleted in both worlds,
//!   which brings them back in step (counted and printed as "order-dependent").
//!
//! One deliberate difference is recognised and counted: a Service with `allow-shared-ip` that
//! ferrolb gives an IP already held under its key, where MetalLB took a lower free one
//! (docs/metallb-differences.md); it is deleted in both worlds to bring them back in step.
//!
//! A Service refused in both worlds is deleted in the next step (as an operator would), so no
//! refused Service waits for a pool edit to race with others.
//!
//! `FERROLB_DIFF_SEEDS` (default `1,2`) and `FERROLB_DIFF_STEPS` (default 40) set the run; a seed
//! that found a difference goes into [`REGRESSION_SEEDS`].
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ferrolb_e2e::Lab;
use ferrolb_e2e::ferrolb::{self, NAMESPACE};
use ferrolb_e2e::metallb;
use ferrolb_e2e::process::{self, LabProcess};
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::suite::{self, Suite};
use ferrolb_testkit::objects::service;
use ferrolb_testkit::trial::Arguments;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

/// The class MetalLB's controller serves.
const METALLB_CLASS: &str = "lab.ferrolb.io/metallb";
/// The class ferrolb's controller serves.
const FERROLB_CLASS: &str = "lab.ferrolb.io/ferrolb";
/// Seeds beyond the defaults that once found a difference, with the steps that reach it.
const REGRESSION_SEEDS: [(u64, usize); 1] = [
    // Step 56: a PreferDualStack Service took both families from an open pool where MetalLB
    // takes one from a pool whose serviceAllocation admits it.
    (5, 60),
];
/// Pools p0..p2, Services s0..s5.
const POOLS: usize = 3;
const SERVICES: usize = 6;

/// SplitMix64: small, fast, and the same sequence on every machine for a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn percent(&mut self, p: u64) -> bool {
        self.next() % 100 < p
    }
}

/// The address blocks pool `i` may take: a small IPv4 CIDR (with a .0), a range ending in .255,
/// and a small IPv6 CIDR. Small, so pools run out.
fn blocks(i: usize) -> [String; 3] {
    [
        format!("198.18.21{i}.0/30"),
        format!("198.18.21{i}.254-198.18.21{i}.255"),
        format!("fd00:18::d{i}:0/126"),
    ]
}

#[derive(Clone, Debug)]
struct PoolSpec {
    addresses: Vec<String>,
    auto_assign: bool,
    avoid_buggy: bool,
    /// `serviceAllocation`: priority and the `tier` label it selects (if any).
    allocation: Option<(u32, Option<&'static str>)>,
}

impl PoolSpec {
    fn random(rng: &mut Rng, i: usize, others: &BTreeMap<usize, PoolSpec>) -> Self {
        let all = blocks(i);
        let mut addresses: Vec<String> = all.iter().filter(|_| rng.percent(60)).cloned().collect();
        if addresses.is_empty() {
            addresses.push(all[rng.below(3)].clone());
        }
        let allocation = rng.percent(50).then(|| {
            let tier = [None, Some("a"), Some("b")][rng.below(3)];
            // Distinct priorities: MetalLB orders equal ones by chance.
            (i as u32 + 1, tier)
        });
        let mut auto_assign = rng.percent(80);
        // Two auto-assign pools without serviceAllocation: MetalLB tries them in random order.
        if auto_assign
            && allocation.is_none()
            && others
                .iter()
                .any(|(j, p)| *j != i && p.auto_assign && p.allocation.is_none())
        {
            auto_assign = false;
        }
        Self {
            addresses,
            auto_assign,
            avoid_buggy: rng.percent(30),
            allocation,
        }
    }

    fn yaml(&self, i: usize) -> String {
        let list = self
            .addresses
            .iter()
            .map(|a| format!("'{a}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut y = format!(
            "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {{name: p{i}, namespace: {NAMESPACE}}}\nspec:\n  addresses: [{list}]\n  autoAssign: {}\n  avoidBuggyIPs: {}\n",
            self.auto_assign, self.avoid_buggy
        );
        if let Some((priority, tier)) = self.allocation {
            y += &format!(
                "  serviceAllocation:\n    priority: {priority}\n    namespaces: [diff]\n"
            );
            if let Some(t) = tier {
                y += &format!("    serviceSelectors:\n    - matchLabels: {{tier: {t}}}\n");
            }
        }
        y
    }
}

#[derive(Clone, Debug)]
struct ServiceSpec {
    families: &'static str,
    port: (u16, &'static str),
    tier: &'static str,
    pool: Option<usize>,
    requested: Option<String>,
    sharing: Option<&'static str>,
}

impl ServiceSpec {
    fn random(rng: &mut Rng) -> Self {
        let families = ["v4", "v4", "v6", "prefer", "require"][rng.below(5)];
        let port = [(80, "TCP"), (443, "TCP"), (53, "UDP")][rng.below(3)];
        let requested = rng.percent(15).then(|| {
            let i = rng.below(POOLS + 1);
            if i == POOLS {
                // In no pool.
                "198.18.219.1".to_string()
            } else {
                let v6 = families == "v6";
                if v6 {
                    format!("fd00:18::d{i}:{}", rng.below(4))
                } else {
                    format!("198.18.21{i}.{}", [1, 2, 3, 254, 255][rng.below(5)])
                }
            }
        });
        Self {
            families,
            port,
            tier: ["a", "b"][rng.below(2)],
            pool: rng.percent(25).then(|| rng.below(POOLS)),
            requested,
            sharing: rng.percent(30).then_some("k"),
        }
    }

    fn service(&self, name: &str, class: &str) -> Service {
        let pool = self.pool.map(|p| format!("p{p}"));
        let annotations = [
            ("metallb.io/address-pool", pool.as_deref()),
            ("metallb.io/loadBalancerIPs", self.requested.as_deref()),
            ("metallb.io/allow-shared-ip", self.sharing),
        ];
        let (policy, families) = match self.families {
            "v4" => ("SingleStack", vec!["IPv4"]),
            "v6" => ("SingleStack", vec!["IPv6"]),
            "prefer" => ("PreferDualStack", vec!["IPv4", "IPv6"]),
            _ => ("RequireDualStack", vec!["IPv4", "IPv6"]),
        };
        service(name)
            .label("tier", self.tier)
            // Present even when empty, as before.
            .annotations(annotations.into_iter().filter_map(|(k, v)| Some((k, v?))))
            .load_balancer_class(class)
            .ip_family_policy(policy)
            .ip_families(&families)
            .port(i32::from(self.port.0), self.port.1)
            .build()
    }
}

#[derive(Clone, Debug)]
enum Op {
    CreateService(usize, ServiceSpec),
    DeleteService(usize),
    UpsertPool(usize, PoolSpec),
    DeletePool(usize),
}

/// What one world shows for a Service: its IPs and the pool it says they came from.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Held {
    ips: BTreeSet<String>,
    pool: Option<String>,
}

type Snapshot = BTreeMap<usize, Held>;

/// Both worlds' Services in namespace `diff`, by Service number.
async fn snapshot(api: &Api<Service>) -> anyhow::Result<(Snapshot, Snapshot)> {
    let mut metallb = Snapshot::new();
    let mut ours = Snapshot::new();
    for svc in api.list(&ListParams::default()).await? {
        let name = svc.metadata.name.clone().unwrap_or_default();
        let (world, n) = if let Some(n) = name.strip_prefix("mlb-s") {
            (&mut metallb, n)
        } else if let Some(n) = name.strip_prefix("flb-s") {
            (&mut ours, n)
        } else {
            continue;
        };
        let ips = ferrolb_e2e::service::ingress_ips(&svc)
            .into_iter()
            .collect();
        let pool = svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("metallb.io/ip-allocated-from-pool").cloned());
        world.insert(n.parse()?, Held { ips, pool });
    }
    Ok((metallb, ours))
}

/// Waits until both worlds have been still for a second (both controllers act within
/// milliseconds; the wait is for the last write to show).
async fn settle(api: &Api<Service>) -> anyhow::Result<(Snapshot, Snapshot)> {
    tokio::time::sleep(Duration::from_millis(400)).await;
    let start = Instant::now();
    let mut last = snapshot(api).await?;
    let mut still = 0;
    while still < 4 {
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the Services never settled: {last:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = snapshot(api).await?;
        if now == last {
            still += 1;
        } else {
            still = 0;
            last = now;
        }
    }
    Ok(last)
}

/// The run's model: what exists, so the generator only makes sensible operations.
#[derive(Default)]
struct Model {
    pools: BTreeMap<usize, PoolSpec>,
    services: BTreeMap<usize, ServiceSpec>,
}

impl Model {
    fn next_op(&mut self, rng: &mut Rng) -> Op {
        loop {
            let roll = rng.below(100);
            let op = if roll < 45 {
                let free: Vec<usize> = (0..SERVICES)
                    .filter(|i| !self.services.contains_key(i))
                    .collect();
                if free.is_empty() {
                    continue;
                }
                Op::CreateService(free[rng.below(free.len())], ServiceSpec::random(rng))
            } else if roll < 65 {
                let held: Vec<usize> = self.services.keys().copied().collect();
                if held.is_empty() {
                    continue;
                }
                Op::DeleteService(held[rng.below(held.len())])
            } else if roll < 92 {
                let i = rng.below(POOLS);
                Op::UpsertPool(i, PoolSpec::random(rng, i, &self.pools))
            } else {
                let held: Vec<usize> = self.pools.keys().copied().collect();
                if held.len() < 2 {
                    continue;
                }
                Op::DeletePool(held[rng.below(held.len())])
            };
            return op;
        }
    }
}

/// MetalLB's controller and ours, each on its own class.
#[derive(Clone)]
struct Controllers {
    lab: Lab,
    metallb: LabProcess,
    ours: LabProcess,
}

impl suite::Fixture for Controllers {
    fn teardown(&self) {
        process::stop(&self.metallb, Duration::from_secs(5));
        process::stop(&self.ours, Duration::from_secs(5));
    }
}

fn start(lab: &Lab) -> anyhow::Result<Controllers> {
    let metallb = metallb::start_controller_only(lab, &["--lb-class", METALLB_CLASS])?;
    let kubeconfig = ferrolb::install(lab)?;
    let ours = ferrolb::start_controller_with(
        lab,
        &kubeconfig,
        "diff",
        7473,
        &["--lb-class", FERROLB_CLASS],
    )
    .inspect_err(|_| process::stop(&metallb, Duration::from_secs(5)))?;
    Ok(Controllers {
        lab: lab.clone(),
        metallb,
        ours,
    })
}

/// Applies `op` to both worlds.
async fn apply(lab: &Lab, api: &Api<Service>, op: &Op) -> anyhow::Result<()> {
    match op {
        Op::CreateService(n, spec) => {
            api.create(
                &PostParams::default(),
                &spec.service(&format!("mlb-s{n}"), METALLB_CLASS),
            )
            .await?;
            api.create(
                &PostParams::default(),
                &spec.service(&format!("flb-s{n}"), FERROLB_CLASS),
            )
            .await?;
        }
        Op::DeleteService(n) => delete_service(api, *n).await?,
        Op::UpsertPool(i, spec) => lab.apply(&spec.yaml(*i))?,
        Op::DeletePool(i) => {
            lab.kubectl(&["delete", "ipaddresspool", "-n", NAMESPACE, &format!("p{i}")])?;
        }
    }
    Ok(())
}

async fn delete_service(api: &Api<Service>, n: usize) -> anyhow::Result<()> {
    for name in [format!("mlb-s{n}"), format!("flb-s{n}")] {
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(e) => return Err(e.into()),
        }
        // Gone before the number is used again.
        ferrolb_e2e::cluster::wait_for(
            &format!("Service {name} to be gone"),
            Duration::from_secs(30),
            || async {
                match api.get_opt(&name).await {
                    Ok(None) => Ok(Some(())),
                    other => Err(format!("{:?}", other.map(|s| s.is_some()))),
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// One seeded run of `steps` operations; the first difference fails it with the whole history.
async fn run_seed(
    lab: &Lab,
    api: &Api<Service>,
    seed: u64,
    steps: usize,
) -> anyhow::Result<(usize, usize)> {
    let mut rng = Rng(seed);
    let mut model = Model::default();
    let mut history = Vec::new();
    let mut order_dependent = 0;
    let mut documented = 0;
    // Start with one plain pool.
    let first = PoolSpec {
        addresses: blocks(0).to_vec(),
        auto_assign: true,
        avoid_buggy: false,
        allocation: None,
    };
    let mut pending = vec![Op::UpsertPool(0, first)];
    for step in 0..steps {
        let op = if pending.is_empty() {
            model.next_op(&mut rng)
        } else {
            pending.remove(0)
        };
        history.push(format!("{step}: {op:?}"));
        apply(lab, api, &op).await?;
        match &op {
            Op::CreateService(n, s) => {
                model.services.insert(*n, s.clone());
            }
            Op::DeleteService(n) => {
                model.services.remove(n);
            }
            Op::UpsertPool(i, p) => {
                model.pools.insert(*i, p.clone());
            }
            Op::DeletePool(i) => {
                model.pools.remove(i);
            }
        }
        let (theirs, ours) = settle(api).await?;
        let differ: Vec<usize> = model
            .services
            .keys()
            .copied()
            .filter(|n| theirs.get(n).map(|h| &h.ips) != ours.get(n).map(|h| &h.ips))
            .collect();
        if !differ.is_empty() {
            let pool_step = matches!(op, Op::UpsertPool(..) | Op::DeletePool(..));
            let same_holders = differ.iter().all(|n| {
                let (t, o) = (theirs.get(n), ours.get(n));
                t.map(|h| (h.ips.is_empty(), &h.pool)) == o.map(|h| (h.ips.is_empty(), &h.pool))
            });
            // docs/metallb-differences.md: with `allow-shared-ip`, ferrolb first shares an IP
            // already held under the key, MetalLB takes the lowest free or shareable one.
            let shared_first = match &op {
                Op::CreateService(n, spec) => {
                    spec.sharing.is_some()
                        && differ == [*n]
                        && ours.get(n).is_some_and(|h| {
                            !h.ips.is_empty()
                                && h.ips.iter().all(|ip| {
                                    ours.iter().any(|(m, o)| m != n && o.ips.contains(ip))
                                })
                        })
                }
                _ => false,
            };
            if shared_first {
                documented += 1;
                delete_service(api, differ[0]).await?;
                model.services.remove(&differ[0]);
                history.push(format!("   shared first (documented), deleted {differ:?}"));
                continue;
            }
            if !(pool_step && same_holders) {
                bail!(
                    "seed {seed}, step {step}: Services {differ:?} differ\nMetalLB: {theirs:?}\nferrolb: {ours:?}\nhistory:\n{}",
                    history.join("\n")
                );
            }
            // MetalLB re-allocated the moved Services in its cache's order: bring both worlds
            // back in step.
            order_dependent += 1;
            for n in &differ {
                delete_service(api, *n).await?;
                model.services.remove(n);
            }
            history.push(format!("   order-dependent, deleted {differ:?}"));
            continue;
        }
        // Refused in both: the operator deletes it.
        let refused: Vec<usize> = model
            .services
            .keys()
            .copied()
            .filter(|n| ours.get(n).is_none_or(|h| h.ips.is_empty()))
            .collect();
        for n in refused {
            if !pending
                .iter()
                .any(|op| matches!(op, Op::DeleteService(m) if *m == n))
            {
                pending.push(Op::DeleteService(n));
            }
        }
    }
    // The next seed starts empty.
    for n in model.services.keys() {
        delete_service(api, *n).await?;
    }
    for i in 0..POOLS {
        lab.kubectl(&[
            "delete",
            "ipaddresspool",
            "-n",
            NAMESPACE,
            &format!("p{i}"),
            "--ignore-not-found",
        ])?;
    }
    Ok((order_dependent, documented))
}

/// The seeds and their step counts: `FERROLB_DIFF_SEEDS` (default 1 and 2, which found the
/// first differences) with `steps` each, then the regression seeds.
fn seeds(steps: usize) -> Vec<(u64, usize)> {
    let mut seeds: Vec<(u64, usize)> = std::env::var("FERROLB_DIFF_SEEDS")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2])
        .into_iter()
        .map(|seed| (seed, steps))
        .collect();
    for &(seed, steps) in &REGRESSION_SEEDS {
        if !seeds.iter().any(|&(s, _)| s == seed) {
            seeds.push((seed, steps));
        }
    }
    seeds
}

async fn allocation_matches_metallb(ctx: Controllers) -> anyhow::Result<()> {
    let steps: usize = std::env::var("FERROLB_DIFF_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    // One namespace for every seed (pools select it by name); each seed leaves it empty.
    let scope = TestScope::new(&ctx.lab, "diff").await?;
    let api: Api<Service> = Api::namespaced(ctx.lab.client().await?, &scope.namespace);
    for (seed, steps) in seeds(steps) {
        let started = Instant::now();
        let (order_dependent, documented) = run_seed(&ctx.lab, &api, seed, steps)
            .await
            .with_context(|| format!("seed {seed}"))?;
        println!(
            "seed {seed}: {steps} steps alike in {:.0} s ({order_dependent} order-dependent pool steps, {documented} documented differences)",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let conclusion = Suite::new("differential")
        .test("allocation_matches_metallb", |c| {
            Box::pin(allocation_matches_metallb(c))
        })
        .run(&args, |lab| Box::pin(async move { start(&lab) }));
    suite::exit_code(&[conclusion])
}
