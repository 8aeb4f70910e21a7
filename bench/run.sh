#!/usr/bin/env bash
# Load benchmark: plain Caddy vs Tollgate on the embedded store and on Redis,
# measured in one run on loopback with wrk, reported as ratios to the plain
# Caddy baseline (absolute numbers on shared 2-core machines are noise).
# Scenarios: plain `respond`; rate_limit on the embedded store (headers on,
# and off); on Redis without a lease (one script call per request, strict)
# and with lease 50; each Redis scenario also with all traffic on one
# tenant (hot) and spread over 10 000 tenants. Peers, what a user would
# run instead, built from bench/peers (a module of its own, not part of
# the product) into a second binary: redis_rate, a bare go-redis/redis_rate
# handler (GCRA, one EVALSHA and one round trip per request);
# redis_floor, the floor script (TIME, GET, SET PX: the least a decision
# in Redis does) pipelined as Tollgate's store sends its decisions, the
# yardstick for Redis's time per strict decision on this machine at this
# moment; and caddy_ratelimit, mholt/caddy-ratelimit in memory, only when
# CADDY_RATELIMIT_SRC names a checkout of its source (the Go proxy here
# does not serve it). Below the table, each Tollgate Redis row's
# requests/s as a ratio to redis_rate's, and each embedded row's to
# caddy_ratelimit's; each strict row's Redis CPU and script time per
# request as a ratio to redis_floor's; and the usage history's cost: the embedded and strict
# Redis scenarios against the same with `history off`.
#
#   ./bench/run.sh                 # 3 rounds of 10 s per scenario (~9 min)
#   DURATION=30s ./bench/run.sh    # longer runs
#   ROUNDS=5 ./bench/run.sh        # more interleaved rounds
#   ONLY="baseline redis" ./bench/run.sh   # a subset of the scenarios
#   CADDY_RATELIMIT_SRC=~/src/caddy-ratelimit ./bench/run.sh   # with that peer
#   GC=default ./bench/run.sh      # Go's default GC pacing (see GC below)
#   PIN=redis ./bench/run.sh       # Redis on a CPU of its own (see PIN below)
#
# Installs wrk and redis-server from Debian packages when missing. Prints a
# Markdown table and writes it to bench/results/latest.md. Besides
# throughput and latency, each row says what a request cost: Redis calls
# and round trips, and the CPU Redis and Caddy spent on it (wrk, the
# kernel's loopback and the rest of the machine share the same two cores,
# so the CPU columns explain a ratio: the baseline row is what plain Caddy
# spends, and every µs more per request comes off the throughput). "Of
# which in scripts" is Redis's own time inside the script and function
# calls (INFO commandstats); the rest of Redis's CPU is reading, parsing
# and answering the calls, and the system calls for it.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
# GC is the Go runtime setting every benchmarked Caddy runs with. With
# Go's default pacing a process collects each time its heap doubles over
# what is live, so a handler that keeps memory live makes the whole
# process collect less often: caddy-ratelimit's ring buffers (24 MB
# here) made it 1.14x as fast as plain Caddy, which measured the
# collector, not the limiter. A fixed memory budget with the percentage
# off makes every Caddy collect at the same heap size, so the ratios
# compare what the handlers do. GC=default keeps Go's defaults.
GC=${GC:-GOGC=off GOMEMLIMIT=256MiB}
gc_env=(-u GOGC -u GOMEMLIMIT)
if [ "$GC" != default ]; then
	read -r -a gc_env <<<"$GC"
	for kv in "${gc_env[@]}"; do
		if [[ $kv != *=* ]]; then
			echo "GC: \"$kv\" is not NAME=VALUE (e.g. GC=\"GOGC=off GOMEMLIMIT=256MiB\", or GC=default)" >&2
			exit 2
		fi
	done
fi
# PIN=redis runs redis-server on the last CPU this run may use and Caddy
# and wrk on the others (taskset), as a fleet's Redis runs on CPUs of its
# own: the Redis CPU columns are then what a decision costs a Redis that
# does not share its CPU (for sizing), while throughput is measured on
# fewer CPUs. PIN=none (the default): all of them share every CPU. (On a
# machine with hyperthreads, two CPUs may share one core.) See pin_cpus in
# bench/lib.sh.
PIN=${PIN:-none}
CONNECTIONS=${CONNECTIONS:-32}
THREADS=${THREADS:-1}
ROUNDS=${ROUNDS:-3}

