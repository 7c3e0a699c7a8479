//! Leader election through a `coordination.k8s.io/v1` Lease.
//!
//! Safety does not depend on synchronised clocks: a contender measures the holder's silence on
//! its own monotonic clock, from the moment it *observed* the last renewal, and only takes over
//! after a whole lease duration of silence. The holder considers itself leader only until
//! `start of its last successful renewal + renew deadline`, and the renew deadline is shorter
//! than the lease duration, so a leader that cannot renew stops writing before anyone else can
//! win the Lease. See docs/decisions/0007-leader-election.md.

use std::time::{Duration, Instant};

use ferrolb_runtime::owner::OwnerCell;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PatchParams, PostParams};
use tokio::sync::watch;

/// Lease timings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a Lease holds without renewal, as contenders measure it.
    pub lease_duration: Duration,
    /// How long the holder keeps acting after its last successful renewal began.
    pub renew_deadline: Duration,
    /// How often to try to renew or acquire.
    pub retry_period: Duration,
}

impl Timing {
    /// Checks the timings can give the no-two-writers guarantee.
    pub fn validate(&self) -> Result<(), String> {
        if self.renew_deadline >= self.lease_duration {
            return Err(format!(
                "the renew deadline ({:?}) must be shorter than the lease duration ({:?})",
                self.renew_deadline, self.lease_duration
            ));
        }
        if self.retry_period.saturating_mul(2) > self.renew_deadline {
            return Err(format!(
                "the retry period ({:?}) must be at most half the renew deadline ({:?}), so one failed renewal does not cost the lease",
                self.retry_period, self.renew_deadline
            ));
        }
        Ok(())
    }

    /// How long a leader waits after a successful renewal before it renews again: a third of
    /// the lease duration (kubelet renews its node Lease at a quarter), so a quiet cluster
    /// costs a few Lease writes a minute rather than one every retry period. At most half the
    /// renew deadline, so that a failed renewal is retried every retry period before the
    /// deadline ends the grant, and at least one retry period.
    pub fn renew_every(&self) -> Duration {
        (self.lease_duration / 3)
            .min(self.renew_deadline / 2)
            .max(self.retry_period)
    }
}

/// What a Lease says, as far as election goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseView {
    /// Holder identity; `None` or empty when released.
    pub holder: Option<String>,
    /// The renew time as written (opaque: only compared for change, never against our clock).
    pub renew_marker: Option<String>,
    /// The holder's lease duration.
    pub duration: Option<Duration>,
}

impl LeaseView {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            renew_marker: spec.renew_time.map(|t| t.0.to_string()),
            duration: spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs),
        }
    }
}

/// The next thing to do with the Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// No Lease exists: create it with us as holder.
    Create,
    /// We hold it: renew.
    Renew,
    /// It is free or its holder has been silent a whole lease duration: take it.
    Takeover,
    /// Someone else holds it.
    Wait,
}

/// The election's pure state: what we last observed and until when we may lead.
#[derive(Debug)]
pub struct Elector {
    identity: String,
    timing: Timing,
    observed: Option<(LeaseView, Instant)>,
    /// Since when the Lease has been missing, as we saw it.
    missing_since: Option<Instant>,
    /// Whether we have ever seen the Lease held (by anyone, ourselves included).
    seen_held: bool,
    leading_until: Option<Instant>,
    /// When the last successful renewal began, while leading.
    renewed_at: Option<Instant>,
}

impl Elector {
    /// A new elector for this identity.
    pub fn new(identity: impl Into<String>, timing: Timing) -> Self {
        Self {
            identity: identity.into(),
            timing,
            observed: None,
            missing_since: None,
            seen_held: false,
            leading_until: None,
            renewed_at: None,
        }
    }

    /// Whether the Lease is to be read and written at `now`: always, unless this replica
    /// leads and renewed less than [`Timing::renew_every`] ago. Nobody else can take the Lease
    /// meanwhile (that needs a whole lease duration of silence), and a renewal that fails is
    /// retried at the next retry period.
    pub fn due(&self, now: Instant) -> bool {
        !self.is_leading(now)
            || self
                .renewed_at
                .is_none_or(|at| now.saturating_duration_since(at) >= self.timing.renew_every())
    }

