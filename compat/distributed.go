package compat

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// This file is caddy-ratelimit's `distributed` mode without Redis: every
// instance writes how much of each zone it used to Caddy's storage and
// reads what the others wrote, every few seconds, and adds their usage to
// its own when it decides (limiter.PeerStore). It is approximate, as
// caddy-ratelimit's is: what another instance admitted since its last
// write is not seen, so a fleet can admit more than a zone's events in a
// window. A `redis` block is the exact mode.
//
// The state files are caddy-ratelimit's own: gob-encoded, one per
// instance at rate_limit/instances/<instance-id>.rlstate, so instances of
// both modules on one storage see each other while a fleet is migrated.

// defaultSyncInterval is caddy-ratelimit's default read and write interval.
const defaultSyncInterval = 5 * time.Second

// stateDir is where caddy-ratelimit keeps the instances' state files.
const stateDir = "rate_limit/instances"

// maxSharedBuckets bounds the buckets one instance publishes: a flood of
// distinct keys must not grow the state file (and memory) without bound.
// Buckets past it are decided locally all the same, only not shared.
const maxSharedBuckets = 100000

// rlState and rlStateValue are caddy-ratelimit's state file, field for
// field (gob matches fields by name).
type rlState struct {
	// When the values were recorded.
	Timestamp time.Time
	// Zone name -> key -> usage.
	Zones map[string]map[string]rlStateValue
}

type rlStateValue struct {
	// Events inside the window at Timestamp.
	Count int
	// When the oldest of them happened.
	OldestEvent time.Time
}

// stateStorage is what of certmagic.Storage the exchange uses.
type stateStorage interface {
	Store(ctx context.Context, key string, value []byte) error
	Load(ctx context.Context, key string) ([]byte, error)
	Delete(ctx context.Context, key string) error
	List(ctx context.Context, path string, recursive bool) ([]string, error)
}

// peerSyncs holds one exchange per storage: every handler of a process
// that shares zones through one storage writes one state file together,
// as caddy-ratelimit does (its file holds every zone of the process).
var peerSyncs = caddy.NewUsagePool()

// peerSync exchanges one process's usage with the other instances on one
// storage.
type peerSync struct {
	storage stateStorage
	file    string // this instance's state file
	logger  *zap.Logger

	mu       sync.Mutex
	attached map[any]config.DistributedConfig
	settings syncSettings
	changed  chan struct{}

	// others is the other instances' last read states.
	others atomic.Pointer[[]rlState]
	// tracked are the buckets this instance charged: zone\x00key ->
	// *trackedBucket.
	tracked  sync.Map
	ntracked atomic.Int64

	started    sync.Once
	stop, done chan struct{}
}

// syncSettings are the effective intervals: the shortest any attached
// handler asks for.
type syncSettings struct {
	read, write, purge time.Duration
}

type trackedBucket struct {
	zone, key string
	store     limiter.Store
	check     limiter.Check
	last      atomic.Int64 // unix nanos of the last local charge
}

// Destruct implements caddy.Destructor: the last handler is gone.
func (ps *peerSync) Destruct() error {
	ps.started.Do(func() { close(ps.done) }) // never started: nothing to stop
	close(ps.stop)
	<-ps.done
	return nil
}

// Peers is a handler's hold on its distributed exchange.
type Peers struct {
	key  string
	sync *peerSync
	id   any
}

// Distribute makes the embedded store m of g decide through a
// limiter.PeerStore fed by the exchange of g's storage: the storage
// module of cfg's StorageRaw (cfg is what Caddy loads it from), or
// Caddy's. Close the Peers when the handler goes.
func Distribute(ctx caddy.Context, cfg *config.Handler, g *gate.Gate, m *gate.Memory, logger *zap.Logger) (*Peers, error) {
	var (
		stor stateStorage
		key  string
	)
	if len(cfg.StorageRaw) > 0 {
		mod, err := ctx.LoadModule(cfg, "StorageRaw")
		if err != nil {
			return nil, fmt.Errorf("loading storage module: %v", err)
		}
		s, err := mod.(caddy.StorageConverter).CertMagicStorage()
		if err != nil {
			return nil, fmt.Errorf("creating storage: %v", err)
		}
		stor, key = s, "storage/"+string(cfg.StorageRaw)
	} else {
		s := ctx.Storage()
		stor, key = s, fmt.Sprintf("default/%T", s)
		if str, ok := s.(fmt.Stringer); ok {
			key = "default/" + str.String()
		}
	}
	v, _, err := peerSyncs.LoadOrNew(key, func() (caddy.Destructor, error) {
		return newPeerSync(stor, logger)
	})
	if err != nil {
		return nil, err
	}
	ps := v.(*peerSync)
	ps.attach(g, *cfg.Distributed)
	ps.start()
	zones := make(map[string]string, len(g.Policies))
	for _, p := range g.Policies {
		zones[p.Engine.Name] = p.Name
	}
	view := &peerView{sync: ps, zones: zones, tenant: cfg.Tenant != "", store: m.MemoryStore()}
	m.Use(limiter.NewPeerStore(m.MemoryStore(), view, nil))
	return &Peers{key: key, sync: ps, id: g}, nil
}

