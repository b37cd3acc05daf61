#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for tests and for trying
# pipetrain.sbatch without a real cluster. Everything it runs or writes lives
# under DIR: its own munged (on its own socket, with a fresh key), slurmctld
# and slurmd on free ports, their state, spool and logs.
#
#   deploy/slurm/testcluster.sh up DIR     # prints the SLURM_CONF to export
#   . DIR/env                              # sets SLURM_CONF for sbatch/srun/squeue
#   deploy/slurm/testcluster.sh down DIR   # cancels jobs, stops every daemon
#
# Needs root and Debian's slurmctld, slurmd, munge and slurm-client. The node
# declares CPUS (default 4) whatever the machine has (config_overrides), so a
# 4-stage job fits on a 2-core machine. SLURMCTLD_PORT and SLURMD_PORT choose
# the ports (default: free ones). up tears down what it started if it fails.
#
#   deploy/slurm/testcluster.sh up DIR NODES   # NODES > 1: hosts of their own
#
# With NODES > 1, node1 ... nodeN are hosts made of network namespaces
# (ptslurm-X-nodeK) on a private bridge (in namespace ptslurm-X-sw): node K
# is 10.232.X.K, and each slurmd (so every job step on it) runs in its
# node's network namespace and a mount namespace of its own. slurmctld and
# munged stay in this machine's namespaces; slurmctld is reached at
# 10.232.X.254, this machine's end of a veth pair (ptslurmX) into the bridge,
# so sbatch, squeue and scontrol work from here as with one node. Nothing
# else of this machine's network is touched. NODE_LOCAL=PATH (an existing
# folder) makes PATH node-local: DIR/nodeK/local is bound over it on node K,
# as a local disk would be. down deletes the namespaces and the veth pair.
set -euo pipefail

