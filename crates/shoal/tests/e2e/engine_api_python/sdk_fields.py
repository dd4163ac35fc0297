# The Python Docker SDK (docker 7.x) setting the service, swarm and network fields of issue 32 as a user of the
# SDK would, against a Shoal daemon with the docker executor, each checked where the engine would show it: the
# running container (through the engine's own API, ENGINE_SOCKET), not only the spec read back.
# - A service with every container-spec keyword the SDK has (templated hostname and env, user, workdir, groups,
#   read-only root, stop signal and grace period, tty and stdin, hosts, DNS, labels, healthcheck, init,
#   capabilities, sysctls, SELinux labels, a tmpfs with a size and mode, a named volume with labels and driver
#   options), resources, a restart policy, placement, a log driver, an update and rollback config and a
#   host-mode port.
# - Networks: an overlay with an IPAM pool (range, gateway, auxiliary addresses), labels, internal and
#   attachable, read back as the engine shows them.
# - Swarm init on a daemon in no swarm (INIT_SOCKET): the address pool, subnet size, data path port and data
#   path address.
# Run by engine_api_python.rs; prints OK at the end, raises on the first difference.
import os
import time

import docker
from docker.types import (DNSConfig, DriverConfig, EndpointSpec, Healthcheck, IPAMConfig, IPAMPool, Mount,
                          Placement, Privileges, Resources, RestartPolicy, RollbackConfig, UpdateConfig)

client = docker.DockerClient(base_url="unix://" + os.environ["SHOAL_SOCKET"], version="1.47", timeout=60)
engine = docker.DockerClient(base_url="unix://" + os.environ["ENGINE_SOCKET"], version="auto", timeout=60)
image = os.environ["TEST_IMAGE"]
SECOND = 1_000_000_000


# `wait(what, cond, limit)` comes from wait.py, put before this script.


def container_of(svc):
    def running():
        for t in svc.tasks():
            if t["Status"]["State"] == "running":
                return t
        return None
    task = wait(f"a running task of {svc.name}", running)
    found = engine.containers.list(filters={"label": f"com.docker.swarm.task.id={task['ID']}"})
    assert len(found) == 1, found
    return task, found[0]