// Close lets go of the exchange; the last handler on a storage stops it.
func (p *Peers) Close() error {
	if p == nil || p.sync == nil {
		return nil
	}
	p.sync.detach(p.id)
	_, err := peerSyncs.Delete(p.key)
	p.sync = nil
	return err
}

func newPeerSync(stor stateStorage, logger *zap.Logger) (*peerSync, error) {
	id, err := caddy.InstanceID()
	if err != nil {
		return nil, fmt.Errorf("distributed: instance ID: %v", err)
	}
	ps := &peerSync{
		storage:  stor,
		file:     path.Join(stateDir, id.String()+".rlstate"),
		logger:   logger,
		attached: map[any]config.DistributedConfig{},
		changed:  make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	ps.others.Store(&[]rlState{})
	return ps, nil
}

// start reads the other instances' states right away, so the first
// decisions count them, and starts the exchange; once.
func (ps *peerSync) start() {
	ps.started.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ps.read(ctx); err != nil {
			ps.logger.Error("reading distributed rate limit states", zap.Error(err))
		}
		go ps.loop()
	})
}

// attach adds h's settings; the exchange runs at the shortest intervals
// of the handlers attached.
func (ps *peerSync) attach(h any, c config.DistributedConfig) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.attached[h] = c
	ps.recompute()
}

func (ps *peerSync) detach(h any) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	delete(ps.attached, h)
	ps.recompute()
}

// recompute sets the effective settings; with ps.mu held.
func (ps *peerSync) recompute() {
	s := syncSettings{read: defaultSyncInterval, write: defaultSyncInterval}
	first := true
	for _, c := range ps.attached {
		r, w := time.Duration(c.ReadInterval), time.Duration(c.WriteInterval)
		if r <= 0 {
			r = defaultSyncInterval
		}
		if w <= 0 {
			w = defaultSyncInterval
		}
		if first {
			s.read, s.write = r, w
		} else {
			s.read, s.write = min(s.read, r), min(s.write, w)
		}
		if p := time.Duration(c.PurgeAge); p > 0 && (s.purge == 0 || p < s.purge) {
			s.purge = p
		}
		first = false
	}
	if s != ps.settings {
		ps.settings = s
		select {
		case ps.changed <- struct{}{}:
		default:
		}
	}
}

func (ps *peerSync) current() syncSettings {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.settings
}

// loop reads and writes at the current intervals until Destruct.
func (ps *peerSync) loop() {
	defer close(ps.done)
	s := ps.current()
	read, write := time.NewTicker(s.read), time.NewTicker(s.write)
	defer read.Stop()
	defer write.Stop()
	for {
		select {
		case <-ps.stop:
			return
		case <-ps.changed:
			s = ps.current()
			read.Reset(s.read)
			write.Reset(s.write)
		case <-read.C:
			ctx, cancel := context.WithTimeout(context.Background(), s.read+10*time.Second)
			if err := ps.read(ctx); err != nil {
				ps.logger.Error("syncing distributed rate limit states", zap.Error(err))
			}
			cancel()
		case <-write.C:
			ctx, cancel := context.WithTimeout(context.Background(), s.write+10*time.Second)
			if err := ps.write(ctx); err != nil {
				ps.logger.Error("writing distributed rate limit state", zap.Error(err))
			}
			cancel()
		}
	}
}

// read loads every other instance's state, deleting those older than the
// purge age.
func (ps *peerSync) read(ctx context.Context) error {
	files, err := ps.storage.List(ctx, stateDir, false)
	if errors.Is(err, fs.ErrNotExist) {
		files, err = nil, nil
	}
	if err != nil {
		return err
	}
	purge := ps.current().purge
	now := time.Now()
	others := make([]rlState, 0, len(files))
	for _, f := range files {
		if f == ps.file || !strings.HasSuffix(f, ".rlstate") || strings.HasSuffix(f, "/"+path.Base(ps.file)) {
			continue
		}
		b, err := ps.storage.Load(ctx, f)
		if err != nil {
			ps.logger.Error("loading distributed rate limit state", zap.String("key", f), zap.Error(err))
			continue
		}
		var st rlState
		if err := gob.NewDecoder(bytes.NewReader(b)).Decode(&st); err != nil {
			ps.logger.Error("corrupted distributed rate limit state", zap.String("key", f), zap.Error(err))
			continue
		}
		if purge > 0 && st.Timestamp.Before(now.Add(-purge)) {
			if err := ps.storage.Delete(ctx, f); err != nil {
				ps.logger.Error("deleting stale distributed rate limit state", zap.String("key", f), zap.Error(err))
			}
			continue
		}
		others = append(others, st)
	}
	ps.others.Store(&others)
	return nil
}

