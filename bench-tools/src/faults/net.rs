//! The campaign's network: each broker in its own network namespace with its own address, joined by veth
//! pairs to a bridge in the campaign's namespace (where the clients run), and the network faults carried
//! out inside those namespaces. This kernel has no netem, so the faults use what it has built in:
//! nftables rules that drop (all of a broker's traffic, the traffic between two groups, one direction, or
//! a random share of packets) and a token-bucket filter (`tc ... tbf`) that turns a link slow, so packets
//! wait in its queue.
//!
//! Everything is made by [`Network::create`] and removed by [`Network::remove`]: the namespaces (and with them the veths) and the bridge. Commands run through `ip`, `nft` and `tc`.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::run;

/// The nftables table the faults put their rules in, one per broker namespace.
const TABLE: &str = "shardlog_fault";
/// The share of packets dropped by a packet-loss fault, in percent.
pub const LOSS_PERCENT: u32 = 20;
/// A slow link: its rate, burst and the longest a packet waits in its queue.
pub const SLOW_RATE: &str = "1mbit";
const SLOW_BURST: &str = "8kb";
pub const SLOW_QUEUE: &str = "200ms";

/// The brokers' namespaces and the bridge between them. The owner calls [`Network::remove`] however the
/// campaign ends (a signal handler too), so it is not removed on drop.
#[derive(Debug)]
pub struct Network {
    bridge: String,
    /// Per broker (index = id - 1): its namespace and the host end of its veth.
    hosts: Vec<(String, String)>,
    subnet: [u8; 3],
}

/// Why a machine cannot run the campaign's network, or `None` when it can.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces, veth pairs and nftables rules need root".into());
    }
    for tool in ["ip", "nft", "tc"] {
        let found = Command::new(tool).arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status();
        if found.is_err() {
            let package = match tool {
                "ip" | "tc" => "iproute2",
                _ => "nftables",
            };
            return Some(format!("`{tool}` is not installed (Debian package {package})"));
        }
    }
    None
}

impl Network {
    /// Makes a namespace per broker on a bridge. Campaigns running side by side do not meet: each claims a
    /// /24 of 10.213.0.0/16 no route of the host uses by creating the bridge named after it (which only
    /// one can), and names its namespaces after its process id.
    pub fn create(brokers: usize) -> Result<Network> {
        if let Some(why) = unavailable() {
            bail!("{why}: run as root with iproute2 and nftables installed, or pass --no-netns");
        }
        let pid = std::process::id();
        let claimed = (0..250u32).map(|k| ((pid + k) % 250) as u8).find(|&x| {
            let routes = Command::new("ip").args(["-4", "route", "show", &format!("10.213.{x}.0/24")]).output();
            let taken = routes.map_or(true, |o| !o.stdout.is_empty());
            !taken && ip(&["link", "add", &format!("slfnet{x}"), "type", "bridge"]).is_ok()
        });
        let Some(x) = claimed else { bail!("every /24 of 10.213.0.0/16 is in use by other campaigns") };
        let network = Network {
            bridge: format!("slfnet{x}"),
            hosts: (1..=brokers).map(|i| (format!("shardlog-faults-{pid}-{i}"), format!("slf{x}h{i}"))).collect(),
            subnet: [10, 213, x],
        };
        // Whatever was made before a failure is removed (the bridge is this campaign's from here on).
        network.build().inspect_err(|_| network.remove())?;
        Ok(network)
    }

