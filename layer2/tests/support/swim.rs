//! SWIM membership, as MetalLB's speakers use it (hashicorp/memberlist), as a simulator
//! [`Design`] for comparison with ferrolb's designs (issue #34: "measure it against the
//! alternatives"). The SWIM protocol is `foca` (a maintained sans-IO Rust implementation, with
//! memberlist's LAN defaults: probe every second, 500 ms probe round trip, 3 indirect probes,
//! suspicion of 4 × log(N) probe periods, gossip to 3 members every 200 ms); ownership is
//! MetalLB's layer 2 rule: every speaker chooses each IP's owner among the members its own
//! SWIM view holds alive, itself included, and answers for what it chose. There is no quorum
//! and no tenure: that is the point of the comparison.
//!
//! Shared by `tests/simulate_swim.rs` and `benches/simulate.rs` (`#[path]`).

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::time::Duration;

use ferrolb_layer2::sim::{Answer, Design, Dest, Env, MS, Micros, Outbox};
use foca::{Config, Foca, Identity, Notification, PostcardCodec, Runtime, Timer};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// A speaker's SWIM identity: its node and a counter it bumps to rejoin after being declared
/// down (memberlist rejoins the same way, with a new incarnation).
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Id {
    node: u32,
    extra: u32,
}

impl Identity for Id {
    type Addr = u32;

    fn renew(&self) -> Option<Self> {
        Some(Id {
            node: self.node,
            extra: self.extra.wrapping_add(1),
        })
    }

    fn addr(&self) -> u32 {
        self.node
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.extra > adversary.extra
    }
}

/// MetalLB's design: SWIM membership, each node choosing owners among the members it sees.
#[derive(Clone, Copy, Debug, Default)]
pub struct Swim;

type Agent = Foca<Id, PostcardCodec, StdRng, foca::NoCustomBroadcast>;

/// One speaker process.
pub struct SwimNode {
    me: usize,
    foca: Agent,
    /// Foca's timers, by due time (and a counter, for order).
    timers: BTreeMap<(Micros, u64), Timer<Id>>,
    timer_seq: u64,
    /// Nodes foca holds alive.
    alive: BTreeSet<usize>,
    plan: Vec<u32>,
    joined: bool,
    left: bool,
}

impl std::fmt::Debug for SwimNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwimNode")
            .field("me", &self.me)
            .field("alive", &self.alive)
            .finish()
    }
}

/// Foca's runtime: sends go to the outbox, timers to the node's queue, member changes to its
/// alive set.
struct Rt<'a> {
    now: Micros,
    out: &'a mut Outbox<Vec<u8>>,
    timers: &'a mut BTreeMap<(Micros, u64), Timer<Id>>,
    timer_seq: &'a mut u64,
    alive: &'a mut BTreeSet<usize>,
    changed: bool,
}

impl Runtime<Id> for &mut Rt<'_> {
    fn notify(&mut self, notification: Notification<'_, Id>) {
        match notification {
            Notification::MemberUp(id) => {
                self.changed |= self.alive.insert(id.node as usize);
            }
            Notification::MemberDown(id) => {
                self.changed |= self.alive.remove(&(id.node as usize));
            }
            _ => {}
        }
    }

    fn send_to(&mut self, to: Id, data: &[u8]) {
        self.out
            .send(Dest::One(to.node as usize), data.to_vec(), data.len(), 0);
    }

    fn submit_after(&mut self, event: Timer<Id>, after: Duration) {
        *self.timer_seq += 1;
        let at = self.now + after.as_micros() as Micros;
        self.timers.insert((at, *self.timer_seq), event);
    }
}