usage() {
	echo "usage: $0 up DIR [NODES] | down DIR" >&2
	exit 2
}
[ $# -eq 2 ] || { [ $# -eq 3 ] && [ "$1" = up ]; } || usage
cmd=$1
nodes=${3:-1}
[[ $nodes =~ ^[1-9][0-9]{0,2}$ ]] && [ "$nodes" -le 200 ] || usage
mkdir -p "$2"
dir=$(cd "$2" && pwd)
conf=$dir/slurm.conf

# freeport prints a TCP port nobody listens on. /proc/net/tcp* is read rather
# than ss, which the machine may not have.
freeport() {
	local port hex
	while :; do
		port=$((20000 + RANDOM % 40000))
		hex=$(printf ':%04X ' "$port")
		if ! grep -q "$hex" /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
			echo "$port"
			return
		fi
	done
}

# stop ends the process in a pid file: TERM, then KILL after 10s.
stop() {
	local pid
	[ -s "$1" ] || return 0
	pid=$(cat "$1")
	if kill "$pid" 2>/dev/null; then
		for _ in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -9 "$pid" 2>/dev/null || true
	fi
	rm -f "$1"
}

# strays are the slurmstepd processes of this cluster (they hold files under
# DIR open) and everything they started: what outlives slurmd when a job
# did not end in time.
strays() {
	local p f roots=() all
	for p in /proc/[0-9]*; do
		[ "$(cat "$p/comm" 2>/dev/null)" = slurmstepd ] || continue
		for f in "$p"/fd/*; do
			case $(readlink "$f" 2>/dev/null) in
			"$dir"/*) roots+=("${p#/proc/}") && break ;;
			esac
		done
	done
	[ ${#roots[@]} -gt 0 ] || return 0
	# Descendants by parent pid, found before anything is killed.
	all=" ${roots[*]} "
	local changed=1 pid ppid
	while [ "$changed" = 1 ]; do
		changed=0
		for p in /proc/[0-9]*; do
			pid=${p#/proc/}
			ppid=$(awk '{print $4}' "$p/stat" 2>/dev/null) || continue
			if [[ $all == *" $ppid "* && $all != *" $pid "* ]]; then
				all+="$pid "
				changed=1
			fi
		done
	done
	echo "$all"
}

# cancel_jobs cancels every job through Slurm, while slurmctld runs, and
# waits a while for them to go: their steps end as Slurm ends them, and only
# what does not end in time is killed afterwards.
cancel_jobs() {
	export SLURM_CONF=$conf
	if [ -s "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
		scancel --full --quiet --user=root 2>/dev/null || true
		for _ in $(seq 50); do
			[ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
			sleep 0.2
		done
	fi
}

down() {
	cancel_jobs
	local left
	left=$(strays)
	stop "$dir/slurmd.pid"
	stop "$dir/slurmctld.pid"
	# shellcheck disable=SC2086 # a list of pids
	[ -z "${left// /}" ] || kill -9 $left 2>/dev/null || true
	stop "$dir/munge/munged.pid"
}

# start_munge starts the cluster's own munged, with a key of its own.
start_munge() {
	local key=$dir/munge/munge.key
	[ -s "$key" ] || mungekey --create --keyfile="$key"
	# --force: munged refuses a socket under a world-writable directory such
	# as /tmp, which is where tests put DIR.
	munged --force --key-file="$key" --socket="$dir/munge/munge.socket.2" \
		--pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
		--seed-file="$dir/munge/munged.seed"
}

# conf_head CTLD_HOST SPOOL PIDFILE LOGFILE prints slurm.conf up to its
# nodes: what one node and several share. The ports are the caller's
# ctld_port and slurmd_port.
conf_head() {
	cat <<EOF
ClusterName=pipetrain-test
SlurmctldHost=$1
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket.2,cred_expire=5
StateSaveLocation=$dir/state
SlurmdSpoolDir=$2
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$3
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$4
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
MpiDefault=none
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=600
EOF
}
up() {
	local node ctld_port slurmd_port
	for b in munged mungekey slurmctld slurmd sbatch srun scontrol; do
		command -v "$b" >/dev/null || {
			echo "$0: $b not found: apt-get install slurmctld slurmd munge slurm-client" >&2
			exit 1
		}
	done
	[ "$(id -u)" = 0 ] || {
		echo "$0: needs root (the daemons run as root)" >&2
		exit 1
	}
	trap 'echo "$0: up failed; logs in $dir/log" >&2; down' ERR
	mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log"
	chmod 700 "$dir/munge"
	start_munge

	node=$(hostname -s)
	ctld_port=${SLURMCTLD_PORT:-$(freeport)}
	slurmd_port=${SLURMD_PORT:-$(freeport)}
	# proctrack/linuxproc and task/none need no cgroups (containers, no
	# systemd). cred_expire is how long a requeued job waits before it may
	# start again (default 120s) and sched_interval how often pending jobs are
	# looked at (default 60s): short, so tests need not wait.
	conf_head "$node(127.0.0.1)" "$dir/spool" "$dir/slurmd.pid" "$dir/log/slurmd.log" >"$conf"
	cat >>"$conf" <<EOF
NodeName=$node NodeAddr=127.0.0.1 CPUs=${CPUS:-4} State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
	echo "export SLURM_CONF=$conf" >"$dir/env"
	export SLURM_CONF=$conf
	slurmctld -f "$conf"
	slurmd -f "$conf" -N "$node"
	local deadline=$((SECONDS + 30)) d
	while [ $SECONDS -lt $deadline ]; do
		case $(timeout 5 sinfo -h -n "$node" -o %T 2>/dev/null) in
		idle*)
			echo "SLURM_CONF=$conf"
			trap - ERR
			return 0
			;;
		esac
		for d in slurmctld slurmd; do
			if [ -s "$dir/$d.pid" ] && ! kill -0 "$(cat "$dir/$d.pid")" 2>/dev/null; then
				echo "$0: $d exited:" >&2
				tail -n 5 "$dir/log/$d.log" >&2
				false
			fi
		done
		sleep 0.2
	done
	echo "$0: node $node not idle after 30s:" >&2
	tail -n 5 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
	false
}

# The N-node cluster. DIR/nodes holds N and the subnet's X, written before
# anything is made, so that down (also up's, on failure) finds what to undo.
nsname() { echo "ptslurm-$1-$2"; }

down_nodes() {
	local n x k ns left
	read -r n x <"$dir/nodes"
	cancel_jobs
	left=$(strays)
	for k in $(seq "$n"); do
		stop "$dir/node$k/slurmd.pid"
	done
	stop "$dir/slurmctld.pid"
	# shellcheck disable=SC2086 # a list of pids
	[ -z "${left// /}" ] || kill -9 $left 2>/dev/null || true
	# Whatever still runs on a node goes with it.
	for k in $(seq "$n") sw; do
		if [ "$k" = sw ]; then ns=$(nsname "$x" sw); else ns=$(nsname "$x" "node$k"); fi
		[ -e "/run/netns/$ns" ] || continue
		for _ in $(seq 100); do
			left=$(ip netns pids "$ns" 2>/dev/null) || break
			[ -n "$left" ] || break
			# shellcheck disable=SC2086 # a list of pids
			kill -9 $left 2>/dev/null || true
			sleep 0.1
		done
		ip netns del "$ns"
	done
	# Deleting the switch's namespace deleted the veth pair, unless up
	# failed before its end was moved there.
	ip link del "ptslurm$x" 2>/dev/null || true
	stop "$dir/munge/munged.pid"
	rm -f "$dir/nodes"
}

up_nodes() {
	local n=$nodes x= k ns sw ctld_port slurmd_port names= pidfile bind
	for b in munged mungekey slurmctld slurmd sbatch srun scontrol ip nsenter unshare mount; do
		command -v "$b" >/dev/null || {
			echo "$0: $b not found: apt-get install slurmctld slurmd munge slurm-client iproute2 util-linux" >&2
			exit 1
		}
	done
	[ "$(id -u)" = 0 ] || {
		echo "$0: needs root (the daemons and namespaces need it)" >&2
		exit 1
	}
	if [ -n "${NODE_LOCAL:-}" ] && [ ! -d "$NODE_LOCAL" ]; then
		echo "$0: NODE_LOCAL=$NODE_LOCAL is not a folder" >&2
		exit 1
	fi
	# X: a subnet no route of this machine uses and no other cluster holds.
	for _ in $(seq 100); do
		x=$((1 + RANDOM % 250))
		[ -z "$(ip route show "10.232.$x.0/24")" ] && [ ! -e "/run/netns/$(nsname "$x" sw)" ] && break
		x=
	done
	[ -n "$x" ] || {
		echo "$0: no free 10.232.X.0/24" >&2
		exit 1
	}
	echo "$n $x" >"$dir/nodes"
	trap 'echo "$0: up failed; logs in $dir/log" >&2; down_nodes' ERR
	mkdir -p "$dir/munge" "$dir/state" "$dir/log"
	chmod 700 "$dir/munge"

	# The switch, this machine's cable to it, and one host per node.
	sw=$(nsname "$x" sw)
	ip netns add "$sw"
	ip -n "$sw" link set lo up
	ip -n "$sw" link add name br0 type bridge
	ip -n "$sw" link set br0 up
	ip link add "ptslurm$x" type veth peer name ctl netns "$sw"
	ip -n "$sw" link set ctl master br0
	ip -n "$sw" link set ctl up
	ip addr add "10.232.$x.254/24" dev "ptslurm$x"
	ip link set "ptslurm$x" up
	for k in $(seq "$n"); do
		ns=$(nsname "$x" "node$k")
		ip netns add "$ns"
		ip -n "$ns" link set lo up
		ip -n "$sw" link add name "port$k" type veth peer name eth0 netns "$ns"
		ip -n "$sw" link set "port$k" master br0
		ip -n "$sw" link set "port$k" up
		ip -n "$ns" addr add "10.232.$x.$k/24" dev eth0
		ip -n "$ns" link set eth0 up
		mkdir -p "$dir/node$k/spool" "$dir/node$k/local"
		names+=${names:+,}node$k
	done

	start_munge

	ctld_port=${SLURMCTLD_PORT:-$(freeport)}
	# Each node has the ports of its own namespace: one SlurmdPort for all.
	slurmd_port=${SLURMD_PORT:-$(freeport)}
	# As for one node; %n is the node's name, so each slurmd has its own
	# spool, pid and log files.
	{
		conf_head "$(hostname -s)(10.232.$x.254)" "$dir/%n/spool" "$dir/%n/slurmd.pid" "$dir/log/slurmd-%n.log"
		for k in $(seq "$n"); do
			echo "NodeName=node$k NodeAddr=10.232.$x.$k CPUs=${CPUS:-4} State=UNKNOWN"
		done
		echo "PartitionName=test Nodes=$names Default=YES MaxTime=INFINITE State=UP"
	} >"$conf"
	echo "export SLURM_CONF=$conf" >"$dir/env"
	export SLURM_CONF=$conf
	slurmctld -f "$conf"
	# nsenter, not ip netns exec, which remounts /sys: slurmd then finds no
	# /sys/fs/cgroup. The mount namespace is slurmd's own, slave so that the
	# namespaces' files ip netns del unmounts go from its view too.
	for k in $(seq "$n"); do
		bind=
		[ -z "${NODE_LOCAL:-}" ] || bind="mount --bind '$dir/node$k/local' '$NODE_LOCAL' && "
		nsenter --net="/run/netns/$(nsname "$x" "node$k")" unshare --mount --propagation slave -- \
			sh -c "${bind}exec slurmd -f '$conf' -N node$k"
	done
	local deadline=$((SECONDS + 30)) idle
	while [ $SECONDS -lt $deadline ]; do
		idle=$(timeout 5 sinfo -h -N -o %T 2>/dev/null | grep -c '^idle') || true
		if [ "$idle" = "$n" ]; then
			echo "SLURM_CONF=$conf"
			trap - ERR
			return 0
		fi
		for pidfile in "$dir/slurmctld.pid" "$dir"/node*/slurmd.pid; do
			if [ -s "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
				echo "$0: the daemon of ${pidfile#"$dir"/} exited:" >&2
				tail -n 5 "$dir"/log/*.log >&2
				false
			fi
		done
		sleep 0.2
	done
	echo "$0: $n nodes not idle after 30s:" >&2
	sinfo -N >&2 || true
	tail -n 5 "$dir"/log/*.log >&2 || true
	false
}

case $cmd in
up) if [ "$nodes" = 1 ]; then up; else up_nodes; fi ;;
down) if [ -s "$dir/nodes" ]; then down_nodes; else down; fi ;;
*) usage ;;
esac
