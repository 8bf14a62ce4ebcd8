//! The lab's processes: a server in every pod, waiting until each answers, and tearing
//! everything down again.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::spec::{Family, NODE_IP, Pod};
use crate::sys::{self, end_process, in_netns, list_netns, run};
use crate::{Lab, LabState};

impl Lab {
    pub(crate) fn start_servers(&mut self) -> anyhow::Result<()> {
        for pod in self.pods.clone() {
            let child = self.spawn_server(&pod)?;
            self.servers.push(child);
        }
        self.start_pauses()?;
        let state = LabState {
            topology: self.config.topology,
            rules: self.config.rules,
            server_pids: self.servers.iter().map(Child::id).collect(),
        };
        std::fs::write(
            self.state_dir.join("lab.json"),
            serde_json::to_string_pretty(&state)?,
        )?;
        Ok(())
    }

    /// Starts `pod`'s HTTP and UDP server; it writes its ready file once it listens.
    pub(crate) fn spawn_server(&self, pod: &Pod) -> anyhow::Result<Child> {
        let script = self.state_dir.join("pod_server.py");
        let log_path = self.state_dir.join(format!("{}.log", pod.name));
        let log = File::create(&log_path)
            .with_context(|| format!("could not create {}", log_path.display()))?;
        let mut server = in_netns(&self.tools.ip, &pod.ns, &self.tools.python3);
        server
            .arg("-u")
            .arg(&script)
            .args(["--name", &pod.name])
            .args([
                "--http-port",
                &pod.http_port.to_string(),
                "--udp-port",
                &pod.udp_port.to_string(),
            ])
            .arg("--ready-file")
            .arg(self.ready_file(pod))
            .args(
                self.families
                    .contains(&Family::V6)
                    .then_some("--dual-stack"),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Not in the terminal's process group: ^C after `lab up` leaves it running.
            .process_group(0);
        self.spawn_pod_process(&mut server)
            .with_context(|| format!("could not start the server of pod {}", pod.name))
    }

    /// Per pod (the client too) a pause process, as a sandbox has: in the pod's netns and
    /// a UTS namespace of its own whose hostname is the pod's name (the host's stays as
    /// it is). Pushed after the servers, so `servers[i]` stays pod `i`'s server.
    fn start_pauses(&mut self) -> anyhow::Result<()> {
        let mut ready = Vec::new();
        for pod in &self.members() {
            let marker = self.state_dir.join(format!("{}.pause", pod.name));
            let mut pause = in_netns(&self.tools.ip, &pod.ns, "unshare");
            pause
                .args(["--uts", "--", "/bin/sh", "-c"])
                .arg(
                    r#"echo "$0" > /proc/sys/kernel/hostname && touch "$1" && exec sleep infinity"#,
                )
                .arg(&pod.name)
                .arg(&marker)
                .stdin(Stdio::null())
                .process_group(0);
            let child = self.spawn_pod_process(&mut pause).with_context(|| {
                format!("could not start the pause process of pod {}", pod.name)
            })?;
            self.servers.push(child);
            ready.push((pod.name.clone(), marker));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for (name, marker) in ready {
            while !marker.exists() {
                if Instant::now() > deadline {
                    bail!("the pause process of pod {name} did not set its hostname within 10 s");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(())
    }

    /// Sets the hostname of pod `pod`'s UTS namespace (its pause process's) to
    /// `hostname`, as any process of the pod with `CAP_SYS_ADMIN` can: any bytes up to
    /// 64, a terminal escape sequence for one.
    pub fn set_hostname(&self, pod: &str, hostname: &[u8]) -> anyhow::Result<()> {
        let index = self
            .members()
            .iter()
            .position(|p| p.name == pod)
            .with_context(|| format!("the lab has no pod {pod}"))?;
        // `start_pauses` pushed one per member, in `members` order, after the servers.
        let pause = self
            .servers
            .get(self.pods.len() + index)
            .with_context(|| format!("pod {pod} has no pause process"))?;
        let uts = File::open(format!("/proc/{}/ns/uts", pause.id()))
            .with_context(|| format!("cannot open the UTS namespace of pod {pod}"))?;
        std::thread::scope(|scope| {
            scope
                .spawn(|| -> anyhow::Result<()> {
                    // Only this thread enters the pod's UTS namespace; it then ends.
                    nix::sched::setns(&uts, nix::sched::CloneFlags::CLONE_NEWUTS)?;
                    // The hostname of the writer's UTS namespace.
                    std::fs::write("/proc/sys/kernel/hostname", hostname)?;
                    Ok(())
                })
                .join()
                .unwrap_or_else(|_| bail!("the hostname writer panicked"))
        })
        .with_context(|| format!("cannot set the hostname of pod {pod}"))
    }

    pub(crate) fn ready_file(&self, pod: &Pod) -> PathBuf {
        self.state_dir.join(format!("{}.ready", pod.name))
    }

    pub(crate) fn wait_until_answering(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        for (i, pod) in self.pods.iter().enumerate() {
            while !self.ready_file(pod).exists() {
                if let Some(status) = self.servers[i].try_wait()? {
                    let log =
                        std::fs::read_to_string(self.state_dir.join(format!("{}.log", pod.name)))
                            .unwrap_or_default();
                    bail!(
                        "the server of pod {} exited ({status}): {}",
                        pod.name,
                        log.trim()
                    );
                }
                if Instant::now() > deadline {
                    bail!("the server of pod {} did not start within 10 s", pod.name);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // Every pod directly, then every Service through the node's rules, in each
        // family the Services have.
        let mut targets: Vec<(String, Option<&str>)> = Vec::new();
        for family in &self.families {
            for pod in &self.pods {
                let ip = family.ip(pod.ip);
                let http = std::net::SocketAddr::new(ip, pod.http_port);
                let udp = std::net::SocketAddr::new(ip, pod.udp_port);
                targets.push((format!("tcp:{http}"), Some(&pod.name)));
                targets.push((format!("udp:{udp}"), Some(&pod.name)));
            }
            for svc in &self.services {
                let cluster = svc.cluster_addr_in(*family);
                targets.push((format!("{}:{cluster}", svc.proto), None));
                if let Some(np) = svc.node_port {
                    let node_port = std::net::SocketAddr::new(family.ip(NODE_IP), np);
                    targets.push((format!("{}:{node_port}", svc.proto), None));
                }
            }
        }
        let script = self.state_dir.join("clients.py");
        let out = run(
            in_netns(&self.tools.ip, &self.client_ns, &self.tools.python3)
                .arg(&script)
                .arg("probe")
                .args(targets.iter().map(|(t, _)| t)),
        )
        .context("the lab's servers do not answer")?;
        let answers: std::collections::BTreeMap<String, String> =
            serde_json::from_slice(&out.stdout)?;
        for (target, want) in &targets {
            let got = answers.get(target).map(String::as_str);
            if want.is_some() && got != *want {
                bail!("{target} answered {got:?}, expected {want:?}");
            }
        }
        // The probes' entries (UDP ones live 30 s) are no test's connections: a lab
        // starts with an empty conntrack table, so that what observer finds at start
        // is only what a test made.
        for family in ["ipv4", "ipv6"] {
            run(
                in_netns(&self.tools.ip, &self.node_ns, &self.tools.conntrack)
                    .args(["-F", "-f", family]),
            )
            .context("cannot flush the node's conntrack table")?;
        }
        Ok(())
    }

    pub(crate) fn teardown(&mut self) -> anyhow::Result<()> {
        for child in &mut self.servers {
            if let Ok(pid) = i32::try_from(child.id()) {
                end_process(pid);
            }
            let _ = child.wait();
        }
        self.servers.clear();
        self.stop_node_container();
        let mut first_error = None;
        for ns in self.all_namespaces() {
            if list_netns(&self.tools.ip)?.contains(&ns)
                && let Err(e) = sys::remove_netns(&self.tools.ip, &ns)
            {
                first_error.get_or_insert(e);
            }
        }
        if self.state_dir.exists()
            && let Err(e) = std::fs::remove_dir_all(&self.state_dir)
        {
            first_error.get_or_insert(
                anyhow::Error::new(e)
                    .context(format!("could not remove {}", self.state_dir.display())),
            );
        }
        first_error.map_or(Ok(()), Err)
    }
}
