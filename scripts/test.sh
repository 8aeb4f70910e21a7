#!/usr/bin/env bash
# Runs every Tollgate test: formatting, vet, staticcheck (a pinned version,
# through the Go module proxy) and `go test -race` over all packages (unit,
# fuzz seed corpora, Caddy end-to-end, built binary). The fast tier without
# Redis is `go test -short ./...`.
# Installs what the tests need when it is missing (redis-server and
# redis-cli, and chromium for the tenant page's browser test, from Debian
# packages; needs root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
command -v redis-server >/dev/null 2>&1 || need_pkgs+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_pkgs+=(redis-tools)
command -v chromium >/dev/null 2>&1 || need_pkgs+=(chromium)
if [ ${#need_pkgs[@]} -gt 0 ]; then
	sudo_cmd=""
	[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
	echo "installing ${need_pkgs[*]}"
	$sudo_cmd apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
# The Debian package starts a system redis-server on :6379; the tests start
# their own on free ports and do not need it.

unformatted=$(gofmt -l . | grep -v '^vendor/' || true)
if [ -n "$unformatted" ]; then
	echo "gofmt would change:" >&2
	echo "$unformatted" >&2
	exit 1
fi
go vet ./...
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
# One package at a time, so the latency bounds of the fault-injection
# tests are not measured while another package saturates the 2 cores.
# Each package prints when it starts and ends, and a long one says it is
# still running every 30 s.
pkgs=$(go list ./...)
total=$(echo "$pkgs" | wc -l)
failed=()
i=0
suite_start=$SECONDS
for pkg in $pkgs; do
	i=$((i + 1))
	echo "[$i/$total] $pkg"
	start=$SECONDS
	(while sleep 30; do echo "    ... $pkg still running ($((SECONDS - start)) s)"; done) &
	ticker=$!
	status=0
	go test -race -count=1 -timeout 30m "$@" "$pkg" || status=$?
	kill "$ticker" 2>/dev/null || true
	wait "$ticker" 2>/dev/null || true
	[ "$status" -eq 0 ] || failed+=("$pkg")
done
echo "all packages in $((SECONDS - suite_start)) s"
if [ ${#failed[@]} -gt 0 ]; then
	echo "FAILED: ${failed[*]}" >&2
	exit 1
fi
