// Command libdiff checks that two builds of Tollgate's function library
// decide alike: it loads both (directories written by bench/luasrc) into
// one redis-server and sends each the same random calls of one
// algorithm's decide function, on keys of its own, with the instant
// passed in (so both see the same clock), and compares every reply, the
// stored state and the key's TTL after each call. A change meant to make
// the Lua cheaper without changing an answer is checked with it:
//
//	go run ./bench/luasrc /tmp/old   # before the change
//	go run ./bench/luasrc /tmp/new   # after it
//	redis-server --port 6391 --save '' --daemonize yes
//	go run ./bench/libdiff -addr 127.0.0.1:6391 sliding_window /tmp/old /tmp/new
//
// The calls follow random sequences per key: limits 1 to 10^9, windows 1
// s to 30 days, bursts (not for the windows), costs 0 to half the limit
// and above it, instants moving forward by little or by windows and
// sometimes back, limits and windows changing under a key, two checks of
// one key in one call, and the modes peek, dry and force (with
// give-backs at their instant). Each call runs in a MULTI/EXEC with the
// reads of its key, which then make the key persistent: the clock is
// simulated, and Redis would otherwise expire keys in real time. TTLs are
// compared within 20 ms: PTTL counts from its own read, and the two reads
// are a few milliseconds apart on a busy machine.
//
// It exits 1 at the first difference, printing both answers.
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "the redis-server to load both libraries into")
	seqs := flag.Int("seqs", 6000, "random sequences (one key per library each)")
	seed := flag.Uint64("seed", 1, "random seed")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: libdiff [flags] ALGORITHM OLD_DIR NEW_DIR")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 3 {
		flag.Usage()
		os.Exit(2)
	}
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: *addr})
	defer client.Close()
	var libs [2]string
	for i, dir := range flag.Args()[1:] {
		name, err := load(ctx, client, dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "libdiff:", err)
			os.Exit(1)
		}
		libs[i] = name
	}
	n, err := compare(ctx, client, flag.Arg(0), libs, *seqs, *seed)
	if err != nil {
		fmt.Fprintln(os.Stderr, "libdiff:", err)
		os.Exit(1)
	}
	fmt.Printf("identical: %d calls\n", n)
}

// load loads the library bench/luasrc wrote to dir and returns its name.
func load(ctx context.Context, client *redis.Client, dir string) (string, error) {
	body, err := os.ReadFile(dir + "/library.lua")
	if err != nil {
		return "", err
	}
	name, err := os.ReadFile(dir + "/library.name")
	if err != nil {
		return "", err
	}
	if err := client.FunctionLoadReplace(ctx, string(body)).Err(); err != nil {
		return "", fmt.Errorf("loading %s: %w", dir, err)
	}
	return strings.TrimSpace(string(name)), nil
}

// answer is what one library did with one call.
type answer struct {
	reply []any
	state string // the key's value after the call, hex
	ttl   int64  // the key's PTTL after the call, ms
}

// compare sends both libraries the same random calls and returns how
// many it sent, or the first difference as an error.
func compare(ctx context.Context, client *redis.Client, alg string, libs [2]string, seqs int, seed uint64) (int, error) {
	r := rand.New(rand.NewPCG(seed, uint64(len(alg))))
	logUniform := func(lo, hi float64) int64 {
		return int64(math.Exp(math.Log(lo) + r.Float64()*(math.Log(hi)-math.Log(lo))))
	}
	calls := 0
	for seq := 0; seq < seqs; seq++ {
		limit, window := logUniform(1, 1e9), logUniform(1e6, 2.592e12)
		burst := int64(0)
		if alg == "token_bucket" || alg == "gcra" {
			if r.IntN(3) == 0 {
				burst = limit * (1 + r.Int64N(4))
			}
		}
		now := int64(1.7e15) + r.Int64N(1e12)
		for step, steps := 0, 5+r.IntN(40); step < steps; step++ {
			switch r.IntN(10) {
			case 0:
				now -= r.Int64N(window/2 + 1) // the clock goes back
			case 1, 2:
				now += r.Int64N(2*window + 1)
			case 3:
			default:
				now += r.Int64N(window/max(limit, 1)*3 + 2)
			}
			if r.IntN(25) == 0 {
				window = logUniform(1e6, 2.592e12)
			}
			if r.IntN(25) == 0 {
				limit = logUniform(1, 1e9)
			}
			cost := int64(r.IntN(4))
			switch {
			case r.IntN(20) == 0:
				cost = limit + 1
			case r.IntN(3) == 0 && limit > 3:
				cost = r.Int64N(limit/2 + 1)
			}
			mode, checks, shadow := "decide", 1, "0"
			switch r.IntN(12) {
			case 0:
				mode = "peek"
			case 1:
				mode = "dry"
			case 2:
				mode = "force"
				if r.IntN(2) == 0 { // a give-back at the instant it was charged
					cost = -cost
					shadow = strconv.FormatInt(now-r.Int64N(2*window+1), 10)
				}
			case 3, 4:
				checks = 2
			}
			var got [2]answer
			for i, lib := range libs {
				key := fmt.Sprintf("rl:%s:{t%d-%d}:api", alg, i, seq)
				keys := make([]string, 0, checks)
				args := []any{mode, strconv.FormatInt(now, 10)}
				for c := 0; c < checks; c++ {
					l, w := limit, window
					if c == 1 { // a second policy on the same key
						l = 2*limit + 1
						if seq%2 == 0 {
							w = 2 * window
						}
					}
					keys = append(keys, key)
					args = append(args, alg, strconv.FormatInt(l, 10), strconv.FormatInt(w, 10),
						strconv.FormatInt(burst, 10), "0", strconv.FormatInt(cost, 10), shadow)
				}
				a, err := run(ctx, client, lib+"_decide", key, keys, args)
				if err != nil {
					return calls, err
				}
				got[i] = a
			}
			calls++
			if d := got[0].ttl - got[1].ttl; !reflect.DeepEqual(got[0].reply, got[1].reply) ||
				got[0].state != got[1].state || d > 20 || d < -20 {
				return calls, fmt.Errorf("sequence %d step %d (%s, limit %d, window %d µs, cost %d, now %d):\n old %v %s PTTL %d ms\n new %v %s PTTL %d ms",
					seq, step, mode, limit, window, cost, now,
					got[0].reply, got[0].state, got[0].ttl, got[1].reply, got[1].state, got[1].ttl)
			}
		}
	}
	return calls, nil
}

// run sends one call and reads what it left in key, in one MULTI/EXEC
// so that the key cannot expire in real time in between. A script error
// is an answer too (both libraries must fail alike).
func run(ctx context.Context, client *redis.Client, fn, key string, keys []string, args []any) (answer, error) {
	var call *redis.Cmd
	var get *redis.StringCmd
	var ttl *redis.DurationCmd
	_, err := client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		call = p.FCall(ctx, fn, keys, args...)
		get = p.Get(ctx, key)
		ttl = p.PTTL(ctx, key)
		p.Persist(ctx, key)
		return nil
	})
	if err != nil && err != redis.Nil && call.Err() == nil {
		return answer{}, err
	}
	var a answer
	if v, err := call.Slice(); err != nil {
		a.reply = []any{"error: " + err.Error()}
	} else {
		a.reply = v
	}
	a.state = fmt.Sprintf("%x", get.Val())
	a.ttl = ttl.Val().Milliseconds()
	return a, nil
}
