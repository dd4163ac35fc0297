//! From a task to a Docker container: the container's name, its swarm labels, and the create body (command,
//! env, user, workdir, hostname, mounts, limits, stop signal and timeout, init, healthcheck). Pure functions,
//! tested without an engine.
//!
//! Must not do IO or depend on the runner or the session.

use std::collections::HashMap;

use bollard::models::{
    ContainerCreateBody, HealthConfig, HostConfig, HostConfigLogConfig, Mount, MountBindOptions,
    MountBindOptionsPropagationEnum, MountTmpfsOptions, MountType, MountVolumeOptions, MountVolumeOptionsDriverConfig,
    ResourcesUlimits,
};
use shoal_api::privileges::{app_armor_opts::AppArmorMode, seccomp_opts::SeccompMode};
use shoal_api::{mount, task_spec, ContainerSpec, Privileges, Task};

use crate::exec::stop_grace_period;

/// Label: the service ID of the task a container runs.
pub(crate) const LABEL_SERVICE_ID: &str = "com.docker.swarm.service.id";
/// Label: the service name.
pub(crate) const LABEL_SERVICE_NAME: &str = "com.docker.swarm.service.name";
/// Label: the task ID.
pub(crate) const LABEL_TASK_ID: &str = "com.docker.swarm.task.id";
/// Label: the task name (`<service>.<slot>.<task id>`).
pub(crate) const LABEL_TASK_NAME: &str = "com.docker.swarm.task.name";
/// Label: the node that runs the container; the agent finds its containers by it after a restart.
pub(crate) const LABEL_NODE_ID: &str = "com.docker.swarm.node.id";

/// The task's container spec (an empty one when the task has none).
pub(crate) fn container_spec(task: &Task) -> ContainerSpec {
    match task.spec.as_ref().and_then(|s| s.runtime.as_ref()) {
        Some(task_spec::Runtime::Container(c)) => c.clone(),
        _ => ContainerSpec::default(),
    }
}

pub(crate) use crate::naming::{service_name, task_name};

/// The labels a task's container carries: the spec's, then the swarm ones (which win).
pub(crate) fn labels(task: &Task, node_id: &str) -> HashMap<String, String> {
    let mut l: HashMap<String, String> = container_spec(task).labels.into_iter().collect();
    l.insert(LABEL_SERVICE_ID.into(), task.service_id.clone());
    l.insert(LABEL_SERVICE_NAME.into(), service_name(task));
    l.insert(LABEL_TASK_ID.into(), task.id.clone());
    l.insert(LABEL_TASK_NAME.into(), task_name(task));
    l.insert(LABEL_NODE_ID.into(), node_id.to_string());
    l
}

fn nanos(d: &Option<shoal_api::prost_types::Duration>) -> Option<i64> {
    d.as_ref().map(|d| i64::try_from(shoal_api::duration_from_proto(d).as_nanos()).unwrap_or(i64::MAX))
}

fn non_empty(v: &[String]) -> Option<Vec<String>> {
    (!v.is_empty()).then(|| v.to_vec())
}

