#!/bin/bash
# swarmctl-loop.sh SHOAL [N]: a one-node shoal daemon (process executor, no data plane) with SwarmKit's API on
# a socket; N `swarmctl service create` processes one after another (replicas 0), then N spawns of /bin/true;
# prints creates/s for each (BENCHMARKS.md, session 10). SWARMCTL: the swarmctl binary (moby/swarmkit's).
set -e
shoal=$1; n=${2:-200}; swarmctl=${SWARMCTL:-swarmctl}
d=$(mktemp -d /tmp/skloop.XXXX)
$shoal daemon --state-dir $d/s --executor process --no-data-plane --listen-remote-api 127.0.0.1:14377 --listen-swarmkit-api $d/sk.sock > $d/log 2>&1 &
pid=$!
trap "kill $pid; wait $pid 2>/dev/null; rm -rf $d" EXIT
for i in $(seq 100); do [ -S $d/sk.sock ] && $swarmctl -s $d/sk.sock node ls >/dev/null 2>&1 && break; sleep 0.1; done
t0=$(date +%s.%N)
for i in $(seq $n); do $swarmctl -s $d/sk.sock service create --name s$i --image busybox --replicas 0 > /dev/null; done
t1=$(date +%s.%N)
for i in $(seq $n); do /bin/true; done
t2=$(date +%s.%N)
echo "RESULT swarmctl $(echo "$n / ($t1 - $t0)" | bc -l | cut -c1-7) creates/s; /bin/true $(echo "$n / ($t2 - $t1)" | bc -l | cut -c1-7) spawns/s (shell loop)"