    /// Decides the next step from what the Lease says now.
    pub fn decide(&mut self, lease: Option<&LeaseView>, now: Instant) -> Step {
        let Some(view) = lease else {
            // A Lease that vanished after we saw it held (deleted by hand, or by the garbage
            // collector with its owner) may still have a leader acting on a renewal made
            // before the deletion, which we may not have seen: create it only a whole lease
            // duration after we first saw it missing, as for a takeover. At once while we
            // lead (nobody else can), or when we never saw it held (start-up).
            let missing_since = *self.missing_since.get_or_insert(now);
            let duration = match &self.observed {
                Some((seen, _)) => self.duration_of(seen),
                None => self.timing.lease_duration,
            };
            if self.seen_held
                && !self.is_leading(now)
                && now.saturating_duration_since(missing_since) < duration
            {
                return Step::Wait;
            }
            return Step::Create;
        };
        self.missing_since = None;
        self.seen_held |= view.holder.is_some();
        if view.holder.as_deref() == Some(self.identity.as_str()) {
            return Step::Renew;
        }
        if self.observed.as_ref().is_none_or(|(seen, _)| seen != view) {
            self.observed = Some((view.clone(), now));
        }
        let Some(_holder) = &view.holder else {
            return Step::Takeover;
        };
        let since = self
            .observed
            .as_ref()
            .map(|(_, at)| now.saturating_duration_since(*at))
            .unwrap_or_default();
        if since >= self.duration_of(view) {
            Step::Takeover
        } else {
            Step::Wait
        }
    }

    /// How long a holder's renewal counts: what it wrote, never less than our own duration.
    fn duration_of(&self, view: &LeaseView) -> Duration {
        view.duration
            .unwrap_or(self.timing.lease_duration)
            .max(self.timing.lease_duration)
    }

    /// Records a successful create, renew or takeover whose request started at `started`.
    pub fn succeeded(&mut self, started: Instant) -> Instant {
        let until = started + self.timing.renew_deadline;
        self.leading_until = Some(until);
        self.renewed_at = Some(started);
        until
    }

    /// Gives up leadership at once (lost a race, or shutting down).
    pub fn resign(&mut self) {
        self.leading_until = None;
        self.renewed_at = None;
    }

    /// Whether we may act as leader at `now`.
    pub fn is_leading(&self, now: Instant) -> bool {
        self.leading_until.is_some_and(|until| now < until)
    }
}

/// A grant of leadership: until when, and in which term.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Grant {
    until: Instant,
    /// Counts the times this replica took the Lease (created it or took it over). Renewing,
    /// also after the deadline lapsed, keeps the term: while the Lease named this replica all
    /// along, no other replica can have written.
    term: u64,
}

/// Leadership as the rest of the controller sees it: a deadline, checked before every write.
#[derive(Clone, Debug)]
pub struct Leadership {
    rx: watch::Receiver<Option<Grant>>,
}

impl Leadership {
    /// Whether this replica may write now.
    pub fn is_leading(&self) -> bool {
        self.term().is_some()
    }

    /// The current term, if this replica may write now. A new term means another replica may
    /// have led since the last one: what this replica knows must be rebuilt from the caches.
    pub fn term(&self) -> Option<u64> {
        self.rx
            .borrow()
            .filter(|g| Instant::now() < g.until)
            .map(|g| g.term)
    }

    /// The current term and the instant until which this replica may write in it: a write
    /// started in the term must have finished or been abandoned by then, so that none can land
    /// after another replica could have taken the Lease.
    pub fn grant(&self) -> Option<(u64, Instant)> {
        self.rx
            .borrow()
            .filter(|g| Instant::now() < g.until)
            .map(|g| (g.term, g.until))
    }

    /// Waits until leadership may have changed (a renewal, a loss, or the deadline passing).
    pub async fn changed(&mut self) {
        let deadline = self.rx.borrow().map(|g| g.until);
        match deadline {
            Some(until) if Instant::now() < until => {
                tokio::select! {
                    _ = self.rx.changed() => {}
                    _ = tokio::time::sleep_until(until.into()) => {}
                }
            }
            _ => {
                let _ = self.rx.changed().await;
            }
        }
    }

    /// A leadership that always leads (for a single replica started with election off).
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(Some(Grant {
            until: Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600),
            term: 1,
        }));
        std::mem::forget(tx);
        Self { rx }
    }
}

