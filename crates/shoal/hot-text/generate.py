#!/usr/bin/env python3
"""Writes shoald.ld, the list of the daemon's functions that a start, an idle minute's first seconds and the common
requests run, which crates/shoal/build.rs gives the linker so that they sit together at the front of the text.

    crates/shoal/hot-text/generate.py target/release/shoald    # a release build; needs valgrind and nm

It runs that shoald under callgrind (one-node daemon, process executor, as `shoal-bench memory` starts it): the
start and 5 idle seconds (tier 1), then the requests of `workload` (tier 2: creates, lists, inspects, a running
task), then a SIGTERM (tier 3: the shutdown); tier 4 holds the other instances of the generic functions met. With perf
installed it also runs the same natively (`perf record -e page-faults`) and adds the functions whose first touch
faulted outside those lists to tier 1: code valgrind's CPU does not take (CPU-feature dispatch).
Each executed function's symbol is written with its hash (`17h<16 hex digits>E`) replaced by `*` where that names
one function of the binary, so that the list stays good across dependency and compiler updates (which change every
hash); instances of generic functions differ only by their hashes and are written whole. The list goes stale as
functions are renamed or added to those paths and as hashes change; a stale list costs resident memory, never
correctness (BENCHMARKS.md, session 20). Run it again on a build whose idle RSS grew (`shoal-bench memory --tasks
0`), then rebuild.
"""
import bisect
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HASH = re.compile(r"17h[0-9a-f]{16}E$")
GENERIC_TIER_BYTES = 32 << 10
PROFILE_RUNS = 2


def request(sock, method, path, body=None):
    c = socket.socket(socket.AF_UNIX)
    c.connect(sock)
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    c.sendall(head.encode() + data)
    out = b""
    while True:
        b = c.recv(65536)
        if not b:
            break
        out += b
    c.close()
    return out


def service(name, replicas, pending=True):
    template = {"ContainerSpec": {"Image": "busybox", "Args": ["sleep", "3600"]}}
    if pending:
        template["Placement"] = {"Constraints": ["node.labels.shoal-bench==nowhere"]}
    return {"Name": name, "TaskTemplate": template, "Mode": {"Replicated": {"Replicas": replicas}}}


def workload(sock):
    for path in ["/_ping", "/version", "/info", "/swarm", "/nodes"]:
        request(sock, "GET", path)
    for i in range(20):
        request(sock, "POST", "/services/create", service(f"p{i}", 10))
    request(sock, "POST", "/services/create", service("run", 1, pending=False))
    time.sleep(2)
    tasks_of_p1 = "/tasks?filters=%7B%22service%22%3A%5B%22p1%22%5D%7D"
    for path in ["/services", "/tasks", "/services/p1", tasks_of_p1, "/nodes", "/info"]:
        request(sock, "GET", path)
    request(sock, "DELETE", "/services/run")
    time.sleep(1)


def ready(sock):
    try:
        return request(sock, "GET", "/_ping").startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def executed(path, binary):
    """The executed instruction addresses of `binary` in one callgrind dump (`--dump-instr=yes`)."""
    obs, cur, pos, out = {}, None, 0, set()
    for line in open(path, errors="replace"):
        if line.startswith(("ob=", "cob=")):
            # An object's name is given once, where its number first appears (either line).
            m = re.match(r"c?ob=\((\d+)\)(?: (.*))?", line.strip())
            if m.group(2) is not None:
                obs[m.group(1)] = m.group(2)
            if line.startswith("ob="):
                cur = obs.get(m.group(1))
            continue
        c = line[:1]
        if line.startswith("0x"):
            pos = int(line.split()[0], 16)
        elif c in "+-":
            pos += int(line.split()[0])
        elif c != "*":
            continue
        if cur == binary:
            out.add(pos)
    return out


def daemon_args(binary, d):
    """`shoald daemon` as `shoal-bench memory` starts it, on state dir `d`; returns (args, control socket)."""
    sock = os.path.join(d, "control.sock")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    args = [binary, "daemon", "--state-dir", os.path.join(d, "state"), "--listen-control-api", sock,
            "--listen-remote-api", f"127.0.0.1:{port}", "--executor", "process", "--hostname", "shoal-bench-manager"]
    return args, sock