impl SwimNode {
    fn with_runtime(
        &mut self,
        now: Micros,
        out: &mut Outbox<Vec<u8>>,
        f: impl FnOnce(&mut Agent, &mut Rt<'_>),
    ) -> bool {
        let mut rt = Rt {
            now,
            out,
            timers: &mut self.timers,
            timer_seq: &mut self.timer_seq,
            alive: &mut self.alive,
            changed: false,
        };
        f(&mut self.foca, &mut rt);
        rt.changed
    }

    fn replan(&mut self, env: &Env) {
        self.plan.clear();
        let me = self.me;
        let alive = &self.alive;
        for ip in 0..env.ips.len() {
            if env.owner_among(ip, |i| i == me || alive.contains(&i)) == Some(me) {
                self.plan.push(ip as u32);
            }
        }
    }
}

impl Design for Swim {
    type Node = SwimNode;
    type Message = Vec<u8>;

    fn name(&self) -> &'static str {
        "swim"
    }

    fn start(&self, env: &Env, me: usize, boot: u64, _now: Micros) -> SwimNode {
        let n = NonZeroU32::new(env.names.len().max(1) as u32).unwrap_or(NonZeroU32::MIN);
        let id = Id {
            node: me as u32,
            extra: boot as u32,
        };
        SwimNode {
            me,
            foca: Foca::new(
                id,
                Config::new_lan(n),
                StdRng::seed_from_u64(boot),
                PostcardCodec,
            ),
            timers: BTreeMap::new(),
            timer_seq: 0,
            alive: BTreeSet::new(),
            plan: Vec::new(),
            joined: false,
            left: false,
        }
    }

    fn wake(&self, env: &Env, node: &mut SwimNode, now: Micros, out: &mut Outbox<Vec<u8>>) {
        if node.left {
            return;
        }
        let mut changed = false;
        if !node.joined {
            // MetalLB joins every speaker the API server lists.
            node.joined = true;
            let me = node.me;
            changed |= node.with_runtime(now, out, |foca, rt| {
                for peer in (0..env.names.len()).filter(|&p| p != me) {
                    let _ = foca.announce(
                        Id {
                            node: peer as u32,
                            extra: 0,
                        },
                        &mut *rt,
                    );
                }
            });
        }
        while let Some((&(at, seq), _)) = node.timers.first_key_value() {
            if at > now {
                break;
            }
            let Some(timer) = node.timers.remove(&(at, seq)) else {
                break;
            };
            changed |= node.with_runtime(now, out, |foca, rt| {
                let _ = foca.handle_timer(timer, &mut *rt);
            });
        }
        if changed {
            node.replan(env);
        }
    }

    fn receive(
        &self,
        env: &Env,
        node: &mut SwimNode,
        msg: &Vec<u8>,
        now: Micros,
        out: &mut Outbox<Vec<u8>>,
    ) {
        if node.left {
            return;
        }
        let changed = node.with_runtime(now, out, |foca, rt| {
            let _ = foca.handle_data(msg, &mut *rt);
        });
        if changed {
            node.replan(env);
        }
    }

    fn leave(
        &self,
        _env: &Env,
        node: &mut SwimNode,
        _replaced: bool,
        now: Micros,
        out: &mut Outbox<Vec<u8>>,
    ) {
        node.plan.clear();
        node.with_runtime(now, out, |foca, rt| {
            let _ = foca.leave_cluster(&mut *rt);
        });
        node.left = true;
    }

    fn next_wake(&self, node: &SwimNode) -> Micros {
        if node.left {
            return Micros::MAX;
        }
        if !node.joined {
            return 0;
        }
        node.timers
            .first_key_value()
            .map_or(Micros::MAX, |(&(at, _), _)| at)
    }

    fn answer<'a>(&self, node: &'a SwimNode) -> Answer<'a> {
        Answer {
            ips: &node.plan,
            until: if node.left { 0 } else { Micros::MAX },
        }
    }

    fn claims(&self, node: &SwimNode) -> bool {
        !node.left && node.joined
    }

    fn startup(&self, _env: &Env) -> Micros {
        // Joining takes a round trip; an IP moves back once the others see the node alive.
        3_000 * MS
    }
}
