package limiter

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// Calendar quotas on both stores, in lockstep on one manual clock: the
// memory store computes the periods itself, the Redis store passes the
// boundaries around the clock to the script, which picks the period of
// the (hooked) Redis time. Days, weeks and months in New York and Berlin
// across their DST changes, a day without midnight in Santiago, and
// requests that mix zones and algorithms.

// calendarZones are the zones of the conformance scenarios.
type calendarZones struct {
	ny, berlin, santiago *time.Location
}

func loadCalendarZones(t testing.TB) calendarZones {
	return calendarZones{mustZone(t, "America/New_York"), mustZone(t, "Europe/Berlin"), mustZone(t, "America/Santiago")}
}

// since is the offset of a local civil time from baseTime, for confStep.at.
func since(loc *time.Location, y int, m time.Month, d, h, min int) time.Duration {
	return time.Date(y, m, d, h, min, 0, 0, loc).Sub(baseTime)
}

func calCheck(policy string, limit int64, cal *Calendar) Check {
	return Check{Algorithm: FixedWindow, Tenant: "t", Policy: policy, Rate: CalendarRate(limit, cal), Cost: 1}
}

func calendarScenarios(z calendarZones) []confScenario {
	h := time.Hour
	day := 24 * h
	var scs []confScenario

	// A New York day: 23 hours in March, 25 in November; Reset and
	// Retry-After count to the next local midnight.
	dayNY := calCheck("day_ny", 3, NewCalendar(CalendarDay, z.ny))
	mar10 := since(z.ny, 2024, 3, 10, 0, 0)
	mar11 := since(z.ny, 2024, 3, 11, 0, 0)
	nov3 := since(z.ny, 2024, 11, 3, 0, 0)
	scs = append(scs, confScenario{name: "calendar/day_new_york_dst", steps: []confStep{
		decideStep(mar10+h, true, cks(withCost(dayNY, 2)), wantAllow(1, 22*h)),
		decideStep(mar10+22*h, true, cks(dayNY), wantAllow(0, h)),
		decideStep(mar10+22*h, false, cks(dayNY), wantDeny(0, h, h)),
		// A cost that never fits waits one period: 23 hours today.
		decideStep(mar10+22*h, false, cks(withCost(dayNY, 4)), wantDeny(0, 23*h, h)),
		decideStep(mar11-time.Microsecond, false, cks(dayNY), wantDeny(0, time.Microsecond, time.Microsecond)),
		peekStep(mar11, cks(withCost(dayNY, 0)), wantAllow(3, 0)),
		decideStep(mar11, true, cks(withCost(dayNY, 3)), wantAllow(0, day)),
		decideStep(mar11, false, cks(withCost(dayNY, 4)), wantDeny(0, day, day)),
		// November 3rd has 25 hours; 01:30 happens twice and is one day.
		decideStep(nov3+h, true, cks(dayNY), wantAllow(2, 24*h)),
		decideStep(nov3+h+30*time.Minute, true, cks(dayNY), wantAllow(1, 23*h+30*time.Minute)),
		decideStep(nov3+2*h+30*time.Minute, true, cks(dayNY), wantAllow(0, 22*h+30*time.Minute)),
		decideStep(nov3+24*h, false, cks(dayNY), wantDeny(0, h, h)),
		decideStep(nov3+25*h, true, cks(dayNY), wantAllow(2, day)),
	}})

	// A Berlin day: 23 hours on March 31st, 25 on October 27th.
	dayB := calCheck("day_berlin", 2, NewCalendar(CalendarDay, z.berlin))
	mar31 := since(z.berlin, 2024, 3, 31, 0, 0)
	oct27 := since(z.berlin, 2024, 10, 27, 0, 0)
	scs = append(scs, confScenario{name: "calendar/day_berlin_dst", steps: []confStep{
		decideStep(mar31+time.Minute, true, cks(withCost(dayB, 2)), wantAllow(0, 23*h-time.Minute)),
		decideStep(mar31+2*h, false, cks(dayB), wantDeny(0, 21*h, 21*h)),
		decideStep(mar31+23*h, true, cks(dayB), wantAllow(1, day)),
		decideStep(oct27, true, cks(dayB), wantAllow(1, 25*h)),
		decideStep(oct27+3*h, true, cks(dayB), wantAllow(0, 22*h)),
		decideStep(oct27+24*h, false, cks(dayB), wantDeny(0, h, h)),
		decideStep(oct27+25*h, true, cks(dayB), wantAllow(1, day)),
	}})

	// ISO weeks: Monday to Monday, 167 hours in New York's DST week.
	weekNY := calCheck("week_ny", 2, NewCalendar(CalendarWeek, z.ny))
	mon4 := since(z.ny, 2024, 3, 4, 0, 0)
	scs = append(scs, confScenario{name: "calendar/week_new_york_dst", steps: []confStep{
		decideStep(mon4, true, cks(withCost(weekNY, 2)), wantAllow(0, 167*h)),
		decideStep(since(z.ny, 2024, 3, 10, 23, 0), false, cks(weekNY), wantDeny(0, h, h)),
		decideStep(since(z.ny, 2024, 3, 11, 0, 0), true, cks(weekNY), wantAllow(1, 7*day)),
		// Sunday 23:00 in New York is Monday in Berlin: still this week
		// in New York.
		decideStep(since(z.ny, 2024, 3, 17, 23, 0), true, cks(weekNY), wantAllow(0, h)),
		decideStep(since(z.ny, 2024, 3, 18, 0, 0), true, cks(weekNY), wantAllow(1, 7*day)),
	}})

	// Months: a leap February, a March of 31 days less the DST hour.
	monB := calCheck("month_berlin", 5, NewCalendar(CalendarMonth, z.berlin))
	feb29 := since(z.berlin, 2024, 2, 29, 23, 59)
	mar1 := since(z.berlin, 2024, 3, 1, 0, 0)
	scs = append(scs, confScenario{name: "calendar/month_berlin", steps: []confStep{
		decideStep(feb29, true, cks(withCost(monB, 5)), wantAllow(0, time.Minute)),
		decideStep(feb29, false, cks(monB), wantDeny(0, time.Minute, time.Minute)),
		decideStep(mar1, true, cks(monB), wantAllow(4, 31*day-h)),
		decideStep(since(z.berlin, 2024, 3, 31, 3, 0), true, cks(withCost(monB, 4)), wantAllow(0, 21*h)),
		decideStep(since(z.berlin, 2024, 3, 31, 3, 0), false, cks(monB), wantDeny(0, 21*h, 21*h)),
		decideStep(since(z.berlin, 2024, 3, 31, 3, 0), false, cks(withCost(monB, 6)), wantDeny(0, 31*day-h, 21*h)),
		peekStep(since(z.berlin, 2024, 4, 1, 0, 0), cks(withCost(monB, 0)), wantAllow(5, 0)),
	}})

	// Two zones and two algorithms in one request, all or nothing: the
	// Berlin day ends six hours before the New York one.
	d := calCheck("d", 2, NewCalendar(CalendarDay, z.ny))
	b := calCheck("b", 1, NewCalendar(CalendarDay, z.berlin))
	tb := tbCheck("t", "tb", 10, 10*time.Second)
	jun1 := time.Date(2024, 6, 1, 5, 0, 0, 0, time.UTC).Sub(baseTime) // 01:00 in New York, 07:00 in Berlin
	scs = append(scs, confScenario{name: "calendar/two_zones", steps: []confStep{
		decideStep(jun1, true, cks(d, b, tb), wantAllow(1, 23*h), wantAllow(0, 17*h), wantAllow(9, time.Second)),
		decideStep(jun1, false, cks(d, b, tb), wantAllow(1, 23*h), wantDeny(0, 17*h, 17*h), wantAllow(9, time.Second)),
		peekStep(jun1, cks(withCost(d, 0)), wantAllow(1, 23*h)),
		decideStep(jun1+17*h, true, cks(b, d), wantAllow(0, day), wantAllow(0, 6*h)),
		decideStep(jun1+17*h, false, cks(tb, d), wantAllow(10, 0), wantDeny(0, 6*h, 6*h)),
		decideStep(jun1+23*h, true, cks(d), wantAllow(1, day)),
	}})

	// Shadow, duplicates, a clock that goes back; a fixed window of 24h
	// and a UTC calendar day are the same bucket (same key, same start).
	dayUTC := calCheck("u", 10, NewCalendar(CalendarDay, time.UTC))
	fw := Check{Algorithm: FixedWindow, Tenant: "t", Policy: "u", Rate: Rate{Limit: 10, Window: day}, Cost: 1}
	may2 := time.Date(2024, 5, 2, 0, 0, 30, 0, time.UTC).Sub(baseTime)
	scs = append(scs, confScenario{name: "calendar/shadow_duplicates_clock_back", steps: []confStep{
		decideStep(may2, true, cks(withCost(dayUTC, 8), asShadow(withCost(dayUTC, 1))), wantAllow(2, day-30*time.Second), wantAllow(1, day-30*time.Second)),
		decideStep(may2, true, cks(asShadow(withCost(dayUTC, 2)), withCost(fw, 1)), wantDeny(1, day-30*time.Second, day-30*time.Second), wantAllow(0, day-30*time.Second)),
		// The clock goes back 40 seconds, into May 1st: the bucket stays
		// in May 2nd.
		decideStep(may2-40*time.Second, false, cks(dayUTC), wantDeny(0, day+10*time.Second, day+10*time.Second)),
		decideStep(may2+day, true, cks(withCost(fw, 9)), wantAllow(1, day-30*time.Second)),
		decideStep(may2+day, true, cks(dayUTC), wantAllow(0, day-30*time.Second)),
	}})

	// A day without midnight: on 2024-09-08 Santiago's clocks jump from
	// 24:00 to 01:00, so the day starts at 01:00 and lasts 23 hours.
	dayS := calCheck("day_santiago", 1, NewCalendar(CalendarDay, z.santiago))
	sep8 := time.Date(2024, 9, 8, 1, 0, 0, 0, z.santiago).Sub(baseTime)
	scs = append(scs, confScenario{name: "calendar/day_without_midnight", steps: []confStep{
		decideStep(sep8-time.Second, true, cks(dayS), wantAllow(0, time.Second)),
		decideStep(sep8, true, cks(dayS), wantAllow(0, 23*h)),
		decideStep(sep8+22*h, false, cks(dayS), wantDeny(0, h, h)),
	}})
	return scs
}

