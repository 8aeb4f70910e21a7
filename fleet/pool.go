package fleet

import "sync"

// pool shares values by key and counts their users: the first acquire
// creates the value, the last release destroys it.
type pool[V any] struct {
	mu    sync.Mutex
	items map[string]*pooled[V]
}

type pooled[V any] struct {
	v    V
	refs int
}

// acquire returns the value of key, creating it with create on first use.
func (p *pool[V]) acquire(key string, create func() (V, error)) (V, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if it, ok := p.items[key]; ok {
		it.refs++
		return it.v, nil
	}
	v, err := create()
	if err != nil {
		var zero V
		return zero, err
	}
	if p.items == nil {
		p.items = make(map[string]*pooled[V])
	}
	p.items[key] = &pooled[V]{v: v, refs: 1}
	return v, nil
}

// release drops one use of key and reports whether it was the last one
// (the caller then destroys the value, outside the pool's lock).
func (p *pool[V]) release(key string) (last bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	it, ok := p.items[key]
	if !ok {
		return false
	}
	if it.refs--; it.refs > 0 {
		return false
	}
	delete(p.items, key)
	return true
}
