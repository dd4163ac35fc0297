# The Python Docker SDK (docker 7.x) against a Shoal daemon, as a user of the SDK would drive it: swarm, nodes,
# services (create replicated and global, inspect, scale, update, rollback, logs, remove; jobs run to
# completion; the fields Shoal cannot honour yet refused with a 400 the SDK raises), secrets and configs
# (create, list, get, referenced by a service, remove), and a worker token rotation.
# Run by engine_api_python.rs with SHOAL_SOCKET set; prints OK at the end, raises on the first difference.
import os
import time

import docker
from docker.errors import APIError
from docker.types import ServiceMode

client = docker.DockerClient(base_url="unix://" + os.environ["SHOAL_SOCKET"], version="1.47", timeout=60)
api = client.api


# `wait(what, cond, limit)` comes from wait.py, put before this script.


def running(svc):
    return [t for t in svc.tasks() if t["Status"]["State"] == "running" and t["DesiredState"] == "running"]


def replicas(svc):
    svc.reload()
    return svc.attrs["Spec"]["Mode"]["Replicated"]["Replicas"]


def env(svc):
    svc.reload()
    return svc.attrs["Spec"]["TaskTemplate"]["ContainerSpec"].get("Env") or []


# The daemon.
assert client.ping()
assert client.version()["ApiVersion"] == "1.47"
info = client.info()
assert info["Swarm"]["LocalNodeState"] == "active", info["Swarm"]
assert info["Swarm"]["ControlAvailable"] is True, info["Swarm"]

# Swarm: inspect, and a partial update (the SDK sends only the fields given, others null).
client.swarm.reload()
assert client.swarm.id
retention = client.swarm.attrs["Spec"]["Orchestration"]["TaskHistoryRetentionLimit"]
assert client.swarm.update(snapshot_interval=5000)
client.swarm.reload()
spec = client.swarm.attrs["Spec"]
assert spec["Raft"]["SnapshotInterval"] == 5000, spec
assert spec["Orchestration"]["TaskHistoryRetentionLimit"] == retention, spec
assert client.swarm.attrs["JoinTokens"]["Worker"].startswith("SWMTKN-1-")

# Nodes: list, inspect, update.
nodes = client.nodes.list()
assert len(nodes) == 1, nodes
node = nodes[0]
assert node.attrs["Spec"]["Role"] == "manager"
assert node.update({"Availability": "active", "Role": "manager", "Labels": {"zone": "a"}})
node.reload()
assert node.attrs["Spec"]["Labels"] == {"zone": "a"}, node.attrs["Spec"]
assert client.nodes.list(filters={"role": "manager"})[0].id == node.id

# Services: create replicated with 5 replicas (the SDK sends {"Mode": {"replicated": {"Replicas": 5}}}).
svc = client.services.create(
    "busybox",
    command=["sh", "-c", "echo hello-from-sdk; sleep 3141"],
    name="sdk-web",
    mode=ServiceMode("replicated", replicas=5),
)
assert replicas(svc) == 5
wait("5 running tasks", lambda: len(running(svc)) == 5)
assert client.services.get("sdk-web").id == svc.id
assert [s.id for s in client.services.list(filters={"name": "sdk-web"})] == [svc.id]

# Scale.
assert svc.scale(3)
assert replicas(svc) == 3
wait("3 running tasks", lambda: len(running(svc)) == 3)

# Update (the SDK fetches the current spec and sends it back changed), then roll back to the previous spec
# (the SDK has no call for it: its low-level client posts ?rollback=previous as the docker CLI does).
svc.reload()
svc.update(env=["COLOUR=blue"])
assert "COLOUR=blue" in env(svc), env(svc)
svc.reload()
url = api._url("/services/{0}/update", svc.id)
resp = api._post_json(url, data=svc.attrs["Spec"], params={"version": svc.version, "rollback": "previous"})
api._raise_for_status(resp)
assert "COLOUR=blue" not in env(svc), env(svc)
assert replicas(svc) == 3

# Logs of every task.
wait("the tasks' logs", lambda: b"hello-from-sdk" in b"".join(svc.logs(stdout=True, stderr=True)))

# Global mode: the SDK sends {"Mode": {"global": {}}}; the service is global (not turned into a replicated one).
glob = client.services.create("busybox", command=["sleep", "3141"], name="sdk-global", mode=ServiceMode("global"))
glob.reload()
assert "Global" in glob.attrs["Spec"]["Mode"] and "Replicated" not in glob.attrs["Spec"]["Mode"], glob.attrs["Spec"]
# It runs one task per node (slot 0, bound to its node), and the service list's status counts them.
node_ids = sorted(n.id for n in client.nodes.list())


