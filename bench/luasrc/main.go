// Command luasrc writes Tollgate's decide script and function library to a
// directory, for bench/scripts.sh: decide.lua (the script EVALSHA runs),
// library.lua (the source FUNCTION LOAD takes), library.name (the
// library's name, which prefixes its functions), and bench.lua: the library
// with two functions more, for measurements only (never loaded by
// Tollgate):
//
//   - <name>_floor: the floor as a function (TIME, GET, SET ... PX);
//
//   - <name>_decide_many: several independent decisions in one call, each
//     run by the decide entry point unchanged. ARGV: the number of
//     decisions, then for each its key count, its argument count and its
//     arguments; KEYS: every decision's keys in order. It answers each
//     decision's reply, its length first, one after the other.
//
//     go run ./bench/luasrc DIR
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tollgate/caddy-tollgate/lua"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: luasrc DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	bench, err := benchLibrary()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for name, body := range map[string]string{
		"decide.lua":   lua.Decide,
		"library.lua":  lua.Library,
		"library.name": lua.LibraryName,
		"bench.lua":    bench,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

// benchLibrary returns lua.Library with the floor and decide_many
// functions added (see the package comment).
func benchLibrary() (string, error) {
	head := "redis.register_function('" + lua.Function("decide") + "', function(keys, args)\nKEYS, ARGV = keys, args\n"
	i := strings.Index(lua.Library, head)
	if i < 0 {
		return "", fmt.Errorf("luasrc: no decide function in the library")
	}
	body := lua.Library[i+len(head):]
	j := strings.Index(body, "\nend)\n")
	if j < 0 {
		return "", fmt.Errorf("luasrc: the decide function does not end")
	}
	body = body[:j]
	return lua.Library + `
redis.register_function('` + lua.Function("floor") + `', function(keys, args)
  local t = redis.call('TIME')
  redis.call('GET', keys[1])
  redis.call('SET', keys[1], '0123456789abcdef', 'PX', 60000)
  return {1, t[1]}
end)

local function decide_one()
` + body + `
end

redis.register_function('` + lua.Function("decide_many") + `', function(keys, args)
  local out, n, ki, ai = {}, 0, 1, 2
  for _ = 1, tonumber(args[1]) do
    local nk, na = tonumber(args[ai]), tonumber(args[ai + 1])
    ai = ai + 2
    local k, a = {}, {}
    for i = 1, nk do k[i] = keys[ki]; ki = ki + 1 end
    for i = 1, na do a[i] = args[ai]; ai = ai + 1 end
    KEYS, ARGV = k, a
    local r = decide_one()
    n = n + 1
    out[n] = #r
    for i = 1, #r do n = n + 1; out[n] = r[i] end
  end
  return out
end)
`, nil
}
