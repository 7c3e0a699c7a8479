//! A lab of network namespaces of a test's own: named `{prefix}-{pid}-{name}-{suffix}` (so
//! parallel tests and runs never share one), joined by veth pairs, with the processes started
//! in them and a scratch directory. Dropping the [`Lab`] kills its processes (and whatever else
//! still runs in its namespaces), deletes the namespaces and the directory, also when the test
//! panics.
//!
//! Addresses: only the lab ranges 198.18.0.0/15 and fd00::/8 go on a lab's interfaces
//! ([`Netns::add_address`] refuses others), so a lab never claims an address of a real network.
//!
//! ```no_run
//! use ferrolb_testkit::netns::Lab;
//!
//! let mut lab = Lab::new("flbex", "demo");
//! // Namespaces flbex-<pid>-demo-a and -b, a veth pair a0 -- b0 with an address at each end.
//! let (a, b) = lab.pair(("a", "a0", &["198.19.79.1"]), ("b", "b0", &["198.19.79.2"]));
//! let pid = lab.spawn(&b, "sleep", &["60"]);
//! let routes = a.run("ip", &["route"]);
//! let listener = b.on_thread(|| std::net::TcpListener::bind("198.19.79.2:1790").unwrap());
//! # let _ = (pid, listener, routes);
//! ```

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// Set either to keep a lab's scratch directory (logs, configuration) after the test.
pub const KEEP_ENV: [&str; 2] = ["KEEP_TEST_LAB", "KEEP_BGP_LAB"];

/// Whether `ip` is in the lab ranges: 198.18.0.0/15 (RFC 2544 benchmarking) or fd00::/8 (ULA).
pub fn is_lab_address(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            a == 198 && b & 0xfe == 18
        }
        IpAddr::V6(v6) => v6.segments()[0] & 0xff00 == 0xfd00,
    }
}

