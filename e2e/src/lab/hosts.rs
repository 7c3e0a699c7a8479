//! The lab's hosts: running commands in them, their links, what answers ARP/NDP from them, and
//! their neighbour tables.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{Context, bail};
use kube::Client;

use super::*;
use crate::cluster;
use crate::cmd::{output_in, run, run_in};

impl Lab {
    /// A kube client with the lab's admin credentials.
    pub async fn client(&self) -> anyhow::Result<Client> {
        cluster::client_from(&self.dir.join("pki/admin.kubeconfig")).await
    }

    /// Path of the admin kubeconfig.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("pki/admin.kubeconfig")
    }

    /// Runs a command in a host of the lab and returns its output.
    pub fn exec(&self, host: &str, program: &str, args: &[&str]) -> anyhow::Result<String> {
        let netns = self.netns_of(host)?;
        run_in(&netns, program, args)
    }

    /// Runs a command in a host and returns its output whatever its exit status.
    pub fn exec_output(
        &self,
        host: &str,
        program: &str,
        args: &[&str],
    ) -> anyhow::Result<std::process::Output> {
        let netns = self.netns_of(host)?;
        output_in(&netns, program, args)
    }

    /// Cuts (`up == false`) or restores a host's link to the lab bridge, from the bridge side:
    /// the host sees its carrier go, as when a cable is pulled, and keeps its addresses and
    /// routes.
    pub fn set_link(&self, host: &str, up: bool) -> anyhow::Result<()> {
        let h = self
            .topology
            .host(host)
            .with_context(|| format!("no lab host {host}"))?;
        let outside = format!("flb-{}", h.name);
        run(
            "ip",
            &["link", "set", &outside, if up { "up" } else { "down" }],
        )
        .map(|_| ())
    }

    /// The MAC addresses that answer ARP (IPv4) or NDP (IPv6) for `ip` when `from` asks on its
    /// lab interface: three requests, every answer counted.
    pub fn l2_answers(&self, from: &str, ip: &str) -> anyhow::Result<BTreeSet<String>> {
        self.ask_l2(
            from,
            ip,
            &["--count", "3", "--wait-ms", "300"],
            &["-c", "3", "-W", "0.3"],
        )
    }

    /// The MACs that answered each of three requests for `ip` (an ARP request, or a Neighbor
    /// Solicitation for an IPv6 address), one after the other, each listened to for 40 ms only.
    /// Two MACs for one request is a split. A handover cannot show as one: an owner stops
    /// answering at least 50 ms before anyone can take over (ferrolb_layer2::tenure), and a
    /// taking node's unsolicited announcement lands after that.
    pub fn l2_answers_by_request(
        &self,
        from: &str,
        ip: &str,
    ) -> anyhow::Result<Vec<BTreeSet<String>>> {
        // One solicitation (--count 1) or request (-c 1); every answer within 40 ms (arping counts
        // only replies to us).
        (0..3)
            .map(|_| {
                self.ask_l2(
                    from,
                    ip,
                    &["--count", "1", "--wait-ms", "40"],
                    &["-c", "1", "-w", "0.04"],
                )
            })
            .collect()
    }

    /// The MACs answering `ip` from `from`'s eth0: `ferrolb-lab ndp-solicit` with `ndisc` for an
    /// IPv6 address, arping with `arping` for an IPv4 one.
    fn ask_l2(
        &self,
        from: &str,
        ip: &str,
        ndisc: &[&str],
        arping: &[&str],
    ) -> anyhow::Result<BTreeSet<String>> {
        let mut macs = BTreeSet::new();
        if ip.contains(':') {
            // Every advertisement, from any source (e2e/src/ndp.rs says why not ndisc6), as
            // "Target link-layer address: 82:24:...".
            let mut args = vec!["ndp-solicit", "--target", ip];
            args.extend_from_slice(ndisc);
            let out = self.lab_command(from, &args)?.output()?;
            if !out.status.success() {
                bail!(
                    "ndp-solicit {ip} in {from}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some(mac) = line.trim().strip_prefix("Target link-layer address:") {
                    macs.insert(mac.trim().to_ascii_lowercase());
                }
            }
        } else {
            // arping prints "60 bytes from 82:24:ad:bd:37:ba (198.18.200.0): index=0 ...".
            let args: Vec<&str> = arping.iter().copied().chain(["-i", "eth0", ip]).collect();
            let out = self.exec_output(from, "arping", &args)?;
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some(rest) = line.split(" bytes from ").nth(1)
                    && let Some(mac) = rest.split_whitespace().next()
                {
                    macs.insert(mac.to_ascii_lowercase());
                }
            }
        }
        Ok(macs)
    }

    /// The network namespace of a host (hosts by short name, pods by their namespace name).
    pub fn netns_of(&self, host: &str) -> anyhow::Result<String> {
        if let Some(h) = self.topology.host(host) {
            return Ok(h.netns.clone());
        }
        if host.starts_with("flb-") {
            return Ok(host.to_string());
        }
        bail!(
            "no host {host:?} in the lab (hosts: {})",
            self.topology
                .hosts
                .iter()
                .map(|h| h.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

impl Lab {
    /// HTTP through `ip` from lab host `from` (3 s at most): the answering pod's name and the
    /// source address it saw.
    pub fn http_from(&self, from: &str, ip: &str) -> anyhow::Result<(String, String)> {
        let url = http_url(ip);
        let out = self.exec(from, "curl", &["-sS", "--max-time", "3", "-g", &url])?;
        let mut words = out.split_whitespace();
        Ok((
            words.next().unwrap_or_default().to_string(),
            words.next().unwrap_or_default().to_string(),
        ))
    }

    /// The lab node whose lab interface has MAC address `mac`.
    pub fn node_of_mac(&self, mac: &str) -> anyhow::Result<String> {
        for node in self.topology.nodes() {
            if self.mac_of(&node.name)?.eq_ignore_ascii_case(mac) {
                return Ok(node.name.clone());
            }
        }
        bail!("MAC {mac} is no lab node's")
    }

    /// Waits (30 s at most) until exactly one MAC answers ARP/NDP for `ip` from `from`, and
    /// returns its node.
    pub async fn answering_node(&self, from: &str, ip: &str) -> anyhow::Result<String> {
        let mac = cluster::wait_for(
            &format!("exactly one MAC to answer for {ip}"),
            std::time::Duration::from_secs(30),
            || async {
                let macs = self.l2_answers(from, ip).map_err(|e| e.to_string())?;
                match macs.len() {
                    1 => Ok(macs.into_iter().next()),
                    _ => Err(format!("answers from {macs:?}")),
                }
            },
        )
        .await?;
        self.node_of_mac(&mac)
    }
}

/// An HTTP URL for an IP (bracketed for IPv6).
pub fn http_url(ip: &str) -> String {
    if ip.contains(':') {
        format!("http://[{ip}]/")
    } else {
        format!("http://{ip}/")
    }
}

impl Lab {
    /// A command running `ferrolb-lab` with `args` inside `host`'s namespace (the lab's own
    /// helpers: `probe`, `hold`, `delay-relay`); the caller sets its stdio and spawns it.
    pub fn lab_command(&self, host: &str, args: &[&str]) -> anyhow::Result<std::process::Command> {
        let mut command = std::process::Command::new("ip");
        command
            .args(["netns", "exec", &self.netns_of(host)?])
            .arg(&self.lab_exe)
            .args(args);
        Ok(command)
    }

    /// A host's IPv4 address on its first lab interface (what the cluster knows it by).
    pub fn ipv4_of(&self, host: &str) -> anyhow::Result<std::net::Ipv4Addr> {
        self.topology
            .host(host)
            .and_then(|h| h.interfaces.first())
            .map(|i| i.ipv4)
            .with_context(|| format!("no lab host {host} with an interface"))
    }

    /// MAC address of a host's lab interface.
    pub fn mac_of(&self, host: &str) -> anyhow::Result<String> {
        Ok(self
            .exec(host, "cat", &["/sys/class/net/eth0/address"])?
            .trim()
            .to_string())
    }

    /// Points `ip` at `mac` in `host`'s neighbour table (what a speaker's ARP/NDP answer does),
    /// or removes that entry with `mac: None`.
    pub fn set_neighbour(&self, host: &str, ip: &str, mac: Option<&str>) -> anyhow::Result<()> {
        let family = if ip.contains(':') { "-6" } else { "-4" };
        match mac {
            Some(mac) => self.exec(
                host,
                "ip",
                &[
                    family,
                    "neigh",
                    "replace",
                    ip,
                    "lladdr",
                    mac,
                    "dev",
                    "eth0",
                    "nud",
                    "permanent",
                ],
            ),
            None => self.exec(host, "ip", &[family, "neigh", "del", ip, "dev", "eth0"]),
        }
        .map(|_| ())
    }
}