fn opt(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

fn mount_of(m: &shoal_api::Mount) -> Result<Mount, String> {
    let typ = match mount::Type::try_from(m.r#type).unwrap_or(mount::Type::Bind) {
        mount::Type::Bind => MountType::BIND,
        mount::Type::Volume => MountType::VOLUME,
        mount::Type::Tmpfs => MountType::TMPFS,
        mount::Type::Cluster => {
            return Err(format!(
                "the cluster volume {:?} (type=cluster, target {}) is not published on this node: the agent binds a \
                 task's cluster mounts to the volumes the managers publish to the node, and this one was not bound \
                 (docs/design/cluster-volumes.md)",
                m.source, m.target
            ))
        }
        other => {
            return Err(format!(
                "mount type {} (target {}) is not supported by the docker executor; use bind, volume or tmpfs",
                other.as_str_name().to_lowercase(),
                m.target
            ))
        }
    };
    if m.target.is_empty() {
        return Err("a mount has no target path; set target= on the mount".into());
    }
    if typ == MountType::BIND && m.source.is_empty() {
        return Err(format!("the bind mount at {} has no source; set source= to a path on the node", m.target));
    }
    // The engine creates a named volume that does not exist yet with these (driver, options, labels), as
    // SwarmKit's executor has it do.
    let volume_options = m.volume_options.as_ref().filter(|_| typ == MountType::VOLUME).map(|v| MountVolumeOptions {
        no_copy: v.nocopy.then_some(true),
        labels: (!v.labels.is_empty()).then(|| v.labels.clone()),
        driver_config: v.driver_config.as_ref().map(|d| MountVolumeOptionsDriverConfig {
            name: opt(&d.name),
            options: (!d.options.is_empty()).then(|| d.options.clone()),
        }),
        subpath: opt(&v.subpath),
    });
    // As SwarmKit's executor: the propagation always said, the flags when set.
    let bind_options = m.bind_options.as_ref().filter(|_| typ == MountType::BIND).map(|b| {
        use mount::bind_options::Propagation;
        MountBindOptions {
            propagation: Some(match b.propagation() {
                Propagation::Rprivate => MountBindOptionsPropagationEnum::RPRIVATE,
                Propagation::Private => MountBindOptionsPropagationEnum::PRIVATE,
                Propagation::Rshared => MountBindOptionsPropagationEnum::RSHARED,
                Propagation::Shared => MountBindOptionsPropagationEnum::SHARED,
                Propagation::Rslave => MountBindOptionsPropagationEnum::RSLAVE,
                Propagation::Slave => MountBindOptionsPropagationEnum::SLAVE,
            }),
            non_recursive: b.nonrecursive.then_some(true),
            create_mountpoint: b.createmountpoint.then_some(true),
            read_only_non_recursive: b.readonlynonrecursive.then_some(true),
            read_only_force_recursive: b.readonlyforcerecursive.then_some(true),
        }
    });
    let tmpfs_options = m.tmpfs_options.as_ref().filter(|_| typ == MountType::TMPFS).map(|t| MountTmpfsOptions {
        size_bytes: (t.size_bytes != 0).then_some(t.size_bytes),
        mode: (t.mode != 0).then_some(i64::from(t.mode)),
        options: (!t.options.is_empty()).then(|| {
            t.options
                .split(',')
                .filter(|o| !o.is_empty())
                .map(|o| match o.split_once('=') {
                    Some((k, v)) => vec![k.to_string(), v.to_string()],
                    None => vec![o.to_string()],
                })
                .collect()
        }),
    });
    Ok(Mount {
        target: Some(m.target.clone()),
        source: opt(&m.source),
        typ: Some(typ),
        read_only: m.readonly.then_some(true),
        volume_options,
        bind_options,
        tmpfs_options,
        // The engine keeps it with the container's mount and, on Linux, applies nothing for it.
        consistency: match m.consistency() {
            mount::Consistency::Default => None,
            mount::Consistency::Consistent => Some("consistent".into()),
            mount::Consistency::Cached => Some("cached".into()),
            mount::Consistency::Delegated => Some("delegated".into()),
        },
        ..Default::default()
    })
}

/// The engine's `SecurityOpt` entries for the spec's privileges, as SwarmKit's executor writes them (a default
/// seccomp or AppArmor profile is the engine's own: nothing to say).
pub(crate) fn security_opts(p: &Privileges) -> Vec<String> {
    let mut opts = Vec::new();
    if let Some(c) = &p.selinux_context {
        if c.disable {
            opts.push("label=disable".to_string());
        }
        for (key, value) in [("user", &c.user), ("role", &c.role), ("type", &c.r#type), ("level", &c.level)] {
            if !value.is_empty() {
                opts.push(format!("label={key}:{value}"));
            }
        }
    }
    if let Some(s) = &p.seccomp {
        match s.mode() {
            SeccompMode::Default => {}
            SeccompMode::Unconfined => opts.push("seccomp=unconfined".to_string()),
            // The profile's JSON itself, as the docker CLI sends a file's content.
            SeccompMode::Custom => opts.push(format!("seccomp={}", String::from_utf8_lossy(&s.profile))),
        }
    }
    if p.apparmor.as_ref().is_some_and(|a| a.mode() == AppArmorMode::Disabled) {
        opts.push("apparmor=unconfined".to_string());
    }
    if p.no_new_privileges {
        opts.push("no-new-privileges=true".to_string());
    }
    opts
}

/// The container's log configuration: the task's log driver (the service's, else the cluster's default, as
/// the orchestrator set it); none, or one without a name: the engine's default driver.
pub(crate) fn log_config(task: &Task) -> Option<HostConfigLogConfig> {
    let d = task.log_driver.as_deref().filter(|d| !d.name.is_empty())?;
    Some(HostConfigLogConfig { typ: Some(d.name.clone()), config: (!d.options.is_empty()).then(|| d.options.clone()) })
}

/// The API version of the engine that first applies `Mount.VolumeOptions.Subpath`.
pub(crate) const SUBPATH_API: (usize, usize) = (1, 45);
/// ... `Mount.BindOptions.CreateMountpoint`.
pub(crate) const CREATE_MOUNTPOINT_API: (usize, usize) = (1, 42);
/// ... `Mount.BindOptions.ReadOnlyForceRecursive` (and recursively read-only binds at all: before it, every
/// read-only bind was read-only at its top only).
pub(crate) const READ_ONLY_FORCE_RECURSIVE_API: (usize, usize) = (1, 44);
/// ... `Mount.TmpfsOptions.Options`.
pub(crate) const TMPFS_OPTIONS_API: (usize, usize) = (1, 46);

/// Refuses what the node's engine, speaking API `engine_api` (major, minor), is too old to apply, naming the
/// field and the versions: the engine would ignore it rather than refuse it.
pub(crate) fn refuse_newer_than_engine(task: &Task, engine_api: (usize, usize)) -> Result<(), String> {
    let spec = container_spec(task);
    for (i, m) in spec.mounts.iter().enumerate() {
        let bind = m.bind_options.as_ref();
        let checks = [
            (
                "VolumeOptions.Subpath",
                m.volume_options.as_ref().is_some_and(|v| !v.subpath.is_empty()),
                SUBPATH_API,
                "mount the volume at its root",
            ),
            (
                "BindOptions.CreateMountpoint",
                bind.is_some_and(|b| b.createmountpoint),
                CREATE_MOUNTPOINT_API,
                "create the source directory on the node first",
            ),
            (
                "BindOptions.ReadOnlyForceRecursive",
                bind.is_some_and(|b| b.readonlyforcerecursive),
                READ_ONLY_FORCE_RECURSIVE_API,
                "leave it out (this engine makes only the top of a read-only bind read-only)",
            ),
            (
                "TmpfsOptions.Options",
                m.tmpfs_options.as_ref().is_some_and(|t| !t.options.is_empty()),
                TMPFS_OPTIONS_API,
                "leave the options out (size and mode are applied on any engine)",
            ),
        ];
        for (field, set, needs, instead) in checks {
            if set && engine_api < needs {
                return Err(format!(
                    "Mounts[{i}].{field} needs Docker Engine API {}.{} or later; this node's engine speaks API {}.{}: \
                     {instead}, or run the task on a node with a newer engine",
                    needs.0, needs.1, engine_api.0, engine_api.1
                ));
            }
        }
    }
    Ok(())
}

/// The spec's hosts entries as the engine wants them: SwarmKit's are "IP name [alias...]", Docker's
/// "name:IP" per name.
pub(crate) fn extra_hosts(spec: &ContainerSpec) -> Option<Vec<String>> {
    let hosts: Vec<String> = spec
        .hosts
        .iter()
        .flat_map(|line| {
            let mut parts = line.split_whitespace();
            let ip = parts.next().unwrap_or_default().to_string();
            parts.map(move |name| format!("{name}:{ip}")).collect::<Vec<_>>()
        })
        .collect();
    non_empty(&hosts)
}

/// The create body of a task's container; `holder`: the container whose network namespace it joins (a task
/// on networks, `holder`). Fails (the task is then rejected) when the spec asks for something this executor
/// cannot do.
pub(crate) fn create_body(task: &Task, node_id: &str, holder: Option<&str>) -> Result<ContainerCreateBody, String> {
    let spec = container_spec(task);
    if spec.image.is_empty() {
        return Err("the task has no image; set the service's image".into());
    }
    let mounts = spec.mounts.iter().map(mount_of).collect::<Result<Vec<_>, _>>()?;
    let limits = task.spec.as_ref().and_then(|s| s.resources.as_ref()).and_then(|r| r.limits.as_ref());
    let reservations = task.spec.as_ref().and_then(|s| s.resources.as_ref()).and_then(|r| r.reservations.as_ref());
    // The generic resources the scheduler gave the task first (SwarmKit's DOCKER_RESOURCE_<KIND>), then the spec's.
    let env: Vec<String> =
        shoal_api::generic::env(&task.assigned_generic_resources).into_iter().chain(spec.env.iter().cloned()).collect();
    let healthcheck = spec.healthcheck.as_ref().map(|h| HealthConfig {
        test: non_empty(&h.test),
        interval: nanos(&h.interval),
        timeout: nanos(&h.timeout),
        retries: (h.retries != 0).then_some(h.retries as i64),
        start_period: nanos(&h.start_period),
        start_interval: nanos(&h.start_interval),
    });
    let dns = spec.dns_config.clone().unwrap_or_default();
    let on_host = task.predefined_network() == Some("host");
    let (network_mode, hostname, extra_hosts) = network_settings(task, &spec, holder, &dns)?;
    // Host-mode published ports (SwarmKit's) of a task off networks, bound by the engine on this node;
    // published 0: a port it chooses.
    let (exposed, bindings) = if holder.is_some() || on_host { Default::default() } else { host_port_bindings(task)? };
    let (dns_search, dns_options) =
        if holder.is_some() { (None, None) } else { (non_empty(&dns.search), non_empty(&dns.options)) };
    let host_config = HostConfig {
        network_mode,
        port_bindings: (!bindings.is_empty()).then_some(bindings),
        mounts: (!mounts.is_empty()).then_some(mounts),
        nano_cpus: limits.map(|l| l.nano_cpus).filter(|&n| n > 0),
        memory: limits.map(|l| l.memory_bytes).filter(|&n| n > 0),
        memory_reservation: reservations.map(|r| r.memory_bytes).filter(|&n| n > 0),
        pids_limit: (spec.pids_limit != 0).then_some(spec.pids_limit),
        init: spec.init,
        readonly_rootfs: spec.read_only.then_some(true),
        group_add: non_empty(&spec.groups),
        extra_hosts,
        dns: non_empty(&dns.nameservers),
        dns_search,
        dns_options,
        cap_add: non_empty(&spec.capability_add),
        cap_drop: non_empty(&spec.capability_drop),
        sysctls: (!spec.sysctls.is_empty()).then(|| spec.sysctls.clone()),
        ulimits: (!spec.ulimits.is_empty()).then(|| {
            spec.ulimits
                .iter()
                .map(|u| ResourcesUlimits { name: Some(u.name.clone()), soft: Some(u.soft), hard: Some(u.hard) })
                .collect()
        }),
        oom_score_adj: (spec.oom_score_adj != 0).then_some(spec.oom_score_adj),
        security_opt: spec.privileges.as_ref().map(security_opts).filter(|o| !o.is_empty()),
        log_config: log_config(task),
        ..Default::default()
    };
    Ok(ContainerCreateBody {
        image: Some(spec.image.clone()),
        entrypoint: non_empty(&spec.command),
        cmd: non_empty(&spec.args),
        env: non_empty(&env),
        user: opt(&spec.user),
        working_dir: opt(&spec.dir),
        hostname,
        tty: spec.tty.then_some(true),
        open_stdin: spec.open_stdin.then_some(true),
        labels: Some(labels(task, node_id)),
        stop_signal: opt(&spec.stop_signal),
        stop_timeout: Some(stop_grace_period(task).as_secs() as i64),
        healthcheck,
        exposed_ports: (!exposed.is_empty()).then_some(exposed),
        host_config: Some(host_config),
        ..Default::default()
    })
}

/// The container's exposed ports and the engine's bindings for the task's host-mode ports. An ingress port
/// needs the routing mesh: refused (such a task is attached to `ingress` and never placed here).
fn host_port_bindings(task: &Task) -> Result<(Vec<String>, bollard::models::PortMap), String> {
    use shoal_api::port_config::{Protocol, PublishMode};
    let mut exposed = Vec::new();
    let mut bindings = bollard::models::PortMap::new();
    for p in task.endpoint.iter().flat_map(|e| e.ports.iter()) {
        if p.publish_mode != PublishMode::Host as i32 {
            return Err(format!(
                "port {} is published through the routing mesh, which this node does not have",
                p.target_port
            ));
        }
        let proto = match Protocol::try_from(p.protocol).unwrap_or(Protocol::Tcp) {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        };
        let key = format!("{}/{proto}", p.target_port);
        let host_port = if p.published_port != 0 { p.published_port.to_string() } else { String::new() };
        exposed.push(key.clone());
        bindings
            .entry(key)
            .or_insert_with(|| Some(Vec::new()))
            .get_or_insert_with(Vec::new)
            .push(bollard::models::PortBinding { host_ip: None, host_port: Some(host_port) });
    }
    Ok((exposed, bindings))
}

/// A container's network mode, hostname and extra hosts.
type NetworkSettings = (Option<String>, Option<String>, Option<Vec<String>>);

/// The container's network mode, hostname and extra hosts: in its holder's namespace (`holder`: a task on
/// overlay networks), on the node's own network (`host`), on the engine's default bridge, or on a swarm
/// network of the engine's (macvlan, ipvlan); a task these cannot carry is refused with the reason.
fn network_settings(
    task: &Task,
    spec: &ContainerSpec,
    holder: Option<&str>,
    dns: &shoal_api::container_spec::DnsConfig,
) -> Result<NetworkSettings, String> {
    let on_host = task.predefined_network() == Some("host");
    Ok(match holder {
        None if task.on_overlay() => {
            let a = task.overlay_attachments().next().expect("on an overlay");
            return Err(format!(
                "the task is attached to network {}: this node has no overlay data plane to connect it; it needs a \
                 node that reports the overlay network plugin",
                a.network
                    .as_ref()
                    .and_then(|n| n.spec.as_ref())
                    .and_then(|s| s.annotations.as_ref())
                    .map_or("", |a| a.name.as_str())
            ));
        }
        // The node's own network (`--network host`): the engine refuses a hostname there, so it is refused here
        // with the reason; published ports are the ports the task listens on (no mapping, nothing to bind).
        None if on_host => {
            if !spec.hostname.is_empty() {
                return Err(format!(
                    "ContainerSpec.Hostname {:?}: a task on the host network has the node's hostname; leave --hostname \
                     out",
                    spec.hostname
                ));
            }
            (Some("host".to_string()), None, extra_hosts(spec))
        }
        // The engine's default bridge (`--network bridge`, or no network at all), or a swarm network of the
        // engine's (macvlan, ipvlan: `engine_network`, which makes it first).
        None => {
            let engine_network = super::engine_network::EngineNetwork::of_task(task).map(|n| n.name().to_string());
            (task.predefined_network().map(str::to_string).or(engine_network), opt(&spec.hostname), extra_hosts(spec))
        }
        Some(holder) => {
            // Its published ports are forwarded by the node's data plane into the holder's namespace (ingress
            // ports from every node, host-mode ports from this one), not bound by the engine.
            if let Some(why) = crate::network::desired::ports_unforwardable(task) {
                return Err(why);
            }
            if !dns.nameservers.is_empty() {
                return Err(
                    "a task on a network resolves through the node's resolver (127.0.0.11), which forwards to the \
                     node's own nameservers: ContainerSpec.DNSConfig.Nameservers (--dns) cannot be honoured; remove it"
                        .into(),
                );
            }
            // The holder carries the hostname, resolv.conf and hosts (Docker lets only a namespace's first
            // container set them); this container shares them.
            (Some(format!("container:{holder}")), None, None)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::{Annotations, HealthConfig as ApiHealth, ResourceRequirements, Resources, TaskSpec};

    fn task(c: ContainerSpec) -> Task {
        Task {
            id: "t1".into(),
            service_id: "s1".into(),
            slot: 3,
            node_id: "n1".into(),
            service_annotations: Some(Annotations { name: "web".into(), ..Default::default() }.into()),
            spec: Some(
                TaskSpec {
                    runtime: Some(task_spec::Runtime::Container(c)),
                    resources: Some(ResourceRequirements {
                        limits: Some(Resources { nano_cpus: 500_000_000, memory_bytes: 64 << 20, generic: vec![] }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
                .into(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn host_mode_ports_are_bound_by_the_engine_off_networks_and_left_to_the_data_plane_on_them() {
        use shoal_api::port_config::{Protocol, PublishMode};
        let mut t = task(ContainerSpec { image: "busybox".into(), ..Default::default() });
        let port = |target: u32, published: u32, proto: Protocol| shoal_api::PortConfig {
            target_port: target,
            published_port: published,
            protocol: proto as i32,
            publish_mode: PublishMode::Host as i32,
            ..Default::default()
        };
        t.endpoint = Some(
            shoal_api::Endpoint {
                ports: vec![port(80, 9000, Protocol::Tcp), port(53, 0, Protocol::Udp)],
                ..Default::default()
            }
            .into(),
        );
        let b = create_body(&t, "n1", None).unwrap();
        let mut exposed = b.exposed_ports.clone().unwrap();
        exposed.sort();
        assert_eq!(exposed, ["53/udp", "80/tcp"]);
        let pb = b.host_config.unwrap().port_bindings.unwrap();
        assert_eq!(pb["80/tcp"].as_ref().unwrap()[0].host_port.as_deref(), Some("9000"));
        assert_eq!(pb["53/udp"].as_ref().unwrap()[0].host_port.as_deref(), Some(""), "the engine picks one");
        t.networks = vec![shoal_api::NetworkAttachment::default()];
        assert!(create_body(&t, "n1", None).unwrap_err().contains("no overlay data plane"));
        // On a network: the node's data plane forwards the ports; what it cannot forward is refused.
        t.networks = vec![shoal_api::NetworkAttachment {
            network: Some(shoal_api::Network { id: "net1".into(), ..Default::default() }),
            addresses: vec!["10.0.1.2/24".into()],
            ..Default::default()
        }];
        let e = create_body(&t, "n1", Some("h")).unwrap_err();
        assert!(e.contains("target 53") && e.contains("EndpointSpec.Ports.PublishedPort"), "{e}");
        t.endpoint =
            Some(shoal_api::Endpoint { ports: vec![port(80, 9000, Protocol::Tcp)], ..Default::default() }.into());
        let b = create_body(&t, "n1", Some("h")).unwrap();
        assert_eq!(b.exposed_ports, None, "nothing for the engine to bind");
        assert_eq!(b.host_config.unwrap().port_bindings, None);
    }

    #[test]
    fn a_task_on_a_network_joins_its_holder_which_carries_hostname_dns_and_hosts() {
        let mut t = task(ContainerSpec {
            image: "busybox".into(),
            hostname: "web-1".into(),
            hosts: vec!["10.0.0.9 db".into()],
            dns_config: Some(shoal_api::container_spec::DnsConfig {
                search: vec!["corp".into()],
                ..Default::default()
            }),
            ..Default::default()
        });
        t.networks = vec![shoal_api::NetworkAttachment::default()];
        let b = create_body(&t, "n1", Some("shl-netns.t1")).unwrap();
        let h = b.host_config.unwrap();
        assert_eq!(h.network_mode.as_deref(), Some("container:shl-netns.t1"));
        assert_eq!((b.hostname, h.extra_hosts, h.dns_search, h.dns), (None, None, None, None));
        t.spec = task(ContainerSpec {
            image: "busybox".into(),
            dns_config: Some(shoal_api::container_spec::DnsConfig {
                nameservers: vec!["1.1.1.1".into()],
                ..Default::default()
            }),
            ..Default::default()
        })
        .spec;
        let e = create_body(&t, "n1", Some("h")).unwrap_err();
        assert!(e.contains("DNSConfig.Nameservers"), "{e}");
    }

    /// An attachment to the predefined network `name` (as the manager makes it).
    fn predefined(name: &str) -> shoal_api::NetworkAttachment {
        shoal_api::NetworkAttachment {
            network: Some(shoal_api::Network {
                id: format!("id-{name}"),
                spec: Some(shoal_api::NetworkSpec {
                    annotations: Some(shoal_api::Annotations {
                        name: name.into(),
                        labels: [(shoal_api::PREDEFINED_NETWORK_LABEL.to_string(), "true".to_string())].into(),
                        ..Default::default()
                    }),
                    driver_config: Some(shoal_api::Driver { name: name.into(), ..Default::default() }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_task_on_the_host_or_bridge_network_runs_there_through_the_engine() {
        use shoal_api::port_config::{Protocol, PublishMode};
        let port = shoal_api::PortConfig {
            protocol: Protocol::Tcp as i32,
            target_port: 80,
            published_port: 8080,
            publish_mode: PublishMode::Host as i32,
            ..Default::default()
        };
        let mut t =
            task(ContainerSpec { image: "busybox".into(), hosts: vec!["10.0.0.9 db".into()], ..Default::default() });
        t.networks = vec![predefined("host")];
        let b = create_body(&t, "n1", None).unwrap();
        let h = b.host_config.unwrap();
        assert_eq!(h.network_mode.as_deref(), Some("host"));
        assert_eq!(h.extra_hosts, Some(vec!["db:10.0.0.9".to_string()]));
        assert_eq!((b.hostname, h.port_bindings), (None, None), "the node's hostname and ports");
        t.spec = task(ContainerSpec { image: "busybox".into(), hostname: "web-1".into(), ..Default::default() }).spec;
        assert!(create_body(&t, "n1", None).unwrap_err().contains("leave --hostname out"));

        t.networks = vec![predefined("bridge")];
        t.endpoint = Some(shoal_api::Endpoint { ports: vec![port], ..Default::default() }.into());
        let b = create_body(&t, "n1", None).unwrap();
        assert_eq!(b.hostname.as_deref(), Some("web-1"));
        let h = b.host_config.unwrap();
        assert_eq!(h.network_mode.as_deref(), Some("bridge"));
        assert_eq!(h.port_bindings.unwrap()["80/tcp"].as_ref().unwrap()[0].host_port.as_deref(), Some("8080"));
    }

    #[test]
    fn names_and_labels_follow_swarmkit() {
        let t = task(ContainerSpec { image: "img".into(), ..Default::default() });
        assert_eq!(task_name(&t), "web.3.t1");
        let l = labels(&t, "n1");
        assert_eq!(l[LABEL_SERVICE_ID], "s1");
        assert_eq!(l[LABEL_SERVICE_NAME], "web");
        assert_eq!(l[LABEL_TASK_ID], "t1");
        assert_eq!(l[LABEL_TASK_NAME], "web.3.t1");
        assert_eq!(l[LABEL_NODE_ID], "n1");
        let global = Task { slot: 0, ..t };
        assert_eq!(task_name(&global), "web.n1.t1");
    }

    #[test]
    fn the_create_body_carries_the_spec() {
        let d = |s| Some(shoal_api::duration_to_proto(std::time::Duration::from_secs(s)));
        let t = task(ContainerSpec {
            image: "img:1".into(),
            command: vec!["/bin/sh".into()],
            args: vec!["-c".into(), "echo hi".into()],
            env: vec!["A=1".into()],
            dir: "/tmp".into(),
            user: "nobody".into(),
            hostname: "h".into(),
            stop_signal: "SIGINT".into(),
            stop_grace_period: d(7),
            init: Some(true),
            hosts: vec!["10.0.0.1 db cache".into()],
            mounts: vec![
                shoal_api::Mount {
                    r#type: mount::Type::Bind as i32,
                    source: "/src".into(),
                    target: "/dst".into(),
                    readonly: true,
                    ..Default::default()
                },
                shoal_api::Mount {
                    r#type: mount::Type::Tmpfs as i32,
                    source: String::new(),
                    target: "/scratch".into(),
                    readonly: false,
                    ..Default::default()
                },
            ],
            healthcheck: Some(ApiHealth {
                test: vec!["CMD".into(), "true".into()],
                interval: d(1),
                retries: 2,
                ..Default::default()
            }),
            labels: [("app".to_string(), "x".to_string())].into(),
            ..Default::default()
        });
        let b = create_body(&t, "n1", None).unwrap();
        assert_eq!(b.image.as_deref(), Some("img:1"));
        assert_eq!(b.entrypoint, Some(vec!["/bin/sh".to_string()]));
        assert_eq!(b.cmd, Some(vec!["-c".to_string(), "echo hi".to_string()]));
        assert_eq!(b.env, Some(vec!["A=1".to_string()]));
        assert_eq!(
            (b.working_dir.as_deref(), b.user.as_deref(), b.hostname.as_deref()),
            (Some("/tmp"), Some("nobody"), Some("h"))
        );
        assert_eq!((b.stop_signal.as_deref(), b.stop_timeout), (Some("SIGINT"), Some(7)));
        assert_eq!(b.labels.as_ref().unwrap()["app"], "x");
        let h = b.healthcheck.unwrap();
        assert_eq!((h.test.unwrap().len(), h.interval, h.retries), (2, Some(1_000_000_000), Some(2)));
        let hc = b.host_config.unwrap();
        assert_eq!((hc.nano_cpus, hc.memory, hc.init), (Some(500_000_000), Some(64 << 20), Some(true)));
        assert_eq!(hc.extra_hosts, Some(vec!["db:10.0.0.1".to_string(), "cache:10.0.0.1".to_string()]));
        let m = hc.mounts.unwrap();
        assert_eq!(
            (m[0].typ, m[0].read_only, m[0].source.as_deref()),
            (Some(MountType::BIND), Some(true), Some("/src"))
        );
        assert_eq!((m[1].typ, m[1].target.as_deref()), (Some(MountType::TMPFS), Some("/scratch")));
    }

    #[test]
    fn unusable_specs_are_refused_with_a_reason() {
        let no_image = task(ContainerSpec::default());
        assert!(create_body(&no_image, "n", None).unwrap_err().contains("no image"));
        let bad_bind = task(ContainerSpec {
            image: "i".into(),
            mounts: vec![shoal_api::Mount {
                r#type: mount::Type::Bind as i32,
                target: "/x".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        assert!(create_body(&bad_bind, "n", None).unwrap_err().contains("no source"));
        let npipe = task(ContainerSpec {
            image: "i".into(),
            mounts: vec![shoal_api::Mount {
                r#type: mount::Type::Npipe as i32,
                target: "/x".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        assert!(create_body(&npipe, "n", None).unwrap_err().contains("not supported"));
        let cluster = task(ContainerSpec {
            image: "i".into(),
            mounts: vec![shoal_api::Mount {
                r#type: mount::Type::Cluster as i32,
                source: "data".into(),
                target: "/data".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        let why = create_body(&cluster, "n", None).unwrap_err();
        assert!(
            why.starts_with("the cluster volume \"data\" (type=cluster, target /data) is not published on this node"),
            "{why}"
        );
    }

    #[test]
    fn volume_options_reach_the_engine_and_a_subpath_needs_api_1_45() {
        let volume = |subpath: &str| {
            task(ContainerSpec {
                image: "i".into(),
                mounts: vec![shoal_api::Mount {
                    r#type: mount::Type::Volume as i32,
                    source: "data".into(),
                    target: "/data".into(),
                    volume_options: Some(mount::VolumeOptions {
                        nocopy: true,
                        labels: [("a".to_string(), "b".to_string())].into(),
                        driver_config: Some(shoal_api::Driver {
                            name: "local".into(),
                            options: [("type".to_string(), "tmpfs".to_string())].into(),
                        }),
                        subpath: subpath.into(),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            })
        };
        let b = create_body(&volume(""), "n", None).unwrap();
        let m = &b.host_config.unwrap().mounts.unwrap()[0];
        let v = m.volume_options.as_ref().unwrap();
        assert_eq!((v.no_copy, v.labels.as_ref().unwrap()["a"].as_str()), (Some(true), "b"));
        let d = v.driver_config.as_ref().unwrap();
        assert_eq!((d.name.as_deref(), d.options.as_ref().unwrap()["type"].as_str()), (Some("local"), "tmpfs"));
        assert!(refuse_newer_than_engine(&volume(""), (1, 41)).is_ok());
        let e = refuse_newer_than_engine(&volume("sub"), (1, 41)).unwrap_err();
        assert!(
            e.contains("Mounts[0].VolumeOptions.Subpath needs Docker Engine API 1.45") && e.contains("API 1.41"),
            "{e}"
        );
        assert!(refuse_newer_than_engine(&volume("sub"), (1, 45)).is_ok());
    }

    #[test]
    fn security_resource_and_log_settings_reach_the_host_config() {
        use shoal_api::privileges::{self, AppArmorOpts, SeLinuxContext, SeccompOpts};
        let seccomp = |mode: SeccompMode, profile: &str| {
            let mut s = SeccompOpts { profile: profile.as_bytes().to_vec(), ..Default::default() };
            s.set_mode(mode);
            s
        };
        let mut apparmor = AppArmorOpts::default();
        apparmor.set_mode(AppArmorMode::Disabled);
        let mut t = task(ContainerSpec {
            image: "i".into(),
            capability_add: vec!["NET_ADMIN".into()],
            capability_drop: vec!["CHOWN".into()],
            sysctls: [("net.core.somaxconn".to_string(), "1024".to_string())].into(),
            ulimits: vec![shoal_api::container_spec::Ulimit { name: "nofile".into(), soft: 100, hard: 200 }],
            oom_score_adj: 250,
            privileges: Some(Privileges {
                selinux_context: Some(SeLinuxContext { user: "u".into(), level: "s0".into(), ..Default::default() }),
                seccomp: Some(seccomp(SeccompMode::Custom, "{}")),
                apparmor: Some(apparmor),
                no_new_privileges: true,
                ..Default::default()
            }),
            ..Default::default()
        });
        t.log_driver = Some(Box::new(shoal_api::Driver {
            name: "json-file".into(),
            options: [("max-size".to_string(), "1m".to_string())].into(),
        }));
        let h = create_body(&t, "n", None).unwrap().host_config.unwrap();
        assert_eq!(
            (h.cap_add.unwrap(), h.cap_drop.unwrap()),
            (vec!["NET_ADMIN".to_string()], vec!["CHOWN".to_string()])
        );
        assert_eq!(h.sysctls.unwrap()["net.core.somaxconn"], "1024");
        let u = &h.ulimits.unwrap()[0];
        assert_eq!((u.name.as_deref(), u.soft, u.hard), (Some("nofile"), Some(100), Some(200)));
        assert_eq!(h.oom_score_adj, Some(250));
        assert_eq!(
            h.security_opt.unwrap(),
            ["label=user:u", "label=level:s0", "seccomp={}", "apparmor=unconfined", "no-new-privileges=true"]
        );
        let l = h.log_config.unwrap();
        assert_eq!((l.typ.as_deref(), l.config.unwrap()["max-size"].as_str()), (Some("json-file"), "1m"));
        // Defaults say nothing: the engine's own profiles and log driver.
        let p = Privileges { seccomp: Some(seccomp(SeccompMode::Default, "")), ..Default::default() };
        assert!(security_opts(&p).is_empty());
        let p = Privileges { seccomp: Some(seccomp(SeccompMode::Unconfined, "")), ..Default::default() };
        assert_eq!(security_opts(&p), ["seccomp=unconfined"]);
        let p = Privileges {
            selinux_context: Some(privileges::SeLinuxContext { disable: true, ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(security_opts(&p), ["label=disable"]);
        t.log_driver = Some(Box::default());
        assert_eq!(create_body(&t, "n", None).unwrap().host_config.unwrap().log_config, None);
    }

    #[test]
    fn bind_and_tmpfs_options_reach_the_engine_and_what_it_is_too_old_for_is_refused() {
        use mount::bind_options::Propagation;
        let mounts = |bind: mount::BindOptions, tmpfs: mount::TmpfsOptions| {
            task(ContainerSpec {
                image: "i".into(),
                mounts: vec![
                    shoal_api::Mount {
                        r#type: mount::Type::Bind as i32,
                        source: "/src".into(),
                        target: "/b".into(),
                        bind_options: Some(bind),
                        ..Default::default()
                    },
                    shoal_api::Mount {
                        r#type: mount::Type::Tmpfs as i32,
                        target: "/t".into(),
                        tmpfs_options: Some(tmpfs),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            })
        };
        let mut bind = mount::BindOptions { nonrecursive: true, ..Default::default() };
        bind.set_propagation(Propagation::Rshared);
        let tmpfs = mount::TmpfsOptions { size_bytes: 1 << 20, mode: 0o700, options: String::new() };
        let t = mounts(bind, tmpfs.clone());
        let m = create_body(&t, "n", None).unwrap().host_config.unwrap().mounts.unwrap();
        let b = m[0].bind_options.as_ref().unwrap();
        assert_eq!(
            (b.propagation, b.non_recursive, b.create_mountpoint),
            (Some(MountBindOptionsPropagationEnum::RSHARED), Some(true), None)
        );
        let tm = m[1].tmpfs_options.as_ref().unwrap();
        assert_eq!((tm.size_bytes, tm.mode, &tm.options), (Some(1 << 20), Some(0o700), &None));
        assert!(refuse_newer_than_engine(&t, (1, 41)).is_ok());
        for (bind, tmpfs, field, needs) in [
            (
                mount::BindOptions { createmountpoint: true, ..Default::default() },
                tmpfs.clone(),
                "Mounts[0].BindOptions.CreateMountpoint",
                "1.42",
            ),
            (
                mount::BindOptions { readonlyforcerecursive: true, ..Default::default() },
                tmpfs.clone(),
                "Mounts[0].BindOptions.ReadOnlyForceRecursive",
                "1.44",
            ),
            (
                bind,
                mount::TmpfsOptions { options: "noexec,nr_inodes=1k".into(), ..Default::default() },
                "Mounts[1].TmpfsOptions.Options",
                "1.46",
            ),
        ] {
            let t = mounts(bind, tmpfs);
            let e = refuse_newer_than_engine(&t, (1, 41)).unwrap_err();
            assert!(e.contains(&format!("{field} needs Docker Engine API {needs}")) && e.contains("API 1.41"), "{e}");
            assert!(refuse_newer_than_engine(&t, (1, 47)).is_ok());
            let m = create_body(&t, "n", None).unwrap().host_config.unwrap().mounts.unwrap();
            if field.contains("Options.Options") {
                let o = m[1].tmpfs_options.as_ref().unwrap().options.clone().unwrap();
                assert_eq!(o, [vec!["noexec".to_string()], vec!["nr_inodes".to_string(), "1k".to_string()]]);
            }
        }
    }
}
