# Shared by bench/run.sh, bench/protect.sh and bench/scripts.sh (sourced, not run): tools
# installed when missing, a work directory and the processes to stop on
# exit, free loopback ports, and a redis-server of the run's own.

# need COMMAND:PACKAGE...: installs from Debian packages the packages of
# the commands that are missing.
need() {
	local missing=() pair
	for pair in "$@"; do
		command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		local sudo_cmd=""
		[ "$(id -u)" -eq 0 ] || sudo_cmd=sudo
		$sudo_cmd apt-get update -qq
		DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
	fi
}

# work is removed, and every pid in pids stopped, on exit.
work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }

# caddy_globals ADMIN_PORT: a benchmark Caddy's global options: the admin
# API on loopback, no HTTPS, no logs.
caddy_globals() {
	printf '{\n\tadmin 127.0.0.1:%s\n\tauto_https off\n\tlog {\n\t\toutput discard\n\t}\n}\n' "$1"
}

# pin_cpus PIN: sets the command prefixes that place the processes of a
# run on the CPUs it may use: redis_prefix for redis-server, rest_prefix
# for everything else (Caddy, wrk, redis-benchmark). PIN=redis: Redis on
# the last CPU (taskset), the rest on the others; PIN=none: every process
# on every CPU (both prefixes empty).
pin_cpus() {
	redis_prefix=()
	rest_prefix=()
	case $1 in
	none) ;;
	redis)
		local cpus last rest
		read -r -a cpus <<<"$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
		if [ "${#cpus[@]}" -lt 2 ]; then
			echo "PIN=redis needs at least 2 CPUs, this run may use ${#cpus[@]}" >&2
			exit 2
		fi
		last=$((${#cpus[@]} - 1))
		rest=$(IFS=,; echo "${cpus[*]:0:last}")
		redis_prefix=(taskset -c "${cpus[last]}")
		rest_prefix=(taskset -c "$rest")
		;;
	*)
		echo "PIN: \"$1\" is not one of: none, redis" >&2
		exit 2
		;;
	esac
}

# start_redis: a redis-server on a free loopback port, without persistence;
# sets redis_port. The server runs under the command prefix in the array
# redis_prefix when the caller set one (pin_cpus).
start_redis() {
	redis_port=$(free_port)
	${redis_prefix[@]+"${redis_prefix[@]}"} redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --logfile "$work/redis.log" &
	pids+=($!)
	wait_port "$redis_port"
}
