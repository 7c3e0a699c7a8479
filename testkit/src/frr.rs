//! FRR in a lab's network namespace, the real router the speaker's lab tests check the BGP
//! driver and discovery against: zebra, and bgpd when the test gives it a configuration, with
//! their configuration, PID files and sockets in the lab's scratch directory.
//!
//! One launcher, so every test starts FRR the same way. The daemons are children of the
//! [`Lab`] (its `spawn`): dropping the lab kills them by PID, with whatever else runs in its
//! namespaces, also when the test panics. One FRR per lab: the files have fixed names in the
//! lab's directory.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use ferrolb_testkit::frr::{self, Frr};
//! use ferrolb_testkit::netns::Lab;
//!
//! let mut lab = Lab::new("flbex", "frr");
//! let (router, _node) = lab.pair(("r", "r0", &["198.19.79.2"]), ("n", "n0", &["198.19.79.1"]));
//! let bgpd = frr::bgpd_conf(
//!     lab.dir(),
//!     "router bgp 64500\n neighbor 198.19.79.1 remote-as 64512\n!\n",
//! );
//! let frr = Frr::start(
//!     &mut lab,
//!     &router,
//!     &frr::Config {
//!         zebra: frr::ZEBRA_CONF,
//!         bgpd: Some(&bgpd),
//!         zebra_wait: Duration::from_secs(10),
//!     },
//! );
//! let neighbour = frr.vtysh("show bgp neighbors 198.19.79.1 json");
//! # let _ = neighbour;
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::netns::{self, Lab, Netns};

/// A zebra.conf with FRR's traditional defaults and the hostname `r`, nothing else: the kernel
/// routes bgpd installs need zebra, not any zebra configuration.
pub const ZEBRA_CONF: &str = "frr defaults traditional\nhostname r\n!\n";

/// A bgpd.conf: the same header as [`ZEBRA_CONF`], then bgpd's neighbour events logged to
/// `dir/bgpd-events.log` (pass the lab's directory, kept with [`netns::KEEP_ENV`]: the log says
/// why a session did not come up), then `routers` (the `router bgp` sections, each ending
/// with `!`).
pub fn bgpd_conf(dir: &Path, routers: &str) -> String {
    format!(
        "frr defaults traditional\nhostname r\nlog file {}/bgpd-events.log\n\
         debug bgp neighbor-events\n!\n{routers}",
        dir.display()
    )
}

/// What [`Frr::start`] runs.
#[derive(Clone, Copy, Debug)]
pub struct Config<'a> {
    /// zebra.conf (often [`ZEBRA_CONF`]).
    pub zebra: &'a str,
    /// bgpd.conf (see [`bgpd_conf`]); `None` runs zebra alone (its router advertisements, say).
    pub bgpd: Option<&'a str>,
    /// How long zebra may take to open its API socket before the start fails.
    pub zebra_wait: Duration,
}

/// FRR running in a namespace, started by [`Frr::start`]. A handle only (cheap to clone and to
/// move to other threads): the [`Lab`] stops the daemons.
#[derive(Clone, Debug)]
pub struct Frr {
    ns: Netns,
    dir: PathBuf,
}

impl Frr {
    /// Writes `config` into the lab's directory (zebra.conf, bgpd.conf), hands the directory
    /// to the `frr` user (the daemons drop root and then write their PID files, sockets and
    /// log there) and starts `/usr/lib/frr/zebra`, then `/usr/lib/frr/bgpd` (port 179) when
    /// `config.bgpd` is given, in `ns`. Panics when zebra's API socket is not there within
    /// `config.zebra_wait`.
    pub fn start(lab: &mut Lab, ns: &Netns, config: &Config<'_>) -> Frr {
        let dir = lab.dir().to_path_buf();
        let d = dir.display().to_string();
        write(&dir.join("zebra.conf"), config.zebra);
        let mut daemons = vec!["zebra"];
        if let Some(bgpd) = config.bgpd {
            write(&dir.join("bgpd.conf"), bgpd);
            daemons.push("bgpd");
        }
        netns::run("chown", &["-R", "frr:frr", &d]);
        // -N (pathspace): the namespace's name, so nothing of this FRR's meets the files of
        // another FRR on the machine; the files named here are all in the lab's directory.
        let api_arg = format!("{d}/zserv.api");
        let api = Path::new(&api_arg);
        for daemon in daemons {
            let conf = format!("{d}/{daemon}.conf");
            let pid = format!("{d}/{daemon}.pid");
            let mut args = vec![
                "-N",
                ns.name(),
                "-f",
                &conf,
                "-i",
                &pid,
                "-z",
                &api_arg,
                "--vty_socket",
                &d,
            ];
            if daemon == "bgpd" {
                args.extend(["-p", "179"]);
            }
            lab.spawn(ns, &format!("/usr/lib/frr/{daemon}"), &args);
            if daemon == "zebra" {
                // bgpd gives up on a zebra that is not there yet.
                let deadline = Instant::now() + config.zebra_wait;
                while !api.exists() {
                    assert!(
                        Instant::now() < deadline,
                        "zebra did not open {api_arg} within {:?}",
                        config.zebra_wait
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        Frr {
            ns: ns.clone(),
            dir,
        }
    }

    /// The output of `vtysh -c command` against these daemons, whatever its exit status (a
    /// test's check reads it, and fails with it).
    pub fn vtysh(&self, command: &str) -> String {
        self.ns.stdout(
            "vtysh",
            &[
                "--vty_socket",
                &self.dir.display().to_string(),
                "-c",
                command,
            ],
        )
    }
}

fn write(path: &Path, contents: &str) {
    std::fs::write(path, contents).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bgpd_conf_logs_neighbour_events_in_the_directory() {
        assert_eq!(
            bgpd_conf(Path::new("/tmp/lab"), "router bgp 64500\n!\n"),
            "frr defaults traditional\nhostname r\nlog file /tmp/lab/bgpd-events.log\n\
             debug bgp neighbor-events\n!\nrouter bgp 64500\n!\n"
        );
    }
}
