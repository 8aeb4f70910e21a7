#!/usr/bin/env bash
# Protection benchmark: a fake upstream whose capacity is C concurrent
# requests (latency flat up to C, growing beyond, 503 past 2C), behind the
# built Caddy, driven by bench/protectload: one tenant at 10 times the
# upstream's capacity and three light tenants at 10% each (open loop),
# after the light tenants alone (their unloaded p99). C halves half way;
# the 5 s after that (the time the limit has to follow) are reported apart
# from the steady state at C/2.
# Runs the same load with the protect block and without it, in one run,
# and prints a Markdown table (also written to bench/results/protect.md).
#
#   ./bench/protect.sh                       # C=20, base 200ms, 30 s of flood
#   CAPACITY=40 DURATION=30s ./bench/protect.sh
set -euo pipefail
cd "$(dirname "$0")/.."

ulimit -n 65536 2>/dev/null || true

CAPACITY=${CAPACITY:-20}
BASE=${BASE:-200ms}
DURATION=${DURATION:-30s}

# shellcheck source=bench/lib.sh
. bench/lib.sh

echo "building cmd/caddy and bench/protectload..." >&2
go build -o "$work/caddy" ./cmd/caddy
go build -o "$work/protectload" ./bench/protectload

# run NAME PROTECT_BLOCK -> one JSON line of protectload's measures
run() {
	local name=$1 block=$2 port admin up
	port=$(free_port); admin=$(free_port); up=$(free_port)
	cat >"$work/$name.Caddyfile" <<CADDY
$(caddy_globals "$admin")
http://127.0.0.1:$port {
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy generous {
			limit 1000000000
			window 1h
		}
$block
	}
	reverse_proxy 127.0.0.1:$up {
		transport http {
			max_conns_per_host 0
		}
	}
}
CADDY
	"$work/caddy" run --config "$work/$name.Caddyfile" --adapter caddyfile >"$work/$name.log" 2>&1 &
	local pid=$!
	wait_port "$port"
	"$work/protectload" -upstream "127.0.0.1:$up" -capacity "$CAPACITY" -base "$BASE" -duration "$DURATION" \
		-target "http://127.0.0.1:$port/" -metrics "http://127.0.0.1:$admin/metrics"
	kill "$pid"; wait "$pid" 2>/dev/null || true
}

protect_block="		protect {
			min 2
			max 400
		}"
with=$(run protect "$protect_block")
without=$(run none "")

mkdir -p bench/results
printf '%s\n%s\n' "$with" "$without" >bench/results/protect.json
python3 - "$with" "$without" <<'PY' | tee bench/results/protect.md
import json, sys
w, n = json.loads(sys.argv[1]), json.loads(sys.argv[2])
c = w["capacity"]
print(f"Upstream capacity C = {c} concurrent ({w['capacity_rps']:.0f} requests/s at its base latency); C halves half way.")
print()
print("| | with protect | without | target |")
print("|---|---|---|---|")
def row(label, key, fmt, target=""):
    print(f"| {label} | {fmt(w.get(key))} | {fmt(n.get(key))} | {target} |")
f2 = lambda v: "–" if v is None else f"{v:.2f}"
pc = lambda v: "–" if v is None else f"{100*v:.1f}%"
ms = lambda v: "none served" if not v else f"{v:.0f} ms"
i = lambda v: "–" if v is None else f"{v}"
row("in flight at the upstream, p99 (C)", "inflight_p99_first_half", i, f"≤ {1.2*c:.0f} (1.2 C)")
row("in flight at the upstream, max (C)", "inflight_max_first_half", i)
row("in flight, p99 at C/2 (after the 5 s to follow)", "inflight_p99_second_half", i, f"≤ {1.2*c/2:.0f}")
row("in flight, max in the 5 s after C halved", "inflight_max_transition", i)
row("goodput / capacity (C)", "goodput_first_half", pc, "≥ 90%")
row("goodput / capacity (C/2)", "goodput_second_half", pc, "≥ 90%")
for t in ("light-1", "light-2", "light-3"):
    a = w[t+'_alone_p99_ms']
    row(f"{t} success (whole run)", f"{t}_success", pc, "≥ 99%")
    row(f"{t} p99 at C (alone: {a:.0f} ms with, {n[t+'_alone_p99_ms']:.0f} ms without)", f"{t}_p99_ms", ms, f"≤ {2*a:.0f} ms (2×)")
    row(f"{t} p99 at C/2", f"{t}_p99_second_half_ms", ms, f"≤ {2*a:.0f} ms (2×)")
    row(f"{t} p99 in the 5 s after C halved", f"{t}_p99_transition_ms", ms)
row("flood success", "flood_success", pc)
row("limit followed C/2 within", "limit_followed_seconds", lambda v: "–" if v is None or v < 0 else f"{v:.1f} s", "≤ 5 s")
PY