    fn build(&self) -> Result<()> {
        let gateway = format!("{}/24", self.gateway());
        ip(&["addr", "add", &gateway, "dev", &self.bridge])?;
        ip(&["link", "set", &self.bridge, "up"])?;
        for (i, (ns, veth)) in self.hosts.iter().enumerate() {
            let addr = format!("{}/24", self.addr(i + 1));
            ip(&["netns", "add", ns])?;
            ip(&["link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])?;
            ip(&["link", "set", veth, "master", &self.bridge])?;
            ip(&["link", "set", veth, "up"])?;
            ip(&["-n", ns, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        // What the faults need of the kernel, tried once now rather than found missing mid-campaign.
        self.rules(1, "", "").context("nftables in a namespace")?;
        self.heal(1)?;
        self.slow_link(1).context("a token-bucket filter (tc qdisc tbf)")?;
        self.heal(1)
    }

    /// What was made, for the operator: the namespaces, the bridge and the subnet.
    pub fn describe(&self) -> String {
        let names: Vec<&str> = self.hosts.iter().map(|(ns, _)| ns.as_str()).collect();
        let [a, b, c] = self.subnet;
        format!("{} on bridge {} ({a}.{b}.{c}.0/24)", names.join(", "), self.bridge)
    }

    /// The campaign's own address on the bridge.
    pub fn gateway(&self) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, 254)
    }

    /// Broker `id`'s address (ids from 1).
    pub fn addr(&self, id: usize) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, id as u8)
    }

    /// The file of broker `id`'s namespace, for setns(2).
    pub fn namespace(&self, id: usize) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.hosts[id - 1].0)
    }

    fn others(&self, group: &[usize]) -> Vec<Ipv4Addr> {
        (1..=self.hosts.len()).filter(|id| !group.contains(id)).map(|id| self.addr(id)).collect()
    }

    /// Broker `id` cut off from everyone: the other brokers and the clients.
    pub fn isolate(&self, id: usize) -> Result<()> {
        self.rules(id, "drop", "drop")
    }

    /// The brokers of `minority` cut off from the others (both ways); clients still reach everyone.
    pub fn split(&self, minority: &[usize]) -> Result<()> {
        let majority = set(&self.others(minority));
        for &id in minority {
            self.rules(id, &format!("ip saddr {majority} drop"), &format!("ip daddr {majority} drop"))?;
        }
        Ok(())
    }

    /// Broker `id`'s packets to the other brokers dropped; theirs to it still arrive.
    pub fn one_way_drop(&self, id: usize) -> Result<()> {
        self.rules(id, "", &format!("ip daddr {} drop", set(&self.others(&[id]))))
    }

    /// `LOSS_PERCENT` of broker `id`'s packets, in and out, dropped at random.
    pub fn packet_loss(&self, id: usize) -> Result<()> {
        let rule = format!("numgen random mod 100 < {LOSS_PERCENT} drop");
        self.rules(id, &rule, &rule)
    }

    /// Broker `id`'s link made slow both ways: a token bucket on each end of its veth, so packets queue.
    pub fn slow_link(&self, id: usize) -> Result<()> {
        let (ns, veth) = &self.hosts[id - 1];
        let tbf = ["root", "tbf", "rate", SLOW_RATE, "burst", SLOW_BURST, "latency", SLOW_QUEUE];
        run(Command::new("tc").args(["-n", ns, "qdisc", "replace", "dev", "eth0"]).args(tbf))?;
        run(Command::new("tc").args(["qdisc", "replace", "dev", veth]).args(tbf))
    }

    /// Every network fault on broker `id` taken away.
    pub fn heal(&self, id: usize) -> Result<()> {
        let (ns, veth) = &self.hosts[id - 1];
        // Each is there only if its fault was: declaring the table first makes deleting it never fail,
        // and a root qdisc is deleted only where there is one.
        let table = format!("table inet {TABLE}; delete table inet {TABLE}");
        run(Command::new("ip").args(["netns", "exec", ns, "nft", &table]))?;
        for (netns, dev) in [(Some(ns.as_str()), "eth0"), (None, veth.as_str())] {
            let tc = || {
                let mut tc = Command::new("tc");
                if let Some(netns) = netns {
                    tc.args(["-n", netns]);
                }
                tc
            };
            let shown = tc().args(["qdisc", "show", "dev", dev, "root"]).output()?;
            if String::from_utf8_lossy(&shown.stdout).contains("tbf") {
                run(tc().args(["qdisc", "del", "dev", dev, "root"]))?;
            }
        }
        Ok(())
    }

    /// Loads a table whose input and output chains end in the given statements (loopback is never
    /// touched: a broker talks to itself over it).
    fn rules(&self, id: usize, input: &str, output: &str) -> Result<()> {
        let ns = &self.hosts[id - 1].0;
        let chain = |name: &str, lo: &str, rule: &str| {
            format!(
                "  chain {name} {{\n    type filter hook {name} priority 0; policy accept;\n    {lo} \"lo\" accept\n    {rule}\n  }}\n"
            )
        };
        // Declared, deleted and loaded again in one transaction: whatever rules were there are replaced.
        let script = format!(
            "table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n{}{}}}\n",
            chain("input", "iifname", input),
            chain("output", "oifname", output)
        );
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("start nft")?;
        std::io::Write::write_all(&mut child.stdin.take().context("nft's stdin")?, script.as_bytes())?;
        let output = child.wait_with_output()?;
        if !output.status.success() {
            bail!("nft in {ns}: {}\n{script}", String::from_utf8_lossy(&output.stderr).trim());
        }
        Ok(())
    }

    /// Removes the namespaces (killing what still runs in them) and the bridge. Safe to call again.
    pub fn remove(&self) {
        for (ns, _) in &self.hosts {
            if let Ok(pids) = Command::new("ip").args(["netns", "pids", ns]).stderr(Stdio::null()).output() {
                for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
                    if let Ok(pid) = pid.parse::<i32>() {
                        // SAFETY: kill(2) with a valid signal; a process that is gone makes it fail.
                        unsafe {
                            libc::kill(pid, libc::SIGKILL);
                        }
                    }
                }
            }
            let _ = quiet(Command::new("ip").args(["netns", "del", ns]));
        }
        let _ = quiet(Command::new("ip").args(["link", "del", &self.bridge]));
    }
}

/// An nftables anonymous set of addresses.
fn set(addrs: &[Ipv4Addr]) -> String {
    let list: Vec<String> = addrs.iter().map(Ipv4Addr::to_string).collect();
    format!("{{ {} }}", list.join(", "))
}

fn ip(args: &[&str]) -> Result<()> {
    run(Command::new("ip").args(args))
}

fn quiet(command: &mut Command) -> std::io::Result<std::process::ExitStatus> {
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status()
}