def native_faults(binary):
    """The text addresses (link-time) whose first touch faulted in a native run of the same start, idle seconds and
    requests, with `perf record -e page-faults`: code that valgrind's CPU does not run (CPU-feature dispatch:
    SHA-NI, AVX-512 paths) shows there. Empty without perf. Only a folio's first touch faults, so a stray folio
    names one function per run."""
    if shutil.which("perf") is None:
        print("perf not found: the list has callgrind's functions only")
        return set()
    segments = subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True, check=True).stdout
    load = next(line.split() for line in segments.splitlines() if line.split()[:1] == ["LOAD"] and " R E " in line)
    delta = int(load[2], 16) - int(load[1], 16)
    with tempfile.TemporaryDirectory(prefix="hot-text-perf-") as d:
        args, sock = daemon_args(binary, d)
        data = os.path.join(d, "perf.data")
        log = open(os.path.join(d, "log"), "w")
        fd = os.open(binary, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        perf = subprocess.Popen(["perf", "record", "-q", "-c", "1", "-d", "-e", "page-faults", "-o", data, "--"] + args,
                                stdout=log, stderr=log, env=dict(os.environ, SHOAL_LOG="info"))
        deadline = time.time() + 60
        while not ready(sock):
            if time.time() > deadline or perf.poll() is not None:
                sys.exit("the daemon did not answer under perf; its log:\n" + open(log.name).read())
            time.sleep(0.01)
        time.sleep(5)
        workload(sock)
        pid = int(open(os.path.join(d, "state", "shoal.lock")).read().strip())
        os.kill(pid, signal.SIGTERM)
        perf.wait(timeout=120)
        script = subprocess.run(["perf", "script", "-i", data, "--show-mmap-events", "-F", "pid,addr"],
                                capture_output=True, text=True).stdout
    text = None
    out = set()
    mmap = re.compile(r"PERF_RECORD_MMAP2 (\d+)/\d+: \[0x([0-9a-f]+)\(0x([0-9a-f]+)\) @ 0x([0-9a-f]+) .*\]: r-xp (\S+)")
    for line in script.splitlines():
        m = mmap.search(line)
        if m and m.group(5) == binary and int(m.group(1)) == pid:
            text = (int(m.group(2), 16), int(m.group(3), 16), int(m.group(4), 16))
            continue
        p = line.split()
        if text is None or len(p) != 2 or not p[0].isdigit() or int(p[0]) != pid:
            continue
        addr = int(p[1], 16)
        if text[0] <= addr < text[0] + text[1]:
            out.add(addr - text[0] + text[2] + delta)
    return out


def callgrind_tiers(binary):
    """The executed text addresses of one run under callgrind: [start and idle, requests, shutdown]."""
    with tempfile.TemporaryDirectory(prefix="hot-text-") as d:
        out = os.path.join(d, "cg")
        args, sock = daemon_args(binary, d)
        args = ["valgrind", "--tool=callgrind", "--dump-instr=yes", f"--callgrind-out-file={out}"] + args
        log = open(os.path.join(d, "log"), "w")
        daemon = subprocess.Popen(args, stdout=log, stderr=log, env=dict(os.environ, SHOAL_LOG="info"))
        deadline = time.time() + 120
        while not ready(sock):
            if time.time() > deadline or daemon.poll() is not None:
                sys.exit("the daemon did not answer under callgrind; its log:\n" + open(log.name).read())
            time.sleep(0.1)
        time.sleep(5)
        subprocess.run(["callgrind_control", "-d", str(daemon.pid)], check=True, capture_output=True)
        workload(sock)
        subprocess.run(["callgrind_control", "-d", str(daemon.pid)], check=True, capture_output=True)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=120)
        dumps = [f"{out}.1", f"{out}.2", out]
        tiers = [executed(p, binary) for p in dumps]
    return tiers


def main():
    binary = os.path.abspath(sys.argv[1])
    nm = subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True, text=True, check=True)
    syms = {}
    for line in nm.stdout.splitlines():
        p = line.split(" ", 3)
        if len(p) == 4 and p[2] in "tTwW" and int(p[1], 16) > 0:
            syms.setdefault(int(p[0], 16), (int(p[1], 16), p[3]))
    starts = sorted(syms)
    # Two runs: what a daemon does in its first seconds varies a little with timing (the gossip member, the
    # data plane's first pass), and a function one run missed would stray into the cold text.
    tiers = [set(), set(), set()]
    for _ in range(PROFILE_RUNS):
        for tier, more in zip(tiers, callgrind_tiers(binary)):
            tier |= more
    # What only a native run touched goes with the start's tier.
    tiers[0] |= native_faults(binary) - tiers[1] - tiers[2]
    # A name without its hash that names one function of this binary is written so (it then survives updates of
    # dependencies and of the compiler, which change every hash); generic functions' instances share their
    # name and differ only by the hash, so those are written whole (a pattern would take all instances in).
    # The last tier holds the other instances of those generic functions (each name's instances together at most
    # GENERIC_TIER_BYTES): an instance whose hash changed since this profile lands there, near the rest, instead of
    # anywhere in the cold text (where it would cost a whole folio of its own).
    count, total = {}, {}
    for size, name in syms.values():
        stripped = HASH.sub("17h*", name)
        count[stripped] = count.get(stripped, 0) + 1
        total[stripped] = total.get(stripped, 0) + size
    seen, lines, generic = set(), [], []
    for tier in tiers:
        names = []
        for a in sorted(tier):
            i = bisect.bisect_right(starts, a) - 1
            if i < 0 or a >= starts[i] + syms[starts[i]][0] or starts[i] in seen:
                continue
            seen.add(starts[i])
            name = syms[starts[i]][1]
            stripped = HASH.sub("17h*", name)
            names.append(stripped if count[stripped] == 1 else name)
            if count[stripped] > 1 and total[stripped] <= GENERIC_TIER_BYTES and stripped not in generic:
                generic.append(stripped)
        lines.append(names)
    lines.append(generic)
    with open(os.path.join(HERE, "shoald.ld"), "w") as f:
        f.write("/* Generated by crates/shoal/hot-text/generate.py from a profile of "
                f"{os.path.basename(binary)} (the release build): do not edit. The output section is .text itself (the linker puts\n"
                "   every other .text.* section after these), so tools that look for .text (valgrind) see all code. */\n")
        f.write("SECTIONS {\n  .text : {\n")
        for n, names in enumerate(lines, 1):
            f.write(f"    /* tier {n}: {len(names)} functions */\n")
            # LLVM puts a function marked cold (`#[cold]`: hashbrown's rehash, `OnceLock::initialize`, ...) in
            # `.text.unlikely.<name>`: both names are listed.
            sections = "".join(f"      .text.{name} .text.unlikely.{name}\n" for name in names)
            f.write("    *(\n" + sections + "    )\n")
        f.write("  }\n}\nINSERT BEFORE .fini;\n")
    print(f"wrote {os.path.join(HERE, 'shoald.ld')}: tiers of {', '.join(str(len(t)) for t in lines)} functions")


if __name__ == "__main__":
    main()
