package sim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// errStreamClosed stops an item whose stream was closed or broken.
var errStreamClosed = errors.New("stream closed")

// itemPlan is how one item will be served.
type itemPlan struct {
	index  int
	in     itemInput
	room   *int64
	host   *string
	port   *int
	rank   int
	source rankSource
	// Decode only.
	bootAddr    string // prefill bootstrap server host:port
	prefillRank *int   // rank expected to hold the KV; nil accepts any
	fakeKV      bool   // FAKE_BOOTSTRAP_HOST: no transfer (health checks)
}

// fakeBootstrap reports whether the item carries SGLang's fake bootstrap
// host (health checks): a prefill then neither waits for a decode's
// bootstrap nor for a decode to take its KV (SGLang's fake sender).
func (p *itemPlan) fakeBootstrap() bool {
	return p.host != nil && *p.host == fakeBootstrapHost
}

// emitter receives streaming progress; nil for non-streaming requests.
type emitter interface {
	// token reports a generated token; false stops the item.
	token(res itemResult, delta string, total int) bool
	// finish reports that the item finished generating.
	finish(res itemResult)
}

// runItem serves one item according to the server mode. ctx is the
// item's own context: an /abort_request cancels it with an abortCause,
// which ends the item as SGLang does for its stage: a graceful abort
// returns the partial output with finish_reason abort (streamed as the
// item's last chunk); the others fail with a 500 (and a prefill's room
// fails, so its decode fails too).
func (s *Server) runItem(ctx context.Context, req *inferRequest, p *itemPlan, it *inflightItem, em emitter) (itemResult, error) {
	res := itemResult{index: p.index, rid: it.rid, promptTokens: p.in.promptTokens, seed: p.in.seed}
	res, err := s.runItemStages(ctx, req, p, it, res, em)
	if err == nil || ctx.Err() == nil {
		return res, err
	}
	ab := abortOf(ctx)
	if s.cfg.Mode == ModePrefill && p.room != nil {
		msg := fmt.Sprintf("prefill aborted: %v", err)
		if ab != nil {
			msg = abortReqMsg
		}
		if st := s.rooms.status(*p.room); st.State != RoomFailed {
			s.rooms.set(*p.room, p.rank, RoomFailed, msg)
		}
	}
	switch {
	case ab == nil:
		return res, err
	case ab.graceful:
		res.finish, res.finishMsg = finishAbort, ab.msg
		if em != nil {
			em.finish(res)
		}
		return res, nil
	}
	return res, s.abortFailure(p)
}

// abortFailure is the error of an item failed by /abort_request: the PD
// queue's transfer failure, whose exception is SGLang's "Aborted by
// AbortReq.".
func (s *Server) abortFailure(p *itemPlan) *apiError {
	room := int64(-1)
	if p.room != nil {
		room = *p.room
	}
	switch s.cfg.Mode {
	case ModePrefill:
		return internalErrorf("Prefill bootstrap failed for request rank=%d bootstrap_room=%d with exception %s", p.rank, room, abortReqMsg)
	case ModeDecode:
		return internalErrorf("Decode transfer failed for request rank=%d bootstrap_room=%d with exception %s", p.rank, room, abortReqMsg)
	}
	return internalErrorf("%s", abortReqMsg)
}

// runItemStages runs the item's stages on whichever model runs; a hung
// engine holds the item before it starts.
func (s *Server) runItemStages(ctx context.Context, req *inferRequest, p *itemPlan, it *inflightItem, res itemResult, em emitter) (itemResult, error) {
	if err := s.stall(ctx); err != nil {
		return res, err
	}
	if s.eng != nil {
		return s.runItemModel(ctx, req, p, it, res, em)
	}
	switch s.cfg.Mode {
	case ModePrefill:
		it.setStage(stagePrefill)
		return s.runPrefill(ctx, req, p, res, em)
	case ModeDecode:
		it.setStage(stageWaitKV)
		return s.runDecode(ctx, p, it, res, em)
	default:
		it.setStage(stageRunning)
		h := s.load.admit(p.rank, p.in.promptTokens, phaseRunning)
		defer h.release()
		if err := sleepModel(ctx, s.clk, s.prefillTime(p.in.promptTokens)); err != nil {
			return res, err
		}
		return s.generate(ctx, h, res, p.in.maxTokens, true, em)
	}
}

