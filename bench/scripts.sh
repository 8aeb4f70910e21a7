#!/usr/bin/env bash
# Redis time per decision, per algorithm: Tollgate's decide script
# (EVALSHA, `functions off`) and its function library (FCALL, the default),
# next to a floor script that does the least any decision must (TIME, GET,
# SET ... PX) and go-redis/redis_rate's script. Each row is run with redis-benchmark (16 calls pipelined per
# connection, 4 connections, 100 tenants), and the time is Redis's own
# usec_per_call from INFO commandstats, so the client, the network and
# wrk-style load are left out; pipelining keeps Redis busy, which is how it
# runs under a fleet's load. Rounds interleave the rows in a rotated order;
# the table shows medians over rounds (range in parentheses) and the
# median ratio to the floor measured in the same round.
#
#   ./bench/scripts.sh             # 5 rounds of 100 000 calls per row (~4 min)
#   ROUNDS=9 ./bench/scripts.sh
#   PIN=none ./bench/scripts.sh    # redis-server and redis-benchmark on every CPU
#
# PIN=redis (the default on 2 CPUs or more) runs redis-server on a CPU of
# its own and redis-benchmark on the others, as a fleet's Redis runs: on
# two shared CPUs the kernel takes Redis's CPU away in the middle of
# calls, and a call's time is counted from its start to its end, so the
# same function (token_bucket's) measured anywhere from 7.8 to 13.3 µs
# between runs. Pinned, a slow round still happens (the host's other
# tenants), which the medians leave out.
#
# Installs redis-server and redis-tools from Debian packages when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-5}
CALLS=${CALLS:-100000}
PIN=${PIN:-$(python3 -c 'import os; print("redis" if len(os.sched_getaffinity(0)) >= 2 else "none")')}

# shellcheck source=bench/lib.sh
. bench/lib.sh
pin_cpus "$PIN"
need redis-server:redis-server redis-benchmark:redis-tools
start_redis

go run ./bench/luasrc "$work"
cli() { redis-cli -p "$redis_port" "$@"; }
sha=$(cli -x script load <"$work/decide.lua")
lib=$(cat "$work/library.name")
# bench.lua is the library with two measuring functions more (floor and
# decide_many, see bench/luasrc); the decisions run the same code.
cli -x function load replace <"$work/bench.lua" >/dev/null
floor=$(cli script load "local t = redis.call('TIME')
local v = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], '0123456789abcdef', 'PX', 60000)
return {1, t[1]}")

# The redis_rate peer's script (go-redis/redis_rate's GCRA, one EVALSHA
# per request in bench/run.sh), read from the module bench/peers builds
# with, for the same rate as that peer's Caddyfile there: next to the
# floor, what the one-round-trip limiter a user would write costs Redis.
rr_sha=""
if rr_dir=$(cd bench/peers && go mod download github.com/go-redis/redis_rate/v10 && go list -m -f '{{.Dir}}' github.com/go-redis/redis_rate/v10) &&
	python3 -c 'import re, sys; s = open(sys.argv[1] + "/lua.go").read(); sys.stdout.write(re.search(r"allowN = redis.NewScript\(`(.*?)`\)", s, re.S).group(1))' "$rr_dir" >"$work/redis_rate.lua"; then
	rr_sha=$(cli -x script load <"$work/redis_rate.lua")
else
	echo "no redis_rate row: its module's script could not be read" >&2
fi

# One check on an existing bucket that always allows: algorithm, limit,
# window µs, burst, min_interval µs, cost, shadow. The token bucket and
# GCRA refill one unit an hour from a burst of a million, so a charged
# bucket lives on (as the floor's key does) and never runs dry here; at
# 2^40 units an hour it would be full again, and its key gone, a
# millisecond after each call, and every call would create it. The sliding
# log is 100 per minute, a realistic log, full after a few rounds (denials
# cost about the same as admissions).
check() {
	case $1 in
	sliding_log) echo "sliding_log 100 60000000 0 0 1 0" ;;
	token_bucket | gcra) echo "$1 1 3600000000 1000000 0 1 0" ;;
	*) echo "$1 1099511627776 3600000000 0 0 1 0" ;;
	esac
}
# key ALGORITHM: a bucket as a policy without `key` names it (one per
# tenant and policy, the default with `tenant`); partitioned, as a policy
# with `key {http.request.method} {http.request.uri.path}` names it (its
# writes also keep the tenant's partition index, which a reset reads).
key() { echo "rl:$1:{tenant-__rand_int__}:api"; }
partitioned_key() { echo "rl:$1:{tenant-__rand_int__}:api:GET%20%2Fv1%2Fitems"; }