// TestConformanceCalendar plays the calendar scenarios on both stores.
func TestConformanceCalendar(t *testing.T) {
	targets := conformanceTargets(t)
	for _, sc := range calendarScenarios(loadCalendarZones(t)) {
		t.Run(sc.name, func(t *testing.T) {
			for _, target := range targets {
				t.Run(target.name, func(t *testing.T) { runConfScenario(t, target, sc) })
			}
		})
	}
}

// TestConformanceRandomCalendar plays random traffic on calendar buckets
// (days, weeks and months in four zones) mixed with other algorithms, on
// both stores, from March 9th to mid-April 2024 in steps of up to three
// hours: New York, Berlin and Sydney change their clocks meanwhile and
// every period rolls over, many times for days.
func TestConformanceRandomCalendar(t *testing.T) {
	targets := conformanceTargets(t)
	z := loadCalendarZones(t)
	sydney := mustZone(t, "Australia/Sydney")
	start := time.Date(2024, 3, 9, 0, 0, 0, 0, time.UTC).Sub(baseTime)
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			var buckets []Check
			for i, cal := range []*Calendar{
				NewCalendar(CalendarDay, z.ny), NewCalendar(CalendarDay, z.berlin), NewCalendar(CalendarDay, sydney),
				NewCalendar(CalendarWeek, z.ny), NewCalendar(CalendarWeek, sydney),
				NewCalendar(CalendarMonth, z.berlin), NewCalendar(CalendarMonth, time.UTC),
			} {
				for _, tenant := range []string{"t1", "t2"} {
					c := calCheck(fmt.Sprint("cal", i), int64(2+rng.IntN(20)), cal)
					c.Tenant = tenant
					buckets = append(buckets, c)
				}
			}
			buckets = append(buckets,
				tbCheck("t1", "tb", 5, time.Hour),
				Check{Algorithm: FixedWindow, Tenant: "t1", Policy: "fw", Rate: Rate{Limit: 4, Window: 6 * time.Hour}})
			stores := make([]Store, len(targets))
			clocks := make([]*manualClock, len(targets))
			for i, tg := range targets {
				stores[i], clocks[i] = tg.new(t)
			}
			at := start
			for step := 0; step < 800; step++ {
				at += time.Duration(rng.Int64N(int64(3 * time.Hour)))
				at = at.Truncate(time.Millisecond)
				for _, c := range clocks {
					c.Set(baseTime.Add(at))
				}
				n := 1 + rng.IntN(3)
				checks := make([]Check, n)
				for i := range checks {
					checks[i] = buckets[rng.IntN(len(buckets))]
					checks[i].Cost = int64(rng.IntN(4))
					checks[i].Shadow = rng.IntN(6) == 0
				}
				op := rng.IntN(10)
				results := make([][]Result, len(stores))
				admitted := make([]bool, len(stores))
				for i, s := range stores {
					results[i] = make([]Result, n)
					var err error
					if op < 2 {
						err = s.Peek(bgCtx, checks, results[i])
					} else {
						admitted[i], err = s.Decide(bgCtx, checks, results[i])
					}
					if err != nil {
						t.Fatalf("step %d on %s: %v", step, targets[i].name, err)
					}
				}
				for k := 1; k < len(stores); k++ {
					if admitted[0] != admitted[k] {
						t.Fatalf("step %d (at %s): admitted memory %v, %s %v\nmemory %+v\n%s %+v", step, baseTime.Add(at), admitted[0], targets[k].name, admitted[k], results[0], targets[k].name, results[k])
					}
					for j := range checks {
						if !sameResult(true, results[k][j], results[0][j]) {
							t.Fatalf("step %d (at %s) check %d (%s):\nmemory %+v\n%s %+v", step, baseTime.Add(at), j, checks[j].Rate.Calendar, results[0][j], targets[k].name, results[k][j])
						}
					}
				}
			}
		})
	}
}