// runPrefill runs the prefill leg: the follow_bootstrap_room conflict
// check, with AwaitTransfer the bootstrap queue (until the decode sent
// its transfer metadata), then the forward pass that makes the room's KV
// available on this item's rank, then one generated token.
func (s *Server) runPrefill(ctx context.Context, req *inferRequest, p *itemPlan, res itemResult, em emitter) (itemResult, error) {
	room := *p.room
	if msg := s.prefillConflict(req, p); msg != "" {
		s.rooms.set(room, p.rank, RoomFailed, msg)
		return res, internalErrorf("%s", msg)
	}
	s.rooms.set(room, p.rank, RoomPending, "")
	if s.cfg.AwaitTransfer && !p.fakeBootstrap() {
		booted := make(chan struct{})
		var once sync.Once
		unregister := s.prefixes.register(room, func(int) { once.Do(func() { close(booted) }) })
		err := s.awaitBootstrap(ctx, p, func() bool {
			select {
			case <-booted:
				return true
			default:
				return false
			}
		}, booted)
		unregister()
		if err != nil {
			return res, err
		}
	}
	h := s.load.admit(p.rank, p.in.promptTokens, phaseRunning)
	defer h.release()
	err := sleepModel(ctx, s.clk, s.prefillTime(p.in.promptTokens))
	if err == nil {
		err = s.stall(ctx)
	}
	if err != nil {
		s.rooms.set(room, p.rank, RoomFailed, prefillFailure(ctx, err))
		return res, err
	}
	s.rooms.set(room, p.rank, RoomDone, "")
	if err := s.awaitTransfer(ctx, p); err != nil {
		s.rooms.set(room, p.rank, RoomFailed, prefillFailure(ctx, err))
		return res, err
	}
	return s.generate(ctx, h, res, 1, false, em)
}

// awaitBootstrap holds prefill item p in the bootstrap queue until done
// reports that its decode preallocated the KV and sent the transfer
// metadata (done is checked whenever changed is signalled or closed). A
// decode that never does fails the item after Config.BootstrapTimeout
// (model time) with SGLang's bootstrap failure, "Prefill bootstrap failed
// ... with exception KVTransferError(...): Request R timed out after Ns in
// KVPoll.Bootstrapping", and fails the room. An abort or a disconnect
// ends the wait with ctx's error, the room failed as an aborted prefill's.
// Either way the item counts in sglang:num_bootstrap_failed_reqs_total.
func (s *Server) awaitBootstrap(ctx context.Context, p *itemPlan, done func() bool, changed <-chan struct{}) error {
	if done() {
		return nil
	}
	room := *p.room
	start := time.Now()
	timer := time.NewTimer(s.clk.Wall(s.cfg.BootstrapTimeout))
	defer timer.Stop()
	for !done() {
		select {
		case <-ctx.Done():
			s.bootstrapFailed[p.rank].Add(1)
			s.rooms.set(room, p.rank, RoomFailed, prefillFailure(ctx, ctx.Err()))
			return ctx.Err()
		case <-timer.C:
			if done() {
				return nil
			}
			s.bootstrapFailed[p.rank].Add(1)
			exc := fmt.Sprintf("KVTransferError(bootstrap_room=%d): Request %d timed out after %.1fs in KVPoll.Bootstrapping",
				room, room, s.clk.Model(time.Since(start)).Seconds())
			s.rooms.set(room, p.rank, RoomFailed, exc)
			return internalErrorf("Prefill bootstrap failed for request rank=%d bootstrap_room=%d with exception %s", p.rank, room, exc)
		case <-changed:
		}
	}
	return nil
}