def global_running():
    tasks = glob.tasks(filters={"desired-state": "running"})
    running = [t for t in tasks if t["Status"]["State"] == "running"]
    return running if sorted(t["NodeID"] for t in running) == node_ids and len(tasks) == len(node_ids) else None


running = wait("one running task of the global service per node", global_running)
assert all(t.get("Slot", 0) == 0 for t in running), running
status = wait(
    "the global service's status",
    lambda: [
        s.attrs.get("ServiceStatus")
        for s in client.services.list(filters={"name": "sdk-global"}, status=True)
        if s.attrs.get("ServiceStatus", {}).get("RunningTasks") == len(node_ids)
    ],
)[0]
assert status["DesiredTasks"] == len(node_ids), status
glob.remove()
wait("the global service gone", lambda: client.services.list(filters={"name": "sdk-global"}) == [])

# Jobs run to completion: a replicated job of 3 completions one at a time, a global job once per node.
job = client.services.create("busybox", command=["true"], name="sdk-job", mode=ServiceMode("replicated-job", concurrency=1, replicas=3))
job.reload()
assert job.attrs["Spec"]["Mode"] == {"ReplicatedJob": {"MaxConcurrent": 1, "TotalCompletions": 3}}, job.attrs["Spec"]["Mode"]
assert job.attrs["JobStatus"]["JobIteration"] == {"Index": 0}, job.attrs


def completed(svc):
    return [t for t in svc.tasks() if t["Status"]["State"] == "complete"]


done = wait("3 completed tasks of the job", lambda: len(completed(job)) == 3 and completed(job))
assert sorted(t.get("Slot", 0) for t in done) == [0, 1, 2], done
assert all(t["JobIteration"] == {"Index": 0} and t["DesiredState"] == "complete" for t in done), done
assert len(job.tasks()) == 3, job.tasks()
status = [s.attrs["ServiceStatus"] for s in client.services.list(filters={"name": "sdk-job"}, status=True)][0]
assert status == {"RunningTasks": 0, "DesiredTasks": 1, "CompletedTasks": 3}, status
job.remove()
once = client.services.create("busybox", command=["true"], name="sdk-once", mode=ServiceMode("global-job"))
wait("the global job completed on every node", lambda: sorted(t["NodeID"] for t in completed(once)) == node_ids)
once.remove()
wait("the jobs gone", lambda: [s.name for s in client.services.list() if s.name in ("sdk-job", "sdk-once")] == [])

# What Shoal cannot honour yet is refused with a 400 naming the field, and nothing is created (global mode,
# which the SDK checks above, is accepted: its orchestrator is being built).
from docker.types import EndpointSpec, Mount, Privileges, SecretReference

refused = [
    (dict(networks=["backend"]), "network backend not found"),
    (dict(endpoint_spec=EndpointSpec(mode="dnsrr", ports={8080: 80})), "can't be used with dnsrr mode"),
    # Secrets are supported; one that does not exist is refused, naming it.
    (dict(secrets=[SecretReference("abc", "pw")]), "secret not found: pw"),
    # Linux has no credential specs (Windows gMSA).
    (dict(privileges=Privileges(credentialspec_file="spec.json")), "Privileges.CredentialSpec is not supported yet"),
    # (A plain dict: the SDK's Mount refuses the combination itself.)
    (dict(mounts=[{"Type": "bind", "Source": "/tmp", "Target": "/v", "VolumeOptions": {"NoCopy": True}}]),
     'VolumeOptions must not be specified on mount type "bind"'),
]
for kwargs, fragment in refused:
    try:
        client.services.create("busybox", command=["sleep", "3141"], name="sdk-refused", **kwargs)
    except APIError as e:
        assert e.status_code == 400, (kwargs, e)
        assert fragment in e.explanation, (fragment, e.explanation)
    else:
        raise AssertionError(f"{kwargs} accepted")
assert client.services.list(filters={"name": "sdk-refused"}) == []
# A plain bind mount is honoured (by the docker executor) and accepted.
bound = client.services.create("busybox", command=["sleep", "3141"], name="sdk-bind",
                               mounts=[Mount("/data", "/tmp", type="bind", read_only=True)])
bound.reload()
assert bound.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Mounts"][0]["ReadOnly"] is True, bound.attrs["Spec"]
bound.remove()
# Capabilities, sysctls, an init, no-new-privileges and a log driver are honoured (the docker executor applies
# them) and shown back as sent.
tuned = client.services.create("busybox", command=["sleep", "3141"], name="sdk-tuned", cap_add=["CAP_NET_ADMIN"],
                               cap_drop=["CAP_CHOWN"], sysctls={"net.core.somaxconn": "1024"}, init=True,
                               log_driver="json-file", log_driver_options={"max-size": "1m"})