# row NAME -> the redis-benchmark arguments of row NAME.
row() {
	local name=$1 algo form
	case $name in
	floor) echo "evalsha $floor 1 rl:floor:{tenant-__rand_int__}:api"; return ;;
	floor/fcall) echo "fcall ${lib}_floor 1 rl:floorf:{tenant-__rand_int__}:api"; return ;;
	redis_rate) echo "evalsha $rr_sha 1 rr:{tenant-__rand_int__} 1000000000 1000000000 3600 1"; return ;;
	partitioned/fcall) echo "fcall ${lib}_decide 1 $(partitioned_key token_bucket) decide 0 $(check token_bucket)"; return ;;
	many/one-call)
		# 16 independent token_bucket decisions (16 tenants) in one call;
		# measure divides its time by 16. Against token_bucket/fcall: the
		# same decisions, one call each, pipelined.
		local ks="" as="" t
		for t in $(seq 16); do
			ks="$ks rl:token_bucket:{tenant-$t}:api"
			as="$as 1 9 decide 0 $(check token_bucket)"
		done
		echo "fcall ${lib}_decide_many 16$ks 16$as"
		return ;;
	charge/*)
		# A settlement's forced charge on one tenant's bucket, without and
		# with an id (a new one per call: __rand_int__ over 10^9).
		form=${name#charge/}
		local tb="token_bucket 1099511627776 3600000000 0 0 1 0"
		case $form in
		force) echo "evalsha $sha 1 rl:token_bucket:{tenant-42}:tokens force 0 $tb" ;;
		once) echo "evalsha $sha 2 rl:token_bucket:{tenant-42}:tokens rl:once:{tenant-42}:id-__rand_int__ force_once 0 $tb" ;;
		once-fcall) echo "fcall ${lib}_decide 2 rl:token_bucket:{tenant-42}:tokens rl:once:{tenant-42}:id-__rand_int__ force_once 0 $tb" ;;
		# A give-back (count_status, refund_status): one unit back to a
		# sliding window at the instant it was charged (the shadow
		# argument's place holds that instant), with an id.
		giveback-fcall) echo "fcall ${lib}_decide 2 rl:sliding_window:{tenant-42}:gb rl:once:{tenant-42}:id-__rand_int__ force_once 0 sliding_window 1099511627776 3600000000 0 0 -1 $charged_at" ;;
		esac
		return ;;
	slots/*)
		# A concurrency request's two calls, with its slot held under an
		# id (the default) and by count alone (before holds; limit 2^40,
		# so every acquire is admitted).
		local cc="concurrency 1099511627776 0 0 0 1 0"
		case ${name#slots/} in
		acquire-count) echo "fcall ${lib}_decide 1 rl:concurrency:{tenant-42}:slots decide 0 $cc" ;;
		acquire-held) echo "fcall ${lib}_decide 2 rl:concurrency:{tenant-42}:slots rl:once:{tenant-42}:h-__rand_int__ acquire 0 $cc" ;;
		release-count) echo "fcall ${lib}_release 1 rl:concurrency:{tenant-42}:slots 1" ;;
		# A retry that finds no record (the costlier branch: it records "gone").
		release-held) echo "fcall ${lib}_release 2 rl:concurrency:{tenant-42}:slots rl:once:{tenant-42}:h-__rand_int__ 1 unsure" ;;
		esac
		return ;;
	3-policies/*)
		form=${name#3-policies/}
		local ks="3 rl:token_bucket:{tenant-42}:burst rl:sliding_window:{tenant-42}:minute rl:fixed_window:{tenant-42}:daily"
		local as="decide 0 token_bucket 1099511627776 1000000 0 0 1 0 sliding_window 1099511627776 60000000 0 0 1 0 fixed_window 1099511627776 86400000000 0 0 1 0"
		if [ "$form" = fcall ]; then echo "fcall ${lib}_decide $ks $as"; else echo "evalsha $sha $ks $as"; fi
		return ;;
	esac
	algo=${name%/*}; form=${name#*/}
	if [ "$form" = fcall ]; then
		echo "fcall ${lib}_decide 1 $(key "$algo") decide 0 $(check "$algo")"
	else
		echo "evalsha $sha 1 $(key "$algo") decide 0 $(check "$algo")"
	fi
}

rows=(floor floor/fcall many/one-call partitioned/fcall)
if [ -n "$rr_sha" ]; then rows+=(redis_rate); fi
for a in token_bucket gcra sliding_window fixed_window sliding_log concurrency 3-policies; do
	rows+=("$a/evalsha" "$a/fcall")
done
rows+=(charge/force charge/once charge/once-fcall charge/giveback-fcall)
rows+=(slots/acquire-count slots/acquire-held slots/release-count slots/release-held)
# The give-back row's bucket: charged a million units at charged_at, so
# every give-back finds units to give back.
charged_at=$(($(date +%s) * 1000000))
cli fcall "${lib}_decide" 1 "rl:sliding_window:{tenant-42}:gb" decide "$charged_at" sliding_window 1099511627776 3600000000 0 0 1000000 0 >/dev/null