/// Runs the election until `shutdown` resolves, then releases the Lease if we hold it.
pub fn spawn(
    lease: LeaseRef,
    identity: String,
    timing: Timing,
    shutdown: tokio::sync::watch::Receiver<bool>,
    pulse: ferrolb_runtime::health::Pulse,
) -> (Leadership, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(None);
    let handle = tokio::spawn(run(lease, identity, timing, tx, shutdown, pulse));
    (Leadership { rx }, handle)
}

/// The Lease to elect through.
pub struct LeaseRef {
    /// Leases in the controller's namespace.
    pub api: Api<Lease>,
    /// The Lease's name.
    pub name: String,
    /// Its owner (the controller's ServiceAccount), once known: set by a patch of its own
    /// after this replica has won or renewed the Lease, never in the election's writes, so
    /// that a refused owner (OwnerReferencesPermissionEnforcement without `delete`) can never
    /// stop the election.
    pub owner: OwnerCell,
}

/// The Lease as this replica writes it whole; `owners` are the ones it had (kept as they are).
fn lease_object(
    name: &str,
    owners: Option<Vec<OwnerReference>>,
    identity: Option<&str>,
    timing: &Timing,
    transitions: i32,
    resource_version: Option<String>,
) -> Lease {
    let now = MicroTime(Timestamp::now());
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            owner_references: owners,
            resource_version,
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: identity.map(str::to_string),
            lease_duration_seconds: Some(lease_seconds(timing)),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..Default::default()
        }),
    }
}