tuned.reload()
c = tuned.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]
assert (c["CapabilityAdd"], c["CapabilityDrop"], c["Sysctls"], c["Init"]) == (
    ["CAP_NET_ADMIN"], ["CAP_CHOWN"], {"net.core.somaxconn": "1024"}, True), c
assert tuned.attrs["Spec"]["TaskTemplate"]["LogDriver"] == {"Name": "json-file", "Options": {"max-size": "1m"}}, tuned.attrs
tuned.remove()
# A named volume with options (what every compose file's named volume sends) is honoured and shown back.
from docker.types import DriverConfig

vol = client.services.create("busybox", command=["sleep", "3141"], name="sdk-vol", mounts=[
    Mount("/v", "vol", no_copy=True, labels={"a": "b"}, driver_config=DriverConfig("local", {"type": "tmpfs"}))])
vol.reload()
options = vol.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Mounts"][0]["VolumeOptions"]
assert options == {"NoCopy": True, "Labels": {"a": "b"}, "DriverConfig": {"Name": "local", "Options": {"type": "tmpfs"}}}, options
vol.remove()

# Secrets and configs: made, listed, read (a secret never with its data, a config with it), referenced by a
# service, not removable while it uses them, removable after.
import base64

from docker.types import ConfigReference

secret = client.secrets.create(name="sdk_pw", data=b"s3cret-pw", labels={"env": "test"})
got = client.secrets.get(secret.id)
assert got.name == "sdk_pw" and got.attrs["Spec"]["Labels"] == {"env": "test"}, got.attrs
assert "Data" not in got.attrs["Spec"] and "s3cret" not in str(got.attrs), got.attrs
assert [s.id for s in client.secrets.list(filters={"name": "sdk_"})] == [secret.id]
assert [s.id for s in client.secrets.list(filters={"label": "env=test"})] == [secret.id]
assert client.secrets.list(filters={"label": "env=prod"}) == []
try:
    client.secrets.create(name="sdk_pw", data=b"again")
except APIError as e:
    assert e.status_code == 409 and "already exists" in e.explanation, e
else:
    raise AssertionError("a second secret named sdk_pw was accepted")
config = client.configs.create(name="sdk.conf", data=b"port=80\n", labels={"a": "b"})
got = client.configs.get("sdk.conf")
assert got.id == config.id and base64.b64decode(got.attrs["Spec"]["Data"]) == b"port=80\n", got.attrs
assert [c.id for c in client.configs.list(filters={"name": "sdk."})] == [config.id]
used = client.services.create(
    "busybox", command=["sleep", "3141"], name="sdk-secret",
    secrets=[SecretReference(secret.id, "sdk_pw")],
    configs=[ConfigReference(config.id, "sdk.conf", filename="/etc/sdk.conf")],
)
used.reload()
c = used.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]
assert c["Secrets"] == [{"File": {"Name": "sdk_pw", "UID": "0", "GID": "0", "Mode": 0o444},
                         "SecretID": secret.id, "SecretName": "sdk_pw"}], c
assert c["Configs"][0]["File"]["Name"] == "/etc/sdk.conf" and c["Configs"][0]["ConfigID"] == config.id, c
for obj, kind in [(secret, "secret"), (config, "config")]:
    try:
        obj.remove()
    except APIError as e:
        assert e.status_code == 400, e
        assert "in use by the following service: sdk-secret" in e.explanation, e.explanation
    else:
        raise AssertionError(f"a {kind} in use was removed")
used.remove()
assert secret.remove() and config.remove()
assert client.secrets.list(filters={"name": "sdk_"}) == [] and client.configs.list(filters={"name": "sdk."}) == []

# Swarm: rotating the worker join token changes it and leaves the manager's.
client.swarm.reload()
tokens = client.swarm.attrs["JoinTokens"]
assert client.swarm.update(rotate_worker_token=True)
client.swarm.reload()
rotated = client.swarm.attrs["JoinTokens"]
assert rotated["Worker"] != tokens["Worker"] and rotated["Worker"].startswith("SWMTKN-1-"), (tokens, rotated)
assert rotated["Manager"] == tokens["Manager"], (tokens, rotated)

# Remove.
svc.remove()
wait("the service gone", lambda: client.services.list(filters={"name": "sdk-web"}) == [])
print("OK")