// TestRedisCalendarKeys: a calendar bucket has fixed_window's key and
// lives until its period ends plus the margin.
func TestRedisCalendarKeys(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	ny := mustZone(t, "America/New_York")
	c := calCheck("p", 5, NewCalendar(CalendarMonth, ny))
	now := time.Now()
	if ok, res := mustDecide(t, s, c); !ok || res[0].Remaining != 4 {
		t.Fatalf("first request: %v %+v", ok, res)
	}
	lt := now.In(ny)
	end := time.Date(lt.Year(), lt.Month()+1, 1, 0, 0, 0, 0, ny)
	keys := allKeys(t, client)
	if len(keys) != 1 || keys[0] != "rl:fixed_window:{t}:p" {
		t.Fatalf("keys %q", keys)
	}
	ttl := client.PTTL(bgCtx, keys[0]).Val()
	want := time.Until(end) + time.Hour
	if ttl > want+time.Second || ttl < want-5*time.Second {
		t.Fatalf("PTTL %s, want about %s (until %s plus an hour)", ttl, want, end)
	}
}

// decideSkewed runs the decide script as RedisStore.Decide does, with
// redisNow in place of Redis TIME and the calendar boundaries computed
// around gatewayNow: an instance whose clock is off Redis's.
func decideSkewed(s *RedisStore, checks []Check, redisNow, gatewayNow time.Time) (bool, []Result, error) {
	sc := s.pool.Get().(*redisScratch)
	defer s.pool.Put(sc)
	s.prepare(sc, checks)
	sc.args = append(sc.args[:0], scriptDecide.mode, fmt.Sprint(redisNow.UnixMicro()))
	keys := sc.appendCheckArgs(checks, sc.all)
	sc.appendCalendarArgs(checks, sc.all, gatewayNow.UnixNano())
	reply, err := s.eval(bgCtx, sc, scriptDecide, keys, sc.args)
	if err != nil {
		return false, nil, err
	}
	res := make([]Result, len(checks))
	ok, _, err := parseReply(reply, sc.all, res, nil)
	return ok, res, err
}

