// Command caddy is Caddy with its standard modules plus the peers of
// bench/run.sh: the binary `xcaddy build --with` the peers would produce.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/tollgate/caddy-tollgate/bench/peers/redisfloor"
	_ "github.com/tollgate/caddy-tollgate/bench/peers/redisrate"
)

func main() {
	caddycmd.Main()
}
