#!/usr/bin/env bash
# Runs every Tollgate test: formatting, vet, staticcheck (a pinned version,
# through the Go module proxy) and `go test -race` over all packages (unit,
# fuzz seed corpora, Caddy end-to-end, built binary). The fast tier without
# Redis is `go test -short ./...`.
# Installs what the tests need when it is missing (redis-server and
# redis-cli from Debian packages; needs root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
command -v redis-server >/dev/null 2>&1 || need_pkgs+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_pkgs+=(redis-tools)
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
# -p 1: one package at a time, so the latency bounds of the fault-injection
# tests are not measured while another package saturates the 2 cores.
go test -race -count=1 -p 1 -timeout 30m "$@" ./...
