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
set -euo pipefail

usage() {
	echo "usage: $0 up|down DIR" >&2
	exit 2
}
[ $# -eq 2 ] || usage
cmd=$1
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

down() {
	export SLURM_CONF=$conf
	if [ -s "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
		# Jobs are cancelled through Slurm first, so their steps end as
		# Slurm ends them; only what does not end in time is killed below.
		scancel --full --quiet --user=root 2>/dev/null || true
		for _ in $(seq 50); do
			[ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
			sleep 0.2
		done
	fi
	local left
	left=$(strays)
	stop "$dir/slurmd.pid"
	stop "$dir/slurmctld.pid"
	# shellcheck disable=SC2086 # a list of pids
	[ -z "${left// /}" ] || kill -9 $left 2>/dev/null || true
	stop "$dir/munge/munged.pid"
}

up() {
	local node ctld_port slurmd_port key
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
	key=$dir/munge/munge.key
	[ -s "$key" ] || mungekey --create --keyfile="$key"
	# --force: munged refuses a socket under a world-writable directory such
	# as /tmp, which is where tests put DIR.
	munged --force --key-file="$key" --socket="$dir/munge/munge.socket.2" \
		--pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
		--seed-file="$dir/munge/munged.seed"

	node=$(hostname -s)
	ctld_port=${SLURMCTLD_PORT:-$(freeport)}
	slurmd_port=${SLURMD_PORT:-$(freeport)}
	# proctrack/linuxproc and task/none need no cgroups (containers, no
	# systemd). cred_expire is how long a requeued job waits before it may
	# start again (default 120s) and sched_interval how often pending jobs are
	# looked at (default 60s): short, so tests need not wait.
	cat >"$conf" <<EOF
ClusterName=pipetrain-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket.2,cred_expire=5
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
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

case $cmd in
up) up ;;
down) down ;;
*) usage ;;
esac