// TestRedisCalendarClockSkew: instances whose clocks are off Redis's
// decide by Redis's clock, on either side of a boundary, as the memory
// store does at Redis's time; an instance off by more than a period gets
// an error (its fail mode decides) instead of a wrong period.
func TestRedisCalendarClockSkew(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	ny := mustZone(t, "America/New_York")
	boundary := time.Date(2024, 11, 4, 0, 0, 0, 0, ny) // after a 25-hour day
	for i, tc := range []struct {
		redis, gateway time.Duration // from the boundary
	}{
		{-time.Second, time.Second},          // the gateway crossed first
		{time.Second, -time.Second},          // Redis crossed first
		{-time.Second, 11 * time.Hour},       // far ahead, same answer
		{10 * time.Hour, -12 * time.Hour},    // far behind
		{-23 * time.Hour, 23 * time.Hour},    // a day apart: adjacent periods still
		{30 * time.Minute, 30 * time.Minute}, // no skew
	} {
		s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout, Prefix: fmt.Sprint("skew", i)})
		m, clk := newTestStore(t, MemoryOptions{})
		clk.Set(boundary.Add(tc.redis))
		c := calCheck("p", 3, NewCalendar(CalendarDay, ny))
		for step := 0; step < 4; step++ {
			ok, got, err := decideSkewed(s, []Check{c}, boundary.Add(tc.redis), boundary.Add(tc.gateway))
			if err != nil {
				t.Fatalf("redis %s, gateway %s: %v", tc.redis, tc.gateway, err)
			}
			wantOK, want := mustDecide(t, m, c)
			if ok != wantOK || !sameResult(true, got[0], want[0]) {
				t.Fatalf("redis %s, gateway %s, request %d: %v %+v, want %v %+v", tc.redis, tc.gateway, step, ok, got[0], wantOK, want[0])
			}
		}
	}
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout, Prefix: "skewed-too-far"})
	c := calCheck("p", 3, NewCalendar(CalendarDay, ny))
	_, _, err := decideSkewed(s, []Check{c}, boundary.Add(49*time.Hour), boundary)
	if err == nil || !strings.Contains(err.Error(), "do not hold the instant") {
		t.Fatalf("Redis two days ahead: %v", err)
	}
	if errors.Is(err, ErrInvalidCheck) {
		t.Fatal("a clock off by more than a period is a store failure, not an invalid check")
	}
}