# measure NAME -> usec_per_call of the row's command.
measure() {
	local args cmd
	args=$(row "$1")
	cmd=${args%% *}
	local keyspace=100
	case $1 in charge/* | slots/*) keyspace=1000000000 ;; esac
	cli config resetstat >/dev/null
	# shellcheck disable=SC2086
	${rest_prefix[@]+"${rest_prefix[@]}"} redis-benchmark -p "$redis_port" -n "$CALLS" -P 16 -c 4 -r "$keyspace" -q $args >/dev/null
	local per=1
	case $1 in many/*) per=16 ;; esac
	cli info commandstats | tr -d '\r' | awk -F'usec_per_call=' -v c="cmdstat_$cmd:" -v per="$per" 'index($0, c) == 1 { split($2, a, ","); print a[1] / per }'
}

# Warm up: every key exists, the library's algorithms are built.
for r in "${rows[@]}"; do CALLS=2000 measure "$r" >/dev/null; done

results=()
k=${#rows[@]}
for round in $(seq "$ROUNDS"); do
	echo "round $round of $ROUNDS..." >&2
	for i in $(seq 0 $((k - 1))); do
		r=${rows[$(((i + round - 1) % k))]}
		results+=("$round $r $(measure "$r")")
	done
done

# What an id costs in memory: used_memory before and after 100 000 calls
# with new ids, per id (the key, its value, its expiry).
cli flushall >/dev/null
before=$(cli info memory | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2 }')
# shellcheck disable=SC2046
${rest_prefix[@]+"${rest_prefix[@]}"} redis-benchmark -p "$redis_port" -n 100000 -P 16 -c 4 -r 1000000000 -q $(row charge/once) >/dev/null
after=$(cli info memory | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2 }')
ids=$(cli dbsize | tr -d '\r')
results+=("memory $((after - before)) $((ids - 1))")

python3 - "$ROUNDS" "$CALLS" "$PIN" "${results[@]}" <<'PY'
import sys, statistics
rounds, calls, pin = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [r.split() for r in sys.argv[4:]]
mem = [r for r in rows if r[0] == "memory"]
rows = [r for r in rows if r[0] != "memory"]
floor = {rnd: float(us) for rnd, name, us in rows if name == "floor"}
by = {}
for rnd, name, us in rows:
    by.setdefault(name, []).append((float(us), float(us) / floor[rnd]))
med = statistics.median
where = "redis-server on a CPU of its own" if pin == "redis" else "redis-server and redis-benchmark sharing every CPU"
print(f"Redis µs per call (INFO commandstats usec_per_call), {rounds} interleaved rounds of {calls} calls, 16 pipelined x 4 connections, {where}; medians (range over rounds).")
print()
print("| decision | `EVALSHA` (`functions off`): µs | ratio to the floor | `FCALL` (the default): µs | ratio to the floor |")
print("|---|---|---|---|---|")
def cell(name):
    xs = by.get(name)
    if not xs:
        return "—", "—"
    us = sorted(x[0] for x in xs)
    return f"{med(us):.1f} ({us[0]:.1f}–{us[-1]:.1f})", f"{med([x[1] for x in xs]):.2f}"
us, _ = cell("floor")
fus, fr = cell("floor/fcall")
print(f"| floor script (`TIME` + `GET` + `SET PX`) | {us} | 1.00 | {fus} | {fr} |")
if "redis_rate" in by:
    rr, rrr = cell("redis_rate")
    print(f"| go-redis/redis_rate's GCRA script (the `redis_rate` peer of `bench/run.sh`) | {rr} | {rrr} | — | — |")
names = {"3-policies": "3 policies of one tenant, one call", "sliding_log": "sliding_log (100 per minute)"}
for a in ["token_bucket", "gcra", "sliding_window", "fixed_window", "sliding_log", "concurrency", "3-policies"]:
    e, er = cell(a + "/evalsha")
    f, fr = cell(a + "/fcall")
    print(f"| {names.get(a, a)} | {e} | {er} | {f} | {fr} |")
f, fr = cell("partitioned/fcall")
print(f"| token_bucket, partitioned (`key`) | — | — | {f} | {fr} |")
print()
print("| 16 independent token_bucket decisions, `FCALL` | µs per decision | ratio to the floor |")
print("|---|---|---|")
for name, label in [("token_bucket/fcall", "one call each, pipelined (what the store sends)"), ("many/one-call", "in one call (`decide_many`, measured only)")]:
    us, r = cell(name)
    print(f"| {label} | {us} | {r} |")
print()
print("| a settlement's forced charge (one token bucket) | `EVALSHA`: µs | ratio to the floor |")
print("|---|---|---|")
for name, label in [("charge/force", "without an id"), ("charge/once", "with an id (`force_once`)"), ("charge/once-fcall", "with an id, `FCALL`"), ("charge/giveback-fcall", "a give-back to a sliding window at its instant, with an id, `FCALL`")]:
    us, r = cell(name)
    print(f"| {label} | {us} | {r} |")
print()
print("| a concurrency request's calls, `FCALL` | by count alone: µs | ratio to the floor | held under an id (the default): µs | ratio to the floor |")
print("|---|---|---|---|---|")
for op in ["acquire", "release"]:
    c, cr = cell("slots/" + op + "-count")
    h, hr = cell("slots/" + op + "-held")
    print(f"| {op} | {c} | {cr} | {h} | {hr} |")
if mem:
    _, delta, ids = mem[0]
    print()
    print(f"Memory per id: {int(delta) / max(int(ids), 1):.0f} bytes ({ids} ids kept, used_memory +{int(delta)} bytes), for IdempotencyTTL (10 minutes).")
PY