// write stores this instance's usage of every bucket it charged that
// still has units in its window, and forgets the others.
func (ps *peerSync) write(ctx context.Context) error {
	now := time.Now()
	st := rlState{Timestamp: now, Zones: map[string]map[string]rlStateValue{}}
	var res [1]limiter.Result
	ps.tracked.Range(func(k, v any) bool {
		tb := v.(*trackedBucket)
		c := tb.check
		c.Cost = 0
		if err := tb.store.Peek(ctx, []limiter.Check{c}, res[:]); err != nil {
			return true
		}
		u := limiter.LocalUsage(c.Rate, res[0], now)
		if u.Count == 0 {
			if time.Unix(0, tb.last.Load()).Add(c.Rate.Window).Before(now) {
				ps.tracked.Delete(k)
				ps.ntracked.Add(-1)
			}
			return true
		}
		z := st.Zones[tb.zone]
		if z == nil {
			z = map[string]rlStateValue{}
			st.Zones[tb.zone] = z
		}
		z[tb.key] = rlStateValue{Count: int(u.Count), OldestEvent: u.Oldest}
		return true
	})
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(st); err != nil {
		return err
	}
	return ps.storage.Store(ctx, ps.file, buf.Bytes())
}

// track records a local charge of the bucket (zone, key).
func (ps *peerSync) track(zone, key string, store limiter.Store, c *limiter.Check, now time.Time) {
	id := zone + "\x00" + key
	if v, ok := ps.tracked.Load(id); ok {
		tb := v.(*trackedBucket)
		tb.last.Store(now.UnixNano())
		if tb.check.Rate != c.Rate {
			// A reload changed the limit: publish with the new one.
			nb := &trackedBucket{zone: zone, key: key, store: store, check: *c}
			nb.last.Store(now.UnixNano())
			ps.tracked.Store(id, nb)
		}
		return
	}
	if ps.ntracked.Load() >= maxSharedBuckets {
		return
	}
	tb := &trackedBucket{zone: zone, key: key, store: store, check: *c}
	tb.check.Cost = 0
	tb.last.Store(now.UnixNano())
	if _, loaded := ps.tracked.LoadOrStore(id, tb); !loaded {
		ps.ntracked.Add(1)
	}
}

// peerView is one handler's limiter.Peers: it names its buckets as
// caddy-ratelimit does (zone name, key) and looks them up in the exchange.
type peerView struct {
	sync *peerSync
	// zones maps engine policy names to zone names as configured.
	zones map[string]string
	// tenant: the handler has a tenant template, so a bucket is (tenant,
	// key); caddy-ratelimit knows keys only.
	tenant bool
	// store holds the local counts (the embedded store).
	store limiter.Store
}

// bucket is the (zone, key) caddy-ratelimit would file c's bucket under.
// Tenants are named by the value the request sent (limiter.TenantOf: the
// anonymous tenant is the empty key, as there). Without a tenant the key
// is the zone key, as there; with one, tenant and key escaped and joined
// by ':', which no unescaped key contains, so such buckets cannot be
// confused with a peer's.
func (v *peerView) bucket(c *limiter.Check) (string, string) {
	zone, ok := v.zones[c.Policy]
	if !ok {
		zone = c.Policy
	}
	sent := limiter.TenantOf(c.Tenant)
	if !v.tenant {
		return zone, sent
	}
	b := limiter.AppendEscaped(nil, sent)
	b = append(b, ':')
	return zone, string(limiter.AppendEscaped(b, c.Part))
}

// Usage implements limiter.Peers, with caddy-ratelimit's rules: an
// instance that has not written for longer than the window is not
// counted, and the oldest event counts only while inside the window.
func (v *peerView) Usage(c *limiter.Check, now time.Time) limiter.PeerUsage {
	others := *v.sync.others.Load()
	if len(others) == 0 || c.Algorithm != limiter.SlidingLog {
		return limiter.PeerUsage{}
	}
	zone, key := v.bucket(c)
	start := now.Add(-c.Rate.Window)
	var u limiter.PeerUsage
	for i := range others {
		st := &others[i]
		if st.Timestamp.Before(start) {
			continue
		}
		val, ok := st.Zones[zone][key]
		if !ok || val.Count <= 0 {
			continue
		}
		u.Count += int64(val.Count)
		if val.OldestEvent.After(start) && (u.Oldest.IsZero() || val.OldestEvent.Before(u.Oldest)) {
			u.Oldest = val.OldestEvent
		}
	}
	if u.Count > 0 && u.Oldest.IsZero() {
		u.Oldest = now
	}
	return u
}

// Charged implements limiter.Peers.
func (v *peerView) Charged(c *limiter.Check, now time.Time) {
	if c.Algorithm != limiter.SlidingLog {
		return
	}
	zone, key := v.bucket(c)
	v.sync.track(zone, key, v.store, c, now)
}
