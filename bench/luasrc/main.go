// Command luasrc writes Tollgate's decide script and function library to a
// directory, for bench/scripts.sh: decide.lua (the script EVALSHA runs),
// library.lua (the source FUNCTION LOAD takes) and library.name (the
// library's name, which prefixes its functions).
//
//	go run ./bench/luasrc DIR
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/tollgate/caddy-tollgate/lua"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: luasrc DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	for name, body := range map[string]string{
		"decide.lua":   lua.Decide,
		"library.lua":  lua.Library,
		"library.name": lua.LibraryName,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