/// The lease duration as the Lease states it: whole seconds, at least one.
fn lease_seconds(timing: &Timing) -> i32 {
    i32::try_from(timing.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// The election's loop: reads the Lease every retry period, lets the [`Elector`] decide and
/// carries the step out, publishing each grant on `tx`; on shutdown, releases the Lease.
async fn run(
    lease: LeaseRef,
    identity: String,
    timing: Timing,
    tx: watch::Sender<Option<Grant>>,
    mut shutdown: watch::Receiver<bool>,
    pulse: ferrolb_runtime::health::Pulse,
) {
    let mut elector = Elector::new(identity.clone(), timing);
    let mut campaign = Campaign {
        lease,
        identity,
        timing,
        owner_done: None,
        owner_refused_logged: false,
    };
    let name = campaign.lease.name.clone();
    let mut term = 0u64;
    let mut ticker = tokio::time::interval(timing.retry_period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => break,
        }
        let started = Instant::now();
        // A work loop that is stuck or gone must not keep the Lease: stop renewing (and
        // writing); the Lease lapses and a standby takes over. Checked every retry period,
        // also between renewals.
        if let Err(why) = pulse.check_at(started) {
            if elector.is_leading(started) {
                tracing::error!(lease = %name, "{why}: giving up leadership");
            }
            elector.resign();
            let _ = tx.send(None);
            continue;
        }
        if !elector.due(started) {
            continue;
        }
        let current = match campaign.lease.api.get_opt(&name).await {
            Ok(lease) => lease,
            Err(e) => {
                tracing::warn!(error = %e, lease = %name, "reading the leader Lease failed");
                continue;
            }
        };
        let view = current.as_ref().map(LeaseView::of);
        let step = elector.decide(view.as_ref(), started);
        if step == Step::Wait {
            if elector.is_leading(started) {
                tracing::warn!(lease = %name, holder = ?view.and_then(|v| v.holder), "another replica holds the Lease: stepping down");
            }
            elector.resign();
            let _ = tx.send(None);
            continue;
        }
        let Some(result) = campaign.write(step, current.as_ref()).await else {
            continue;
        };
        match result {
            Ok(()) => {
                let was_leading = elector.is_leading(Instant::now());
                let until = elector.succeeded(started);
                if step != Step::Renew {
                    term += 1;
                }
                if !was_leading {
                    tracing::info!(lease = %name, identity = %campaign.identity, term, "became leader");
                }
                let _ = tx.send(Some(Grant { until, term }));
                campaign.set_owner(term, current.as_ref()).await;
            }
            // A conflict means someone else wrote the Lease first; the deadline of our last
            // success still bounds how long we act.
            Err(e) => tracing::warn!(error = %e, lease = %name, ?step, "Lease update failed"),
        }
    }
    // Release: stop acting first, then hand the Lease over so a standby takes it at once.
    let held = elector.is_leading(Instant::now());
    elector.resign();
    let _ = tx.send(None);
    if held {
        campaign.release().await;
    }
}

/// This replica's writes of the Lease, and what it did about the Lease's owner.
struct Campaign {
    lease: LeaseRef,
    identity: String,
    timing: Timing,
    /// The term and owner for which this replica set the owner or was refused.
    owner_done: Option<(u64, String)>,
    /// Whether a refusal of the owner was already logged.
    owner_refused_logged: bool,
}

impl Campaign {
    /// Writes the Lease for `step` (create, renew or take over) from `current`; `None` when
    /// there is nothing to write (waiting, or the Lease to renew or take is gone).
    async fn write(&self, step: Step, current: Option<&Lease>) -> Option<kube::Result<()>> {
        let LeaseRef { api, name, .. } = &self.lease;
        let written = match (step, current) {
            (Step::Wait, _) | (Step::Renew | Step::Takeover, None) => return None,
            (Step::Create, _) => {
                let object = lease_object(name, None, Some(&self.identity), &self.timing, 0, None);
                api.create(&PostParams::default(), &object).await
            }
            (Step::Renew, Some(lease)) => {
                let mut renewed = lease.clone();
                if let Some(spec) = renewed.spec.as_mut() {
                    spec.renew_time = Some(MicroTime(Timestamp::now()));
                    spec.lease_duration_seconds = Some(lease_seconds(&self.timing));
                }
                api.replace(name, &PostParams::default(), &renewed).await
            }
            (Step::Takeover, Some(lease)) => {
                let transitions = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.lease_transitions)
                    .unwrap_or(0)
                    + 1;
                let object = lease_object(
                    name,
                    lease.metadata.owner_references.clone(),
                    Some(&self.identity),
                    &self.timing,
                    transitions,
                    lease.metadata.resource_version.clone(),
                );
                api.replace(name, &PostParams::default(), &object).await
            }
        };
        Some(written.map(|_| ()))
    }

    /// Sets our owner on the Lease (as `current` had it before our write), once per term, in a
    /// write of its own.
    async fn set_owner(&mut self, term: u64, current: Option<&Lease>) {
        let LeaseRef { api, name, owner } = &self.lease;
        let owners = current.and_then(|l| l.metadata.owner_references.as_deref());
        let Some(owner) = owner.get() else {
            return;
        };
        if owner.is_sole_owner_in(owners)
            || self.owner_done.as_ref() == Some(&(term, owner.reference().uid))
        {
            return;
        }
        // Bounded: the next renewal must not wait on it.
        let patched = tokio::time::timeout(
            self.timing.retry_period,
            api.patch(name, &PatchParams::default(), &owner.merge_patch()),
        )
        .await;
        match patched {
            Ok(Ok(_)) => {
                self.owner_done = Some((term, owner.reference().uid));
                tracing::debug!(lease = %name, "the Lease names its owner");
            }
            Ok(Err(kube::Error::Api(e))) if e.code == 403 => {
                self.owner_done = Some((term, owner.reference().uid));
                if !self.owner_refused_logged {
                    self.owner_refused_logged = true;
                    tracing::warn!(lease = %name, error = %e, "setting the Lease's owner was refused: it stays after uninstall (needs patch and delete on it)");
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(lease = %name, error = %e, "setting the Lease's owner failed; trying again")
            }
            Err(_) => {
                tracing::debug!(lease = %name, "setting the Lease's owner timed out; trying again")
            }
        }
    }

    /// Hands the Lease over if it still names this replica: no holder and a one-second
    /// duration, so that a standby takes it at once.
    async fn release(&self) {
        let LeaseRef { api, name, .. } = &self.lease;
        let Ok(Some(lease)) = api.get_opt(name).await else {
            return;
        };
        if lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            != Some(self.identity.as_str())
        {
            return;
        }
        let transitions = lease
            .spec
            .as_ref()
            .and_then(|s| s.lease_transitions)
            .unwrap_or(0);
        let mut released = lease_object(
            name,
            lease.metadata.owner_references.clone(),
            None,
            &self.timing,
            transitions,
            lease.metadata.resource_version.clone(),
        );
        if let Some(spec) = released.spec.as_mut() {
            spec.lease_duration_seconds = Some(1);
        }
        match api.replace(name, &PostParams::default(), &released).await {
            Ok(_) => tracing::info!(lease = %name, "released the Lease"),
            Err(e) => tracing::warn!(error = %e, lease = %name, "releasing the Lease failed"),
        }
    }
}

/// The controller's Events (the runtime's queue) are written only while this replica leads.
impl ferrolb_runtime::events::WriteGate for Leadership {
    fn may_write(&self) -> bool {
        self.is_leading()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timing = Timing {
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
    };

    fn held_by(holder: &str, marker: &str) -> LeaseView {
        LeaseView {
            holder: Some(holder.into()),
            renew_marker: Some(marker.into()),
            duration: Some(Duration::from_secs(15)),
        }
    }

    #[test]
    fn no_lease_means_create() {
        assert_eq!(
            Elector::new("a", T).decide(None, Instant::now()),
            Step::Create
        );
    }

    #[test]
    fn a_leader_renews_at_a_third_of_the_lease_and_retries_before_its_deadline() {
        // The shipped timings: every 5 s (at the first retry period after it: 6 s), so 10
        // writes a minute instead of 30.
        assert_eq!(T.renew_every(), Duration::from_secs(5));
        // A long lease with a short deadline: half the deadline, so retries still fit.
        let long = Timing {
            lease_duration: Duration::from_secs(60),
            ..T
        };
        assert_eq!(long.renew_every(), Duration::from_secs(5));
        // Fast timings (the lab's): never below one retry period.
        let fast = Timing {
            lease_duration: Duration::from_millis(900),
            renew_deadline: Duration::from_millis(600),
            retry_period: Duration::from_millis(300),
        };
        assert_eq!(fast.renew_every(), Duration::from_millis(300));

        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut e = Elector::new("a", T);
        // Not leading: every retry period.
        assert!(e.due(t0));
        assert_eq!(e.decide(Some(&held_by("a", "1")), t0), Step::Renew);
        e.succeeded(t0);
        assert!(!e.due(at(2)) && !e.due(at(4)));
        assert!(e.due(at(6)));
        // The renewal at 6 s fails: retried at 8 s, still inside the grant (until 10 s).
        assert!(e.is_leading(at(8)) && e.due(at(8)));
        e.succeeded(at(8));
        assert!(!e.due(at(10)) && e.due(at(14)));
        // Once the grant lapses, every retry period again.
        assert!(e.due(at(30)));
        e.resign();
        assert!(e.due(at(9)));
    }

    #[test]
    fn our_own_lease_is_renewed() {
        assert_eq!(
            Elector::new("a", T).decide(Some(&held_by("a", "1")), Instant::now()),
            Step::Renew
        );
    }

    #[test]
    fn a_renewing_holder_is_never_taken_over() {
        let mut e = Elector::new("b", T);
        let t0 = Instant::now();
        for i in 0..20u64 {
            let step = e.decide(
                Some(&held_by("a", &i.to_string())),
                t0 + Duration::from_secs(i * 5),
            );
            assert_eq!(step, Step::Wait, "at {}s", i * 5);
        }
    }

    #[test]
    fn a_silent_holder_is_taken_over_after_a_whole_duration_of_our_own_clock() {
        let mut e = Elector::new("b", T);
        let t0 = Instant::now();
        let lease = held_by("a", "renewed-long-ago-by-a-skewed-clock");
        assert_eq!(
            e.decide(Some(&lease), t0),
            Step::Wait,
            "first sight starts our own timer"
        );
        assert_eq!(
            e.decide(Some(&lease), t0 + Duration::from_secs(14)),
            Step::Wait
        );
        assert_eq!(
            e.decide(Some(&lease), t0 + Duration::from_secs(15)),
            Step::Takeover
        );
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let mut e = Elector::new("b", T);
        let released = LeaseView {
            holder: None,
            renew_marker: Some("x".into()),
            duration: Some(Duration::from_secs(1)),
        };
        assert_eq!(e.decide(Some(&released), Instant::now()), Step::Takeover);
    }

    #[test]
    fn the_old_leader_stops_before_anyone_can_take_over() {
        // Leader renews successfully at t0 (request started at t0), then is cut off.
        let t0 = Instant::now();
        let mut leader = Elector::new("a", T);
        let until = leader.succeeded(t0);
        // The contender sees that renewal no earlier than t0.
        let mut contender = Elector::new("b", T);
        let lease = held_by("a", "t0");
        contender.decide(Some(&lease), t0);
        let mut t = t0;
        while contender.decide(Some(&lease), t) != Step::Takeover {
            t += Duration::from_millis(100);
        }
        assert!(
            !leader.is_leading(t),
            "leader still leading when the contender takes over"
        );
        assert!(until < t);
    }

    #[test]
    fn a_vanished_lease_is_not_recreated_before_its_holder_could_have_lapsed() {
        let mut e = Elector::new("b", T);
        let t0 = Instant::now();
        assert_eq!(e.decide(Some(&held_by("a", "1")), t0), Step::Wait);
        // "a" renews unseen at t0+9 s (our reads failed) and the Lease is deleted just after
        // (by hand, or with its owner): "a" may act until t0+19 s. We first see it missing at
        // t0+10 s and wait a whole duration from then.
        let missing = t0 + Duration::from_secs(10);
        assert_eq!(e.decide(None, missing), Step::Wait);
        assert_eq!(
            e.decide(None, missing + Duration::from_secs(14)),
            Step::Wait
        );
        assert_eq!(
            e.decide(None, missing + Duration::from_secs(15)),
            Step::Create
        );
        // The holder itself, while it leads, creates it again at once; once its grant has
        // lapsed (cut off, stalled) it waits like anyone: another may lead by then.
        let mut holder = Elector::new("a", T);
        assert_eq!(holder.decide(Some(&held_by("b", "0")), t0), Step::Wait);
        assert_eq!(holder.decide(Some(&held_by("a", "1")), t0), Step::Renew);
        holder.succeeded(t0);
        assert_eq!(
            holder.decide(None, t0 + Duration::from_secs(1)),
            Step::Create
        );
        let mut lapsed = Elector::new("a", T);
        assert_eq!(lapsed.decide(Some(&held_by("a", "1")), t0), Step::Renew);
        lapsed.succeeded(t0);
        let later = t0 + Duration::from_secs(60);
        assert_eq!(lapsed.decide(None, later), Step::Wait);
        assert_eq!(
            lapsed.decide(None, later + Duration::from_secs(15)),
            Step::Create
        );
        // Never seen held (a first start): created at once.
        assert_eq!(Elector::new("c", T).decide(None, t0), Step::Create);
        // A Lease seen again resets the missing time.
        let mut e = Elector::new("b", T);
        assert_eq!(e.decide(Some(&held_by("a", "1")), t0), Step::Wait);
        assert_eq!(e.decide(None, t0), Step::Wait);
        assert_eq!(e.decide(Some(&held_by("a", "2")), missing), Step::Wait);
        assert_eq!(
            e.decide(None, t0 + Duration::from_secs(16)),
            Step::Wait,
            "missing since 16 s, not since t0"
        );
        // A released Lease that vanishes is created at once: nobody was acting on it.
        let mut e = Elector::new("b", T);
        let released = LeaseView {
            holder: None,
            renew_marker: Some("x".into()),
            duration: Some(Duration::from_secs(1)),
        };
        assert_eq!(e.decide(Some(&released), t0), Step::Takeover);
        assert_eq!(e.decide(None, t0), Step::Create);
    }

    #[test]
    fn a_takeover_keeps_the_owners_the_lease_had() {
        let account = ferrolb_runtime::owner::Owner::service_account("ferrolb-controller", "u");
        let lease = lease_object("l", Some(vec![account.reference()]), Some("a"), &T, 3, None);
        assert_eq!(
            lease.metadata.owner_references,
            Some(vec![account.reference()])
        );
        let lease = lease_object("l", None, Some("a"), &T, 0, None);
        assert_eq!(lease.metadata.owner_references, None);
    }

    #[test]
    fn timings_that_allow_two_writers_are_refused() {
        let bad = Timing {
            renew_deadline: Duration::from_secs(15),
            ..T
        };
        assert!(bad.validate().is_err());
        let slow_retry = Timing {
            retry_period: Duration::from_secs(6),
            ..T
        };
        assert!(slow_retry.validate().is_err());
        assert!(T.validate().is_ok());
    }
}