# One service with every field the SDK sets.
svc = client.services.create(
    image,
    command=["sh", "-c", "mkdir -p /www; hostname > /www/index.html; exec httpd -f -p 80 -h /www"],
    name="sdkf-web",
    hostname="{{.Service.Name}}-{{.Task.Slot}}",
    env=["NODE={{.Node.Hostname}}", "PLAIN=1"],
    user="0:0",
    workdir="/tmp",
    groups=["100"],
    read_only=False,
    stop_signal="SIGUSR1",
    stop_grace_period=3 * SECOND,
    tty=True,
    open_stdin=True,
    hosts={"db.local": "10.9.8.7"},
    dns_config=DNSConfig(nameservers=["10.9.8.53"], search=["example.internal"], options=["ndots:2"]),
    container_labels={"tier": "web"},
    labels={"svc": "yes"},
    healthcheck=Healthcheck(test=["CMD", "true"], interval=SECOND, timeout=SECOND, retries=3, start_period=SECOND),
    init=True,
    cap_add=["CAP_NET_ADMIN"],
    cap_drop=["CAP_MKNOD"],
    sysctls={"net.ipv4.ip_unprivileged_port_start": "0"},
    privileges=Privileges(selinux_user="user_u", selinux_role="role_r", selinux_type="type_t", selinux_level="s0"),
    mounts=[
        Mount("/scratch", None, type="tmpfs", tmpfs_size=4 * 1024 * 1024, tmpfs_mode=0o1770),
        Mount("/data", "sdkf-{{.Service.Name}}-{{.Task.Slot}}", no_copy=True, labels={"keep": "no"},
              driver_config=DriverConfig("local", {"type": "tmpfs", "device": "tmpfs", "o": "size=1m"})),
    ],
    resources=Resources(cpu_limit=SECOND // 2, mem_limit=64 * 1024 * 1024, mem_reservation=16 * 1024 * 1024),
    restart_policy=RestartPolicy(condition="on-failure", delay=SECOND, max_attempts=3),
    constraints=["node.role==manager"],
    log_driver="json-file",
    log_driver_options={"max-size": "1m", "max-file": "2"},
    update_config=UpdateConfig(parallelism=2, delay=5 * SECOND, order="start-first", failure_action="rollback"),
    rollback_config=RollbackConfig(parallelism=1, delay=SECOND),
    endpoint_spec=EndpointSpec(ports={18480: (80, "tcp", "host")}),
)
task, c = container_of(svc)
cfg, host = c.attrs["Config"], c.attrs["HostConfig"]
assert cfg["Hostname"] == "sdkf-web-1", cfg["Hostname"]
node = client.nodes.get(task["NodeID"]).attrs["Description"]["Hostname"]
assert f"NODE={node}" in cfg["Env"] and "PLAIN=1" in cfg["Env"], cfg["Env"]
assert (cfg["User"], cfg["WorkingDir"], cfg["StopSignal"], cfg["Tty"], cfg["OpenStdin"]) == (
    "0:0", "/tmp", "SIGUSR1", True, True), cfg
assert cfg["StopTimeout"] == 3, cfg.get("StopTimeout")
assert cfg["Labels"]["tier"] == "web" and cfg["Labels"]["com.docker.swarm.service.name"] == "sdkf-web", cfg["Labels"]
assert cfg["Healthcheck"] == {"Test": ["CMD", "true"], "Interval": SECOND, "Timeout": SECOND, "StartPeriod": SECOND,
                              "Retries": 3}, cfg["Healthcheck"]
assert host["GroupAdd"] == ["100"] and host["ReadonlyRootfs"] is False, host
assert "db.local:10.9.8.7" in host["ExtraHosts"], host["ExtraHosts"]
assert (host["Dns"], host["DnsSearch"], host["DnsOptions"]) == (["10.9.8.53"], ["example.internal"], ["ndots:2"]), host
assert host["Init"] is True and host["CapAdd"] == ["CAP_NET_ADMIN"] and host["CapDrop"] == ["CAP_MKNOD"], host
assert host["Sysctls"] == {"net.ipv4.ip_unprivileged_port_start": "0"}, host["Sysctls"]
for label in ["label=user:user_u", "label=role:role_r", "label=type:type_t", "label=level:s0"]:
    assert label in (host["SecurityOpt"] or []), host["SecurityOpt"]
assert (host["NanoCpus"], host["Memory"], host["MemoryReservation"]) == (SECOND // 2, 64 << 20, 16 << 20), host
assert host["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "1m", "max-file": "2"}}, host["LogConfig"]
assert host["PortBindings"] == {"80/tcp": [{"HostIp": "", "HostPort": "18480"}]}, host["PortBindings"]
mounts = {m["Target"]: m for m in host["Mounts"]}
assert mounts["/scratch"]["TmpfsOptions"] == {"SizeBytes": 4 << 20, "Mode": 0o1770}, mounts["/scratch"]
assert mounts["/data"]["Source"] == "sdkf-sdkf-web-1" and mounts["/data"]["VolumeOptions"]["NoCopy"] is True, mounts
volume = engine.volumes.get("sdkf-sdkf-web-1")
assert volume.attrs["Labels"]["keep"] == "no" and volume.attrs["Options"]["o"] == "size=1m", volume.attrs
# What only the manager reads is shown back as sent.
spec = client.services.get("sdkf-web").attrs["Spec"]
tt = spec["TaskTemplate"]
assert tt["RestartPolicy"] == {"Condition": "on-failure", "Delay": SECOND, "MaxAttempts": 3, "Window": 0}, tt[
    "RestartPolicy"]
assert tt["Placement"]["Constraints"] == ["node.role==manager"], tt["Placement"]
# (MaxFailureRatio is always shown, as the engine's type has no omitempty there.)
assert spec["UpdateConfig"] == {"Parallelism": 2, "Delay": 5 * SECOND, "FailureAction": "rollback",
                                "MaxFailureRatio": 0, "Order": "start-first"}, spec["UpdateConfig"]
assert spec["RollbackConfig"]["Parallelism"] == 1 and spec["RollbackConfig"]["Delay"] == SECOND, spec
assert spec["Labels"] == {"svc": "yes"}, spec["Labels"]
# The service's task status shows the host-mode port it binds.
ports = wait("the task's port status", lambda: [t for t in svc.tasks() if t["Status"].get("PortStatus", {}).get("Ports")])
assert ports[0]["Status"]["PortStatus"]["Ports"][0]["PublishedPort"] == 18480, ports[0]["Status"]
svc.remove()
wait("the service's containers gone",
     lambda: engine.containers.list(all=True, sparse=True,
                                    filters={"label": "com.docker.swarm.service.name=sdkf-web"}) == [])
try:
    engine.volumes.get("sdkf-sdkf-web-1").remove()
except docker.errors.NotFound:
    pass

# Networks: an IPAM pool with a range, gateway and auxiliary addresses, labels, internal and attachable.
pool = IPAMPool(subnet="10.231.0.0/24", iprange="10.231.0.128/25", gateway="10.231.0.254",
                aux_addresses={"printer": "10.231.0.10"})
net = client.networks.create("sdkf-net", driver="overlay", ipam=IPAMConfig(pool_configs=[pool]), internal=True,
                             attachable=True, labels={"team": "a"}, scope="swarm")
got = client.networks.get(net.id).attrs
assert (got["Driver"], got["Scope"], got["Internal"], got["Attachable"], got["Labels"]) == (
    "overlay", "swarm", True, True, {"team": "a"}), got
assert got["IPAM"]["Config"] == [{"Subnet": "10.231.0.0/24", "IPRange": "10.231.0.128/25", "Gateway": "10.231.0.254",
                                  "AuxiliaryAddresses": {"printer": "10.231.0.10"}}], got["IPAM"]
assert [n.id for n in client.networks.list(names=["sdkf-net"])] == [net.id]
net.remove()
assert client.networks.list(names=["sdkf-net"]) == []

# An IPv6 overlay: its IPv6 subnet beside an IPv4 one chosen from the pools, the gateway its first address.
v6 = client.networks.create("sdkf-v6", driver="overlay", enable_ipv6=True,
                            ipam=IPAMConfig(pool_configs=[IPAMPool(subnet="fd00:231::/64")]))
got = client.networks.get(v6.id).attrs
configs = got["IPAM"]["Config"]
assert got["EnableIPv6"] is True and len(configs) == 2, got
assert configs[1]["Subnet"] == "fd00:231::/64" and configs[1]["Gateway"] == "fd00:231::1", configs
assert configs[0]["Subnet"].startswith("10."), configs
v6.remove()
try:
    client.networks.create("sdkf-v6bad", driver="overlay", enable_ipv6=True)
    raise AssertionError("an IPv6 network without an IPv6 subnet was made")
except docker.errors.APIError as e:
    assert e.status_code == 400 and "needs an IPv6 subnet" in str(e), e

# Swarm init with the networking options, on a daemon in no swarm.
init = docker.DockerClient(base_url="unix://" + os.environ["INIT_SOCKET"], version="1.47", timeout=60)
listen = os.environ["INIT_LISTEN"]
init.swarm.init(advertise_addr=listen, listen_addr=listen, default_addr_pool=["10.240.0.0/16"], subnet_size=26,
                data_path_port=7790, data_path_addr="10.241.0.9")
init.swarm.reload()
attrs = init.swarm.attrs
assert (attrs["DefaultAddrPool"], attrs["SubnetSize"], attrs["DataPathPort"]) == (["10.240.0.0/16"], 26, 7790), attrs
me = wait("the node with its data path address", lambda: [
    n for n in init.nodes.list()
    if n.attrs["Description"].get("Engine", {}).get("Labels", {}).get("shoal.data-path-addr") == "10.241.0.9"])
assert len(me) == 1, me
made = init.networks.create("sdkf-pooled", driver="overlay")
subnet = init.networks.get(made.id).attrs["IPAM"]["Config"][0]["Subnet"]
assert subnet.startswith("10.240.") and subnet.endswith("/26"), subnet
made.remove()
print("OK")