// TestLeaseCalendarExpiry: a calendar lease ends with its period, and a
// give-back after the period ended is not refunded into the next one.
func TestLeaseCalendarExpiry(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := NewRedisStore(RedisOptions{Client: srv.Client(t), Timeout: testTimeout})
	ny := mustZone(t, "America/New_York")
	cal := NewCalendar(CalendarDay, ny)
	at := time.Date(2024, 11, 3, 23, 50, 0, 0, ny) // 10 minutes before the end of a 25-hour day
	s.now = func() int64 { return at.UnixMicro() }
	c := calCheck("p", 100, cal)
	c.Lease = Lease{Max: 10}
	res := make([]Result, 1)
	g, err := s.Lease(bgCtx, &LeaseRequest{Checks: []Check{c}, Want: 10, TTL: time.Hour}, res)
	if err != nil {
		t.Fatal(err)
	}
	if g.Requests != 10 || g.Expires != 10*time.Minute || res[0].Remaining != 90 || res[0].Reset != 10*time.Minute {
		t.Fatalf("granted %d expiring in %v, %+v; want 10 in 10m, 90 left", g.Requests, g.Expires, res[0])
	}
	// Giving 4 back within the day refunds them.
	g2, err := s.Lease(bgCtx, &LeaseRequest{Checks: []Check{c}, Want: 0, GiveBack: 4, GiveBackAt: g.At}, res)
	if err != nil || res[0].Remaining != 94 {
		t.Fatalf("give back: %+v %+v %v", g2, res[0], err)
	}
	// After midnight the old day's units are gone with it.
	at = at.Add(15 * time.Minute)
	if _, err := s.Lease(bgCtx, &LeaseRequest{Checks: []Check{c}, Want: 0, GiveBack: 6, GiveBackAt: g.At}, res); err != nil || res[0].Remaining != 100 || res[0].Reset != 0 {
		t.Fatalf("give back into the next day: %+v %v", res[0], err)
	}
	g, err = s.Lease(bgCtx, &LeaseRequest{Checks: []Check{c}, Want: 5, TTL: time.Hour}, res)
	if err != nil || g.Requests != 5 || g.Expires != time.Hour || res[0].Remaining != 95 || res[0].Reset != 24*time.Hour-5*time.Minute {
		t.Fatalf("next day: %+v %+v %v", g, res[0], err)
	}
}

