#!/bin/bash
# swarmctl-loop.sh SERVER [N]: N `swarmctl service create` processes one after another (replicas 0) against
# SERVER's SwarmKit API socket, then N spawns of /bin/true; prints creates/s and the server's CPU per create
# (BENCHMARKS.md, sessions 10 and 22). SERVER is a `shoal` client binary (a one-node `shoal daemon`, process
# executor, no data plane; it executes `shoald` with the same PID) or a `swarmd` binary (a one-node swarmd,
# its control socket). SWARMCTL: the swarmctl binary (moby/swarmkit's).
#
# The server's CPU is read before and after the N creates: the sum over its threads of
# /proc/PID/task/*/schedstat (run time in ns; the figure quoted) and utime+stime of /proc/PID/stat (clock
# ticks, which also count threads that ended; a check). The thread counts before and after are printed: if
# they differ, a thread ended or started in the window and the schedstat sum is off by its share. The
# clients' CPU per create (utime+stime of the swarmctl processes, this shell's cutime+cstime) bounds the
# creates/s any server allows.
set -e
server=$1; n=${2:-200}; swarmctl=${SWARMCTL:-swarmctl}
d=$(mktemp -d /tmp/skloop.XXXX)
case $(basename "$server") in
swarmd*)
    name=swarmd
    $server -d $d/s --listen-control-api $d/sk.sock --hostname skloop --listen-remote-api 127.0.0.1:14378 \
        --engine-addr unix://$d/no-engine.sock > $d/log 2>&1 &
    ;;
*)
    name=shoal
    $server daemon --state-dir $d/s --executor process --no-data-plane --listen-remote-api 127.0.0.1:14377 \
        --listen-swarmkit-api $d/sk.sock > $d/log 2>&1 &
    ;;
esac
pid=$!
trap "kill $pid; wait $pid 2>/dev/null || true; rm -rf $d" EXIT
for i in $(seq 100); do [ -S $d/sk.sock ] && $swarmctl -s $d/sk.sock node ls >/dev/null 2>&1 && break; sleep 0.1; done
# A quiet second after the start, so its work is not counted.
sleep 1
run_ns() { cat /proc/$pid/task/*/schedstat | awk '{s += $1} END {printf "%d", s}'; }
ticks() { awk '{print $14 + $15}' /proc/$pid/stat; }
child_ticks() { awk '{print $16 + $17}' /proc/$$/stat; }
threads() { ls /proc/$pid/task | wc -l; }
th0=$(threads); ns0=$(run_ns); tk0=$(ticks); ct0=$(child_ticks)
t0=$(date +%s.%N)
for i in $(seq $n); do $swarmctl -s $d/sk.sock service create --name s$i --image busybox --replicas 0 > /dev/null; done
t1=$(date +%s.%N)
ns1=$(run_ns); tk1=$(ticks); th1=$(threads); ct1=$(child_ticks)
for i in $(seq $n); do /bin/true; done
t2=$(date +%s.%N)
hz=$(getconf CLK_TCK)
awk -v name=$name -v n=$n -v t0=$t0 -v t1=$t1 -v t2=$t2 -v ns=$((ns1 - ns0)) -v tk=$((tk1 - tk0)) -v hz=$hz \
    -v th0=$th0 -v th1=$th1 -v ct=$((ct1 - ct0)) 'BEGIN {
    printf "RESULT swarmctl %s %.1f creates/s; server CPU %.3f ms per create (ticks: %.2f ms; threads %d -> %d);",
        name, n / (t1 - t0), ns / 1e6 / n, tk * 1000 / hz / n, th0, th1
    printf " client CPU %.2f ms per create; /bin/true %.0f spawns/s (shell loop)\n", ct * 1000 / hz / n, n / (t2 - t1) }'