# shellcheck source=bench/lib.sh
. bench/lib.sh
pin_cpus "$PIN"
need wrk:wrk redis-server:redis-server redis-cli:redis-tools

echo "building cmd/caddy..." >&2
go build -o "$work/caddy" ./cmd/caddy

start_redis

# dead_port: a webhook receiver that accepts connections and never
# answers (the notify scenario's).
dead_port=$(free_port)
python3 -c "import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $dead_port)); s.listen(4096); time.sleep(10**6)" &
pids+=($!)

# redis_stat FIELD: a counter of INFO (commandstats or stats).
redis_stat() {
	redis-cli -p "$redis_port" info "$1" | tr -d '\r' | awk -v f="$2" '
		$0 ~ "^"f":" { sub("^"f":", ""); if (match($0, /calls=[0-9]+/)) print substr($0, RSTART+6, RLENGTH-6); else print; found=1 }
		END { if (!found) print 0 }'
}

# redis_script_usec: the µs Redis has spent running scripts and functions
# (INFO commandstats usec of EVALSHA, EVAL and FCALL): the time from a
# call's start to its end inside Redis, so under load it includes any
# moment the kernel took the core away mid-call.
redis_script_usec() {
	redis-cli -p "$redis_port" info commandstats | tr -d '\r' | awk '
		/^cmdstat_(evalsha|eval|fcall):/ { if (match($0, /usec=[0-9]+/)) s += substr($0, RSTART+5, RLENGTH-5) }
		END { printf "%.0f\n", s }'
}

# proc_cpu PID: the CPU seconds (user + system) a process has used.
hz=$(getconf CLK_TCK)
proc_cpu() {
	awk -v hz="$hz" '{ printf "%.6f\n", ($14 + $15) / hz }' "/proc/$1/stat"
}

# redis_cpu: the CPU seconds (user + system) redis-server has used.
redis_cpu() {
	redis-cli -p "$redis_port" info cpu | tr -d '\r' | awk -F: '$1=="used_cpu_user" || $1=="used_cpu_sys" {s += $2} END {printf "%.6f\n", s}'
}

# scenario NAME TENANTS RATE_LIMIT_BLOCK [BINARY] -> prints
# "name rps p50 p99 calls_per_req trips_per_req redis_cpu_us_per_req caddy_cpu_us_per_req script_us_per_req"
# BINARY is the Caddy to run: cmd/caddy unless said (the peers' binary).
scenario() {
	local name=$1 tenants=$2 block=$3 caddy=${4:-$work/caddy} port admin
	port=$(free_port); admin=$(free_port)
	cat >"$work/$name.Caddyfile" <<CADDY
$(caddy_globals "$admin")
http://127.0.0.1:$port {
$block
	respond "ok"
}
CADDY
	env "${gc_env[@]}" ${rest_prefix[@]+"${rest_prefix[@]}"} "$caddy" run --config "$work/$name.Caddyfile" --adapter caddyfile >"$work/$name.log" 2>&1 &
	local pid=$!
	wait_port "$port"
	# warm up: connections, buckets, scripts
	TENANTS=$tenants ${rest_prefix[@]+"${rest_prefix[@]}"} wrk -t1 -c"$CONNECTIONS" -d2s -s bench/tenants.lua "http://127.0.0.1:$port/" >/dev/null
	local calls0 evals0 trips0 cpu0 ccpu0 calls1 evals1 trips1 cpu1 ccpu1 sus0 sus1
	calls0=$(( $(redis_stat commandstats cmdstat_evalsha) + $(redis_stat commandstats cmdstat_fcall) )); evals0=$(redis_stat commandstats cmdstat_eval)
	trips0=$(redis_stat stats total_writes_processed); cpu0=$(redis_cpu); ccpu0=$(proc_cpu "$pid"); sus0=$(redis_script_usec)
	TENANTS=$tenants ${rest_prefix[@]+"${rest_prefix[@]}"} wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency -s bench/tenants.lua "http://127.0.0.1:$port/" >"$work/$name.wrk"
	calls1=$(( $(redis_stat commandstats cmdstat_evalsha) + $(redis_stat commandstats cmdstat_fcall) )); evals1=$(redis_stat commandstats cmdstat_eval)
	trips1=$(redis_stat stats total_writes_processed); cpu1=$(redis_cpu); ccpu1=$(proc_cpu "$pid"); sus1=$(redis_script_usec)
	kill "$pid"; wait "$pid" 2>/dev/null || true
	local rps p50 p99 requests non2xx
	rps=$(awk '/^Requests\/sec/ {print $2}' "$work/$name.wrk")
	p50=$(awk '$1=="50%" {print $2}' "$work/$name.wrk")
	p99=$(awk '$1=="99%" {print $2}' "$work/$name.wrk")
	requests=$(awk '/requests in/ {print $1}' "$work/$name.wrk")
	non2xx=$(awk '/Non-2xx/ {print $NF}' "$work/$name.wrk"); non2xx=${non2xx:-0}
	if [ "$non2xx" != 0 ]; then echo "$name: $non2xx non-2xx responses (limits too low?)" >&2; fi
	# The redis-cli calls themselves are two writes each; the heartbeat is
	# one call a second: both are noise next to tens of thousands.
	python3 -c "r=max($requests,1); print('$name', $rps, '$p50', '$p99', round(($calls1-$calls0+$evals1-$evals0)/r, 3), round(($trips1-$trips0)/r, 3), round(($cpu1-$cpu0)*1e6/r, 2), round(($ccpu1-$ccpu0)*1e6/r, 2), round(($sus1-$sus0)/r, 2))"
}

