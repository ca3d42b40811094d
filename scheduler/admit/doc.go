// Package admit decides when a request is picked, never where.
//
// While a pool's engines are saturated, requests wait here instead of in
// the engines' own queues: strictly by priority class, and between the
// tenants of one class in weighted fair order of their tokens (start-time
// fair queuing), so that one tenant's long prompts cannot starve another's
// short ones. A request is let through when its pool has room again (late
// binding: the pick then sees fresh loads), and refused early, with a
// reason a client can act on, when it cannot start within its class's wait
// limit or the queue is full; a full queue sheds a lower class before it
// refuses a higher one.
//
// Queue is the bookkeeping alone, driven by its caller's clock (the
// simulator drives it in virtual time); Admitter wraps it for concurrent
// callers that block until they are let through; Rules classify a request
// into a class and a tenant.
package admit
