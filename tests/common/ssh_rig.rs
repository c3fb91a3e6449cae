//! Hosts for the tests of `--hosts` commands: N network namespaces on one bridge (the test
//! process is host .1 of the same /24), each running Debian's sshd with a host key and an
//! authorised key this rig makes. Everything is removed on drop, also when a test fails.
//! Needs root (namespaces) and openssh-server; [`SshRig::new`] says why it skips otherwise.
//!
//! The "hosts" share this machine's filesystem, CPUs and clock: a test over them proves
//! the mechanics (ssh, leases, files, addresses), not figures of separate machines.
//! Included with `#[path = "common/ssh_rig.rs"] mod ssh_rig;`.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use iolab_netns::{Namespace, Net};

pub const SSHD: &str = "/usr/sbin/sshd";

/// The hosts and their sshds.
pub struct SshRig {
    sshds: Vec<Child>,
    /// Each host's namespace and address.
    pub hosts: Vec<(Namespace, Ipv4Addr)>,
    pub dir: tempfile::TempDir,
    made_privsep_dir: bool,
    // Last: the namespaces go after the sshds in them.
    _net: Net,
}

impl Drop for SshRig {
    fn drop(&mut self) {
        for c in &mut self.sshds {
            iolab_sys::testing::stop_child(c);
        }
        if self.made_privsep_dir {
            let _ = std::fs::remove_dir("/run/sshd");
        }
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl SshRig {
    /// `n` hosts, their namespaces tagged `tag` (iolab-netns: at most 3 characters).
    /// None (with the reason on stderr) without root, sshd or ssh.
    pub fn new(tag: &str, n: usize) -> Option<SshRig> {
        if !iolab_sys::process::is_root() {
            eprintln!("skipped: --hosts tests need root (network namespaces for their hosts)");
            return None;
        }
        if !Path::new(SSHD).exists() {
            eprintln!("skipped: {SSHD} not found (apt-get install openssh-server)");
            return None;
        }
        iolab_sys::testing::require_tool("ssh", "openssh-client")?;
        let mut net = Net::new(tag).unwrap();
        let switch = net.namespace().unwrap();
        switch
            .run("ip", &["link", "add", "br0", "type", "bridge"])
            .unwrap();
        switch.run("ip", &["link", "set", "br0", "up"]).unwrap();
        let [a, b, c] = iolab_netns::free_subnet().unwrap();
        let ip = |n: u8| Ipv4Addr::new(a, b, c, n);
        let plug = |net: &mut Net, ns: Option<&Namespace>, n: u8| {
            let (inside, port) = net.veth(ns, Some(&switch)).unwrap();
            inside.add_addr(&format!("{}/24", ip(n))).unwrap();
            inside.up().unwrap();
            switch
                .run("ip", &["link", "set", &port.name, "master", "br0"])
                .unwrap();
            port.up().unwrap();
        };
        // The controller (this namespace) is .1; the hosts .2, .3, ...
        plug(&mut net, None, 1);
        let mut hosts = Vec::new();
        for i in 0..n {
            let ns = net.namespace().unwrap();
            let last = u8::try_from(i + 2).expect("at most 253 hosts");
            plug(&mut net, Some(&ns), last);
            hosts.push((ns, ip(last)));
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for key in ["id", "host_key"] {
            run(Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(d.join(key)));
        }
        std::fs::copy(d.join("id.pub"), d.join("authorized_keys")).unwrap();
        let made_privsep_dir = !Path::new("/run/sshd").exists();
        std::fs::create_dir_all("/run/sshd").unwrap();
        let mut sshds = Vec::new();
        for (i, (ns, addr)) in hosts.iter().enumerate() {
            let conf = d.join(format!("sshd-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "ListenAddress {addr}\nPort 22\nHostKey {d}/host_key\nPidFile {d}/sshd-{i}.pid\nAuthorizedKeysFile {d}/authorized_keys\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPrintMotd no\n",
                    d = d.display()
                ),
            )
            .unwrap();
            let child = ns
                .command(SSHD)
                .unwrap()
                .arg("-D")
                .arg("-f")
                .arg(&conf)
                .arg("-E")
                .arg(d.join(format!("sshd-{i}.log")))
                .stdin(Stdio::null())
                .spawn()
                .unwrap();
            sshds.push(child);
        }
        let rig = SshRig {
            sshds,
            hosts,
            dir,
            made_privsep_dir,
            _net: net,
        };
        for (_, addr) in &rig.hosts {
            let t0 = Instant::now();
            let to = SocketAddr::new(IpAddr::V4(*addr), 22);
            while TcpStream::connect_timeout(&to, Duration::from_millis(200)).is_err() {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "sshd on {addr} not up"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Some(rig)
    }

    /// The private key every host accepts.
    pub fn identity(&self) -> PathBuf {
        self.dir.path().join("id")
    }

    /// Host `i`'s lines of an inventory table: its name, address and identity, then `how`
    /// (`iolab = "..."` or `copy = true`, and anything else).
    pub fn host_lines(&self, i: usize, name: &str, how: &str) -> String {
        format!(
            "name = \"{name}\"\naddress = \"{}\"\nidentity = \"{}\"\n{how}\n",
            self.hosts[i].1,
            self.identity().display()
        )
    }
}