policy='	rate_limit {
		%s
		tenant {http.request.header.X-Tenant}
		headers %s
		%s
		policy api {
			algorithm token_bucket
			limit 1000000000
			window 1h
		}
	}'
redis_block="redis {
			address 127.0.0.1:$redis_port
			functions
		}"
embedded=$(printf "$policy" '' both '')
embedded_off=$(printf "$policy" '' off '')
embedded_nohist=$(printf "$policy" '' both 'history off')
# Webhooks to the dead receiver: every request is past the tiny
# near_limit threshold, so each checks the notifier's table.
notify_dead="notify {
			url http://127.0.0.1:$dead_port/hook
			secret bench
			events near_limit 0.000000001 exceeded
			allow_private
		}"
embedded_notify=$(printf "$policy" '' both "$notify_dead")
strict=$(printf "$policy" "$redis_block" both '')
strict_nohist=$(printf "$policy" "$redis_block" both 'history off')
leased=$(printf "$policy" "$redis_block" both 'lease 50')
# The peers, configured as the policies above: never denying.
redis_rate="	redis_rate {
		address 127.0.0.1:$redis_port
		rate 1000000000 per hour
		burst 1000000000
		key {http.request.header.X-Tenant}
	}"
redis_floor="	redis_floor {
		address 127.0.0.1:$redis_port
		key {http.request.header.X-Tenant}
	}"
# caddy-ratelimit keeps a ring of `events` timestamps per key, allocated
# whole (1 000 000 000 would be 24 GB a key): 10 000 a second is 240 KB a
# key and still ~30 times what one of 100 tenants gets here.
caddy_ratelimit='	rate_limit {
		zone z {
			key {http.request.header.X-Tenant}
			events 10000
			window 1s
		}
	}'

# name tenants block
all=(
	"baseline 100"
	"embedded 100"
	"embedded_headers_off 100"
	"embedded_history_off 100"
	"embedded_notify_dead 100"
	"caddy_ratelimit 100"
	"redis_rate 100"
	"redis_floor 100"
	"redis 100"
	"redis_history_off 100"
	"redis_hot 1"
	"redis_10k 10000"
	"lease 100"
	"lease_hot 1"
	"lease_10k 10000"
)
declare -A block=(
	[baseline]="" [embedded]="$embedded" [embedded_headers_off]="$embedded_off"
	[embedded_history_off]="$embedded_nohist" [redis_history_off]="$strict_nohist"
	[embedded_notify_dead]="$embedded_notify"
	[redis]="$strict" [redis_hot]="$strict" [redis_10k]="$strict"
	[lease]="$leased" [lease_hot]="$leased" [lease_10k]="$leased"
	[redis_rate]="$redis_rate" [redis_floor]="$redis_floor" [caddy_ratelimit]="$caddy_ratelimit"
)
declare -A binary=([redis_rate]="$work/caddy-peers" [redis_floor]="$work/caddy-peers" [caddy_ratelimit]="$work/caddy-peers")
picked=()
for s in "${all[@]}"; do
	n=${s%% *}
	if [ -z "${ONLY:-}" ] || [[ " $ONLY baseline " == *" $n "* ]]; then
		if [ "$n" = caddy_ratelimit ] && [ -z "${CADDY_RATELIMIT_SRC:-}" ]; then
			echo "skipping caddy_ratelimit: set CADDY_RATELIMIT_SRC to a checkout of github.com/mholt/caddy-ratelimit" >&2
			continue
		fi
		picked+=("$s")
	fi