/// Runs `program` to completion; panics unless it succeeds. Its stdout.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace by name. A handle only (cheap to clone and to move to other threads):
/// the [`Lab`] that made it deletes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// A handle on the existing namespace `name` (one a parent process made, say); the caller
    /// removes it, not this handle.
    pub fn named(name: &str) -> Netns {
        Netns { name: name.into() }
    }

    /// The namespace's name (`ip netns`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `program args` to be run in the namespace (`ip netns exec`, which execs `program`: the
    /// child's PID is the program's).
    pub fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]).args(args);
        c
    }

    /// Runs `program` in the namespace to completion, whatever its exit status.
    pub fn output(&self, program: &str, args: &[&str]) -> Output {
        self.command(program, args)
            .output()
            .unwrap_or_else(|e| panic!("ip netns exec {} {program}: {e}", self.name))
    }

    /// The stdout of `program` run in the namespace, whatever its exit status.
    pub fn stdout(&self, program: &str, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.output(program, args).stdout).into_owned()
    }

    /// Runs `program` in the namespace; panics unless it succeeds. Its stdout.
    pub fn run(&self, program: &str, args: &[&str]) -> String {
        let out = self.output(program, args);
        assert!(
            out.status.success(),
            "{} in {}: {program} {args:?}: {}",
            out.status,
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `ip -n <namespace> args`; panics unless it succeeds. Its stdout.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Adds `address` to `ifname`: an IPv4 address as a /24, an IPv6 one as a /64 without
    /// duplicate address detection (usable at once). Panics for an address outside the lab
    /// ranges ([`is_lab_address`]).
    pub fn add_address(&self, ifname: &str, address: &str) {
        let ip: IpAddr = address
            .parse()
            .unwrap_or_else(|e| panic!("{address:?}: {e}"));
        assert!(
            is_lab_address(ip),
            "{ip} is outside the lab ranges (198.18.0.0/15, fd00::/8)"
        );
        match ip {
            IpAddr::V4(_) => self.ip(&["addr", "add", &format!("{ip}/24"), "dev", ifname]),
            IpAddr::V6(_) => self.ip(&["addr", "add", &format!("{ip}/64"), "dev", ifname, "nodad"]),
        };
    }

    /// Moves the calling thread into the namespace (sockets it opens from now on are there).
    pub fn enter(&self) {
        let path = format!("/run/netns/{}", self.name);
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .unwrap_or_else(|e| panic!("setns {path}: {e}"));
    }

    /// Runs `f` on a new thread inside the namespace.
    pub fn thread<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let ns = self.clone();
        std::thread::spawn(move || {
            ns.enter();
            f()
        })
    }

    /// Runs `f` on a thread inside the namespace and returns its result; a panic in `f` goes on
    /// in the caller. Sockets `f` opens stay in the namespace.
    pub fn on_thread<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.thread(f)
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// The PIDs of the processes in the namespace (`ip netns pids`).
    pub fn pids(&self) -> Vec<u32> {
        Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The namespaces, processes and scratch directory of one test; see the module.
#[derive(Debug)]
pub struct Lab {
    id: String,
    dir: PathBuf,
    namespaces: Vec<Netns>,
    children: Vec<Child>,
}

impl Lab {
    /// A lab with id `{prefix}-{pid}-{name}` and a fresh, empty scratch directory
    /// (`$TMPDIR/{id}`); no namespaces yet.
    pub fn new(prefix: &str, name: &str) -> Lab {
        let id = format!("{prefix}-{}-{name}", std::process::id());
        let dir = std::env::temp_dir().join(&id);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        Lab {
            id,
            dir,
            namespaces: Vec::new(),
            children: Vec::new(),
        }
    }

    /// `{prefix}-{pid}-{name}`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The scratch directory: configuration files, sockets, the processes' output.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new namespace `{id}-{suffix}` with its loopback up; deleted with the lab.
    pub fn namespace(&mut self, suffix: &str) -> Netns {
        let ns = Netns {
            name: format!("{}-{suffix}", self.id),
        };
        run("ip", &["netns", "add", &ns.name]);
        self.namespaces.push(ns.clone());
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// A veth pair from interface `a.1` in namespace `a.0` to `b.1` in `b.0`, both ends up.
    pub fn veth(&mut self, a: (&Netns, &str), b: (&Netns, &str)) {
        a.0.ip(&[
            "link", "add", a.1, "type", "veth", "peer", "name", b.1, "netns", &b.0.name,
        ]);
        a.0.ip(&["link", "set", a.1, "up"]);
        b.0.ip(&["link", "set", b.1, "up"]);
    }

    /// Two new namespaces joined by a veth pair, each end given as `(namespace suffix, interface,
    /// addresses)` (see [`Lab::namespace`], [`Lab::veth`], [`Netns::add_address`]).
    pub fn pair(&mut self, a: (&str, &str, &[&str]), b: (&str, &str, &[&str])) -> (Netns, Netns) {
        let (na, nb) = (self.namespace(a.0), self.namespace(b.0));
        self.veth((&na, a.1), (&nb, b.1));
        for (ns, ifname, addresses) in [(&na, a.1, a.2), (&nb, b.1, b.2)] {
            for address in addresses {
                ns.add_address(ifname, address);
            }
        }
        (na, nb)
    }

    /// Starts `program` in `ns`, stdout and stderr to `<dir>/<program's file name>.out`; it is
    /// killed with the lab. Its PID.
    pub fn spawn(&mut self, ns: &Netns, program: &str, args: &[&str]) -> u32 {
        self.spawn_env(ns, program, args, &[])
    }

    /// [`Lab::spawn`] with environment variables `env` set.
    pub fn spawn_env(
        &mut self,
        ns: &Netns,
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> u32 {
        let name = Path::new(program)
            .file_name()
            .map_or_else(|| program.into(), |n| n.to_string_lossy());
        let path = self.dir.join(format!("{name}.out"));
        let log =
            std::fs::File::create(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut command = ns.command(program, args);
        command
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("{program} in {}: {e}", ns.name));
        self.adopt(child)
    }

    /// Kills `child` with the lab (for a process started some other way). Its PID.
    pub fn adopt(&mut self, child: Child) -> u32 {
        let pid = child.id();
        self.children.push(child);
        pid
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Daemons that fork or outlive `ip netns exec` go with their namespace: by PID, only
        // the processes in our own namespaces.
        for ns in &self.namespaces {
            for pid in ns.pids() {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", &ns.name]).status();
        }
        if KEEP_ENV.iter().all(|k| std::env::var_os(k).is_none()) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn lab_ranges() {
        for ip in [
            "198.18.0.1",
            "198.19.77.1",
            "198.19.255.255",
            "fd00:77::1",
            "fdff::1",
        ] {
            assert!(is_lab_address(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "198.17.0.1",
            "198.20.0.1",
            "192.0.2.1",
            "10.0.0.1",
            "2001:db8::1",
            "fe80::1",
            "fc00::1",
        ] {
            assert!(!is_lab_address(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    #[should_panic(expected = "outside the lab ranges")]
    fn addresses_outside_the_lab_ranges_are_refused() {
        Netns::named("unused").add_address("x0", "192.0.2.1");
    }
}
