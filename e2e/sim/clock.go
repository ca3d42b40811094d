package sim

import (
	"context"
	"time"
)

// clock maps model time onto wall time. Model time runs scale times faster
// than wall time: a modelled duration d takes d/scale of wall time. Model
// time is measured from the clock's start.
type clock interface {
	// Now is the current model time.
	Now() time.Duration
	// WallUntil is the wall time left until model time t (<= 0 if past).
	WallUntil(t time.Duration) time.Duration
	// Wall converts a model duration into wall time.
	Wall(d time.Duration) time.Duration
	// Model converts a wall duration into model time.
	Model(d time.Duration) time.Duration
}

// scaledClock is the real clock, sped up by scale.
type scaledClock struct {
	start time.Time
	scale float64
}

// newScaledClock returns a clock starting now; scale <= 0 means 1.
func newScaledClock(scale float64) *scaledClock {
	if scale <= 0 {
		scale = 1
	}
	return &scaledClock{start: time.Now(), scale: scale}
}

// Now implements clock.
func (c *scaledClock) Now() time.Duration { return c.Model(time.Since(c.start)) }

// WallUntil implements clock.
func (c *scaledClock) WallUntil(t time.Duration) time.Duration {
	return time.Until(c.start.Add(c.Wall(t)))
}

// Wall implements clock.
func (c *scaledClock) Wall(d time.Duration) time.Duration {
	if c.scale == 1 {
		return d
	}
	return time.Duration(float64(d) / c.scale)
}

// Model implements clock.
func (c *scaledClock) Model(d time.Duration) time.Duration {
	if c.scale == 1 {
		return d
	}
	return time.Duration(float64(d) * c.scale)
}

// sleepModel sleeps for the model duration d (d/scale of wall time) or
// until ctx is done.
func sleepModel(ctx context.Context, c clock, d time.Duration) error {
	return sleepCtx(ctx, c.Wall(d))
}
