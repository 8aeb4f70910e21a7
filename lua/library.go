package lua

import (
	"crypto/sha1"
	"encoding/hex"
	"strings"
)

// The scripts as a Redis 7 function library. Redis runs a whole script on
// every EVALSHA: the helpers and the algorithm tables are built again on
// each call, which is a measurable share of a decision's Redis time. A
// function library is run once, when it is loaded (FUNCTION LOAD); its
// functions (FCALL) then find the helpers built, and the algorithm tables
// each call builds on first use stay built for the next calls.
//
// The library is the same source as the scripts: common.lua and the
// algorithms, with KEYS and ARGV declared as library locals that each
// function sets from its own keys and arguments before it runs its entry
// point unchanged. The algorithms keep no state of a call between calls;
// the library keeps the rate tables it built, by their arguments (RATES in
// common.lua).
//
// The library and function names carry a digest of the source, so
// instances of two versions (a rolling upgrade) each find their own.

// libraryEntries are the entry points registered as functions.
var libraryEntries = []struct{ name, body string }{
	{"decide", decide},
	{"lease", lease},
	{"release", release},
	{"keep", keep},
	{"reset", reset},
	{"heartbeat", heartbeat},
}

// LibraryName is the name of the library, "tollgate_" and a digest.
var LibraryName string

// Library is the source of the function library, for FUNCTION LOAD.
var Library string

func init() {
	var b strings.Builder
	b.WriteString("local KEYS, ARGV\n")
	b.WriteString(algorithms)
	// The library keeps its rates between calls (see RATES in common.lua).
	b.WriteString("\nRATES = {}\n")
	for _, e := range libraryEntries {
		b.WriteString("\n")
		b.WriteString("redis.register_function('@@_" + e.name + "', function(keys, args)\n")
		b.WriteString("KEYS, ARGV = keys, args\n")
		b.WriteString(e.body)
		b.WriteString("\nend)\n")
	}
	body := b.String()
	sum := sha1.Sum([]byte(body))
	LibraryName = "tollgate_" + hex.EncodeToString(sum[:6])
	Library = "#!lua name=" + LibraryName + "\n" + strings.ReplaceAll(body, "'@@_", "'"+LibraryName+"_")
}

// Function returns the name of the library function of an entry point:
// "decide", "lease", "release", "keep", "reset" or "heartbeat".
func Function(entry string) string {
	return LibraryName + "_" + entry
}