// awaitTransfer holds finished prefill item p until a decode took its KV
// (with Config.AwaitTransfer, and unless p carries the fake bootstrap
// host; otherwise it returns at once). A decode that never takes it fails
// the item after KVTimeout; an abort or a disconnect ends the wait with
// ctx's error.
func (s *Server) awaitTransfer(ctx context.Context, p *itemPlan) error {
	if !s.cfg.AwaitTransfer || p.fakeBootstrap() {
		return nil
	}
	room := *p.room
	start := time.Now()
	if s.rooms.waitDelivered(ctx, room, s.clk.Wall(s.cfg.KVTimeout)) {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return internalErrorf("Request %d timed out after %.1fs in KVPoll.Transferring: no decode took the KV",
		room, s.clk.Model(time.Since(start)).Seconds())
}

// prefillFailure is the room error of a prefill item that stopped with err.
func prefillFailure(ctx context.Context, err error) string {
	if abortOf(ctx) != nil {
		return abortReqMsg
	}
	return fmt.Sprintf("prefill aborted: %v", err)
}

// prefillConflict returns SGLang's follow_bootstrap_room conflict message
// when a pinned rank disagrees with the room and the request carries no
// disagg_prefill_dp_rank; "" otherwise.
func (s *Server) prefillConflict(req *inferRequest, p *itemPlan) string {
	if s.cfg.DPSize <= 1 || p.source == sourceRoom || req.disaggPrefillRank != nil || s.cfg.ForceQueryPrefillDPRank {
		return ""
	}
	implied := pyMod(*p.room, s.cfg.DPSize)
	if p.rank == implied {
		return ""
	}
	return fmt.Sprintf("follow_bootstrap_room conflict: dispatched to dp_rank %d but bootstrap_room %d implies dp_rank %d. "+
		"Set SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to allow mixed routing.", p.rank, *p.room, implied)
}

// runDecode runs the decode leg: KV preallocated in the transfer queue
// (the prefill told so), wait for the prefill's KV on the expected rank,
// then generate.
func (s *Server) runDecode(ctx context.Context, p *itemPlan, it *inflightItem, res itemResult, em emitter) (itemResult, error) {
	h := s.load.admit(p.rank, p.in.promptTokens, phaseTransfer)
	defer h.release()
	if !p.fakeKV {
		s.sendBootstrap(ctx, p, 0)
		_, err := s.kv.waitKV(ctx, s.kvWait(p))
		if err != nil {
			return res, err
		}
	}
	it.setStage(stageRunning)
	h.run()
	return s.generate(ctx, h, res, p.in.maxTokens, true, em)
}

// kvWait describes the KV wait of decode item p.
func (s *Server) kvWait(p *itemPlan) kvWait {
	return kvWait{
		addr:        p.bootAddr,
		room:        *p.room,
		prefillRank: p.prefillRank,
		decodeRank:  p.rank,
		timeout:     s.clk.Wall(s.cfg.KVTimeout),
		toModel:     s.clk.Model,
	}
}

// generate produces n deterministic tokens, sleeping DecodePerToken (model
// time) before each one when pace is set. h may be nil.
func (s *Server) generate(ctx context.Context, h *loadHandle, res itemResult, n int, pace bool, em emitter) (itemResult, error) {
	var text strings.Builder
	for i := 0; i < n; i++ {
		if err := s.stall(ctx); err != nil {
			return res, err
		}
		if pace {
			if err := sleepModel(ctx, s.clk, s.cfg.DecodePerToken); err != nil {
				return res, err
			}
		} else if err := ctx.Err(); err != nil {
			return res, err
		}
		if h != nil {
			h.addToken()
		}
		delta := genTokenText(res.seed, i)
		text.WriteString(delta)
		res.text = text.String()
		res.completionTokens++
		if em != nil && !em.token(res, delta, n) {
			return res, errStreamClosed
		}
	}
	if em != nil {
		em.finish(res)
	}
	return res, nil
}

// prefillTime is the simulated forward time for a prompt.
func (s *Server) prefillTime(promptTokens int) time.Duration {
	return time.Duration(float64(s.cfg.PrefillPer1KTokens) * float64(promptTokens) / 1000)
}
