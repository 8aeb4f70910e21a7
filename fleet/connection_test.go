package fleet

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// replyDropper is a TCP proxy to a Redis that, when armed, drops the next
// reply of a one-check decision it receives and closes that connection: a call written, run by
// Redis, and its reply lost (as a proxy or a load balancer resetting a
// connection does).
type replyDropper struct {
	ln      net.Listener
	target  string
	armed   atomic.Bool
	dropped atomic.Int64
	wg      sync.WaitGroup
}

func startReplyDropper(t *testing.T, target string) *replyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyDropper{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.wg.Wait()
	})
	return p
}

func (p *replyDropper) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(s, c)
			s.Close()
		}()
		go func() {
			defer p.wg.Done()
			defer c.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				// A decision's reply: {admitted, now, then 4 per check}.
				if bytes.HasPrefix(buf[:n], []byte("*6\r\n:")) && p.armed.CompareAndSwap(true, false) {
					p.dropped.Add(1)
					s.Close()
					return
				}
				if n > 0 {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// TestNoResendAfterLostReply: a call whose reply is lost after Redis ran
// it is not sent again by the client library. go-redis retries a pipeline
// whose connection broke after the write (and one whose reply timed out):
// the decision below was charged twice, and answered as if once.
func TestNoResendAfterLostReply(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	p := startReplyDropper(t, srv.Addr)
	b, err := Acquire(BackendOptions{Connection: Connection{Addresses: []string{p.ln.Addr().String()}, Timeout: 2 * time.Second}, Prefix: "nr"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	check := func(tenant string) []limiter.Check {
		return []limiter.Check{{Algorithm: limiter.TokenBucket, Tenant: tenant, Policy: "p", Rate: limiter.Rate{Limit: 100, Window: time.Hour}, Cost: 1}}
	}
	ctx := context.Background()
	res := make([]limiter.Result, 1)
	// Warm up: the connection and the script are ready.
	if _, err := b.Store().Decide(ctx, check("warm"), res); err != nil {
		t.Fatal(err)
	}
	p.armed.Store(true)
	_, err = b.Store().Decide(ctx, check("acme"), res)
	if p.dropped.Load() != 1 {
		t.Fatalf("%d replies dropped, want 1", p.dropped.Load())
	}
	if err == nil {
		t.Errorf("the decision whose reply was lost answered (remaining %d): it was sent again", res[0].Remaining)
	}
	if err := b.Store().Peek(ctx, check("acme"), res); err != nil {
		t.Fatal(err)
	}
	if res[0].Remaining != 99 {
		t.Fatalf("remaining %d after one decision, want 99 (charged once)", res[0].Remaining)
	}
}

// TestOptionsAddrsClipped: the addresses handed to go-redis leave no room
// to append in place. A cluster client appends the nodes it discovers to
// its Addrs; two connections cut from one array (TestNearLimitFleetCluster
// builds backends from addrs[i:]) had two clients write the same memory,
// which the race detector reported once in a full run.
func TestOptionsAddrsClipped(t *testing.T) {
	all := make([]string, 3, 8)
	all[0], all[1], all[2] = "127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"
	for i := range all {
		opts, err := Connection{Addresses: all[i:], Cluster: true}.options()
		if err != nil {
			t.Fatal(err)
		}
		if len(opts.Addrs) != len(all)-i || cap(opts.Addrs) != len(opts.Addrs) {
			t.Errorf("addresses from %d: len %d cap %d, want both %d", i, len(opts.Addrs), cap(opts.Addrs), len(all)-i)
		}
	}
}