done

# The peers' binary: bench/peers as it is, or, with caddy-ratelimit, a
# copy of it that also imports that module from CADDY_RATELIMIT_SRC
# (a replace in the copy's go.mod; bench/peers/go.mod stays as it is).
if [[ " ${picked[*]} " == *" caddy_ratelimit "* ]]; then
	echo "building bench/peers with caddy-ratelimit from $CADDY_RATELIMIT_SRC..." >&2
	src=$(cd "$CADDY_RATELIMIT_SRC" && pwd)
	cp -r bench/peers "$work/peers"
	printf 'package main\n\nimport _ "github.com/mholt/caddy-ratelimit"\n' >"$work/peers/cmd/caddy/ratelimit.go"
	(cd "$work/peers" &&
		go mod edit -require=github.com/mholt/caddy-ratelimit@v0.0.0 -replace="github.com/mholt/caddy-ratelimit=$src" &&
		go mod tidy &&
		go build -o "$work/caddy-peers" ./cmd/caddy)
elif [[ " ${picked[*]} " == *" redis_rate "* ]] || [[ " ${picked[*]} " == *" redis_floor "* ]]; then
	echo "building bench/peers..." >&2
	(cd bench/peers && go build -o "$work/caddy-peers" ./cmd/caddy)
fi

# Rounds interleave the scenarios and rotate their order (A B C, B C A,
# ...) so that drift of a noisy machine, and whatever one scenario leaves
# behind for the next, hits all of them alike; each ratio is taken against
# the baseline of its own round, and the table shows medians over rounds.
results=()
k=${#picked[@]}
for round in $(seq "$ROUNDS"); do
	echo "round $round of $ROUNDS..." >&2
	for i in $(seq 0 $((k - 1))); do
		j=$(((i + round - 1) % k))
		set -- ${picked[$j]}
		results+=("$round $(scenario "$1" "$2" "${block[$1]}" "${binary[$1]:-}")")
	done
done

mkdir -p bench/results
python3 - "$ROUNDS" "$DURATION" "$CONNECTIONS" "$GC" "$PIN" "${results[@]}" <<'PY' | tee bench/results/latest.md
import sys, statistics
rounds, duration, conns, gc, pin = sys.argv[1:6]
rows = [r.split() for r in sys.argv[6:]]
labels = {
    "baseline": "plain Caddy `respond` (baseline)",
    "embedded": "embedded store",
    "embedded_headers_off": "embedded store, `headers off`",
    "embedded_history_off": "embedded store, `history off`",
    "embedded_notify_dead": "embedded store, webhooks to a receiver that never answers",
    "caddy_ratelimit": "mholt/caddy-ratelimit (in memory, sliding window)",
    "redis_rate": "go-redis/redis_rate (GCRA, one EVALSHA per request)",
    "redis_floor": "floor script (`TIME`, `GET`, `SET PX`), pipelined as strict's decisions",
    "redis": "Redis, strict (no lease)",
    "redis_history_off": "Redis, strict, `history off`",
    "redis_hot": "Redis, strict, one hot tenant",
    "redis_10k": "Redis, strict, 10 000 tenants",
    "lease": "Redis, `lease 50`",
    "lease_hot": "Redis, `lease 50`, one hot tenant",
    "lease_10k": "Redis, `lease 50`, 10 000 tenants",
}
def ms(v):
    for unit, f in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if v.endswith(unit):
            return float(v[:-len(unit)]) * f
    return float(v)
order = [n for n in labels if any(r[1] == n for r in rows)]
base = {rnd: float(rps) for rnd, name, rps, *_ in rows if name == "baseline"}
by = {name: [] for name in order}
for rnd, name, rps, p50, p99, calls, trips, cpu, ccpu, sus in rows:
    by[name].append((float(rps), float(rps) / base[rnd], ms(p50), ms(p99), float(calls), float(trips), float(cpu), float(ccpu), float(sus)))
med = lambda xs: statistics.median(xs)
print(f"{rounds} interleaved rounds of {duration}, {conns} connections, 100 tenants unless said, Caddy's GC: {gc}; pinned: {pin}; medians over rounds, ratio against the same round's baseline (range over rounds).")
print()
print("| scenario | requests/s | ratio to baseline | p50 | p99 | Redis calls per request | Redis round trips per request | Redis CPU per request | of which in scripts | Caddy CPU per request |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name in order:
    xs = by[name]
    ratios = sorted(x[1] for x in xs)
    spread = f" ({ratios[0]:.2f}–{ratios[-1]:.2f})" if len(ratios) > 1 else ""
    print(f"| {labels.get(name, name)} | {med([x[0] for x in xs]):.0f} | {med(ratios):.2f}{spread} | "
          f"{med([x[2] for x in xs]):.2f} ms | {med([x[3] for x in xs]):.2f} ms | {med([x[4] for x in xs]):.3f} | {med([x[5] for x in xs]):.3f} | {med([x[6] for x in xs]):.1f} µs | {med([x[8] for x in xs]):.1f} µs | {med([x[7] for x in xs]):.1f} µs |")
# Against the peers: requests/s over the peer's of the same round, median
# (range) over rounds; Tollgate on Redis against redis_rate, on the
# embedded store against caddy-ratelimit (the peers run 100 tenants).
rps = {(rnd, name): float(r) for rnd, name, r, *_ in rows}
peers = [("redis_rate", ["redis", "redis_hot", "redis_10k", "lease", "lease_hot", "lease_10k"]),
         ("caddy_ratelimit", ["embedded", "embedded_headers_off"])]
# compared prints, under title, each (name, other) pair's requests/s over
# the other's of the same round: median (range over rounds).
def compared(title, pairs, other_label):
    lines = []
    for name, other in pairs:
        rs = sorted(rps[rnd, name] / rps[rnd, other] for rnd in base if (rnd, name) in rps and (rnd, other) in rps)
        if rs:
            spread = f" ({rs[0]:.2f}–{rs[-1]:.2f})" if len(rs) > 1 else ""
            lines.append(f"- {labels[name]} / {other_label(other)}: {med(rs):.2f}{spread}")
    if lines:
        print()
        print(title)
        print()
        print("\n".join(lines))
compared("Requests/s against the peers (same round; median, range over rounds):",
         [(name, peer) for peer, ours in peers for name in ours], lambda peer: peer)
# Redis's time per strict decision against the floor script's, sent the
# same way in the same round: Redis CPU per request, and the time inside
# the scripts (the target is 2x the floor).
cost = {(rnd, name): (float(cpu), float(sus)) for rnd, name, rps_, p50, p99, calls, trips, cpu, ccpu, sus in rows}
lines = []
for name in ["redis", "redis_hot", "redis_10k"]:
    pairs = [(cost[rnd, name], cost[rnd, "redis_floor"]) for rnd in base if (rnd, name) in cost and (rnd, "redis_floor") in cost]
    if not pairs:
        continue
    parts = []
    for i, what in ((0, "Redis CPU"), (1, "in scripts")):
        rs = sorted(a[i] / b[i] for a, b in pairs if b[i] > 0)
        if rs:
            spread = f" ({rs[0]:.2f}–{rs[-1]:.2f})" if len(rs) > 1 else ""
            parts.append(f"{what} {med(rs):.2f} x{spread}")
    lines.append(f"- {labels[name]}: " + ", ".join(parts))
if lines:
    print()
    print("Redis time per decision against the floor script's (same round; median, range over rounds):")
    print()
    print("\n".join(lines))
# The usage history's cost: each scenario against the same without it;
# and webhooks to a dead receiver against none.
compared("Against the same without (requests/s, same round; median, range over rounds):",
         [("embedded", "embedded_history_off"), ("redis", "redis_history_off"), ("embedded_notify_dead", "embedded")],
         lambda other: labels[other])
PY
