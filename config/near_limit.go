package config

import "strconv"

// defaultNearLimit is near_limit when neither the policy nor the handler
// sets it: near once less than 20% of the limit is left.
const defaultNearLimit = 0.8

// nearLimit reads `near_limit <fraction>`. 0 is refused here, where it
// can be told apart from "not set".
func (p cfParser) nearLimit() (float64, error) {
	s, err := p.word()
	if err != nil {
		return 0, err
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f > 0 && f <= 1) {
		return 0, p.dirErr("%q: want a fraction above 0 and at most 1 (0.8: near once less than 20%% of the limit is left; 1: never)", s)
	}
	return f, nil
}

// NearFraction is the near_limit of the policy pc: its own, else the
// handler's, else defaultNearLimit.
func (h *Handler) NearFraction(pc *PolicyConfig) float64 {
	switch {
	case pc.NearLimit > 0:
		return pc.NearLimit
	case h.NearLimit > 0:
		return h.NearLimit
	}
	return defaultNearLimit
}