// TestRedisCalendarCluster: a request whose calendar checks span two
// cluster slots, in two zones, is decided slot by slot; when the second
// slot denies, the first slot's charge is given back (the give-back's
// call gets the boundaries too) and both stores agree throughout.
func TestRedisCalendarCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	clk := newManualClock(baseTime)
	s := NewRedisStore(RedisOptions{Client: cl.Client(t), Timeout: testTimeout})
	s.now = func() int64 { return clk.Now().UnixMicro() }
	m, mclk := newTestStore(t, MemoryOptions{})
	z := loadCalendarZones(t)
	a := calCheck("month", 5, NewCalendar(CalendarMonth, z.ny))
	a.Tenant = "cal-a"
	b := calCheck("day", 2, NewCalendar(CalendarDay, z.berlin))
	b.Tenant = "cal-b"
	if keySlot([]byte("{cal-a}")) == keySlot([]byte("{cal-b}")) {
		t.Fatal("pick tenants in different slots")
	}
	at := time.Date(2024, 3, 31, 23, 30, 0, 0, z.berlin) // 30 minutes before a Berlin midnight
	for i, step := range []struct {
		at     time.Time
		checks []Check
	}{
		{at, cks(a, b)},
		{at, cks(a, b)},
		{at, cks(a, b)}, // b denies: a's charge is refunded
		{at, cks(withCost(a, 0))},
		{at.Add(30 * time.Minute), cks(a, b)}, // a new Berlin day
		{at.Add(30 * time.Minute), cks(withCost(a, 0), withCost(b, 0))},
	} {
		clk.Set(step.at)
		mclk.Set(step.at)
		gotOK, got := mustDecide(t, s, step.checks...)
		wantOK, want := mustDecide(t, m, step.checks...)
		if gotOK != wantOK {
			t.Fatalf("step %d: admitted %v, memory %v", i, gotOK, wantOK)
		}
		for j := range got {
			if !sameResult(true, got[j], want[j]) {
				t.Fatalf("step %d check %d: redis %+v, memory %+v", i, j, got[j], want[j])
			}
		}
	}
	if res := mustPeek(t, s, withCost(a, 0)); res[0].Remaining != 2 {
		t.Fatalf("a after a refund and three charges: %+v, want 2 left", res[0])
	}
}

// TestRedisCalendarPeriodsAfterAGap: a calendar policy decided in January
// and again in April finds April's period. The function library keeps the
// rate tables it builds between calls (RATES in lua/common.lua), but never
// a calendar check's, which carries its call's period bounds: kept, the
// January bounds would not hold April (the call then fails).
func TestRedisCalendarPeriodsAfterAGap(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := NewRedisStore(RedisOptions{Client: srv.Client(t), Timeout: testTimeout, Functions: true})
	ny := mustZone(t, "America/New_York")
	c := []Check{calCheck("p", 5, NewCalendar(CalendarMonth, ny))}
	for _, at := range []time.Time{
		time.Date(2025, 1, 15, 12, 0, 0, 0, ny),
		time.Date(2025, 4, 15, 12, 0, 0, 0, ny),
	} {
		ok, res, err := decideSkewed(s, c, at, at)
		if err != nil || !ok || res[0].Remaining != 4 {
			t.Fatalf("%s: admitted %v, %+v, err %v; want the month's first request, 4 left", at.Format("January"), ok, res, err)
		}
	}
}
