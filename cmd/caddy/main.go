// Command caddy is Caddy with its standard modules plus Tollgate: the binary
// that `xcaddy build --with github.com/tollgate/caddy-tollgate` would produce.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/tollgate/caddy-tollgate"
)

func main() {
	caddycmd.Main()
}
