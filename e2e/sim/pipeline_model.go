package sim

import (
	"context"
	"strings"

	"go.uber.org/zap"
)

// runItemModel serves one item on the engine model (a profile is set):
// the item becomes an engine request on its rank and its tokens are
// streamed as the engine's steps make them.
func (s *Server) runItemModel(ctx context.Context, req *inferRequest, p *itemPlan, it *inflightItem, res itemResult, em emitter) (itemResult, error) {
	spec := requestSpec{rank: p.rank, prompt: p.in.promptTokens, blocks: p.in.blocks, ids: p.in.ids, maxNew: p.in.maxTokens,
		tail: p.in.tail, seed: p.in.seed, priority: newPriorityOrder(s.cfg).effective(req.priority)}
	switch s.cfg.Mode {
	case ModePrefill:
		spec.kind = kindPrefill
		it.setStage(stagePrefill)
		return s.runPrefillModel(ctx, req, p, res, em, spec)
	case ModeDecode:
		spec.kind = kindDecode
		it.setStage(stageWaitKV)
		return s.runDecodeModel(ctx, p, it, res, em, spec)
	}
	spec.kind = kindUnified
	it.setStage(stageRunning)
	q, err := s.eng.submit(spec)
	if err != nil {
		return res, err
	}
	defer s.eng.abort(q)
	return s.follow(ctx, q, res, em, 0)
}

// runPrefillModel is the prefill leg: the conflict check, then the
// bootstrap queue (until the decode preallocated the KV and sent its
// transfer metadata, with decode_prefix_len), then the engine's prefill
// (queueing, chunks, prefix cache) and KV transfer; the room is done when
// the transfer ends, and the leg answers with its one token. A health
// check's fake bootstrap host skips the bootstrap queue, as SGLang's fake
// sender does.
func (s *Server) runPrefillModel(ctx context.Context, req *inferRequest, p *itemPlan, res itemResult, em emitter, spec requestSpec) (itemResult, error) {
	room := *p.room
	if msg := s.prefillConflict(req, p); msg != "" {
		s.rooms.set(room, p.rank, RoomFailed, msg)
		return res, internalErrorf("%s", msg)
	}
	s.rooms.set(room, p.rank, RoomPending, "")
	spec.bootstrap = !p.fakeBootstrap()
	q, err := s.eng.submit(spec)
	if err != nil {
		s.rooms.set(room, p.rank, RoomFailed, err.Error())
		return res, err
	}
	defer s.eng.abort(q)
	defer s.prefixes.register(room, func(n int) { s.eng.bootstrapped(q, n) })()
	if err := s.awaitBootstrap(ctx, p, func() bool { return s.eng.progress(q).state != stBootstrap }, q.notify); err != nil {
		return res, err
	}
	pr, err := s.waitState(ctx, q, stDone)
	if err == nil {
		err = s.stall(ctx)
	}
	if err != nil {
		s.rooms.set(room, p.rank, RoomFailed, prefillFailure(ctx, err))
		return res, err
	}
	res.cachedTokens = pr.cached
	if pr.prefixSet {
		res.gotPrefix, res.transferred = true, pr.sent
		if pr.decodePrefix > 0 {
			s.log.Info("prefill sent the KV beyond the decode's cached prefix",
				zap.Int64("room", room), zap.Int("prompt_tokens", p.in.promptTokens),
				zap.Int("decode_prefix_len", pr.decodePrefix), zap.Int("tokens_sent", pr.sent))
		}
	}
	s.rooms.setDone(room, p.rank, pr.cached)
	if err := s.awaitTransfer(ctx, p); err != nil {
		s.rooms.set(room, p.rank, RoomFailed, prefillFailure(ctx, err))
		return res, err
	}
	return s.generate(ctx, nil, res, 1, false, em)
}

// runDecodeModel is the decode leg: KV preallocation (queued while the
// rank's KV is short; with the decode radix cache the cached prefix is
// matched), the transfer metadata sent to the prefill (which may then
// start the request), the wait for the prefill's KV, then decoding in the
// engine.
func (s *Server) runDecodeModel(ctx context.Context, p *itemPlan, it *inflightItem, res itemResult, em emitter, spec requestSpec) (itemResult, error) {
	q, err := s.eng.submit(spec)
	if err != nil {
		return res, err
	}
	defer s.eng.abort(q)
	pr, err := s.waitState(ctx, q, stTransfer)
	if err != nil {
		return res, err
	}
	if s.cfg.DecodeRadixCache {
		res.radix, res.decodePrefix, res.hostHit = true, pr.decodePrefix, pr.hostHit
	}
	if !p.fakeKV {
		// pr.decodePrefix is 0 without the decode radix cache.
		s.sendBootstrap(ctx, p, pr.decodePrefix)
	}
	prefillCached := 0
	if !p.fakeKV {
		st, err := s.kv.waitKV(ctx, s.kvWait(p))
		if err != nil {
			return res, err
		}
		prefillCached = st.CachedTokens
	}
	it.setStage(stageRunning)
	s.eng.kvArrived(q)
	return s.follow(ctx, q, res, em, prefillCached)
}

// sendBootstrap tells the prefill of decode item p that its KV is
// preallocated, and how many prompt tokens this decode holds already
// (decode_prefix_len, 0 without the decode radix cache): SGLang's transfer
// metadata, which moves the prefill's request from its bootstrap queue to
// its waiting queue, and makes it send only the KV beyond the prefix. A
// failed message is logged; the prefill then fails after its bootstrap
// timeout, and this item after its KV wait.
func (s *Server) sendBootstrap(ctx context.Context, p *itemPlan, tokens int) {
	if err := s.kv.postPrefix(ctx, p.bootAddr, *p.room, tokens); err != nil && ctx.Err() == nil {
		s.log.Warn("could not send the transfer metadata (decode_prefix_len) to the prefill; it will not start the request",
			zap.Int64("room", *p.room), zap.String("bootstrap", p.bootAddr), zap.Error(err))
	}
}

// reportedCached is the cached_tokens an item reports: the engine's hit,
// except on a decode with the decode radix cache, which reports the larger
// of the prefill's hit and its own match (SGLang after PR #25973), or
// their sum with DoubleCountCachedTokens (SGLang issue #25972).
func reportedCached(cfg Config, pr progress, prefillCached int) int {
	if cfg.Mode != ModeDecode || !cfg.DecodeRadixCache {
		return pr.cached
	}
	if cfg.DoubleCountCachedTokens {
		return prefillCached + pr.decodePrefix
	}
	return max(prefillCached, pr.decodePrefix)
}

// waitState waits until q reaches state at least (in the order of the
// reqState constants; stDone ends every wait).
func (s *Server) waitState(ctx context.Context, q *engineRequest, at reqState) (progress, error) {
	for {
		pr := s.eng.progress(q)
		if pr.state >= at {
			return pr, nil
		}
		select {
		case <-ctx.Done():
			return pr, ctx.Err()
		case <-q.notify:
		}
	}
}

// follow emits q's tokens as the engine generates them, until q is done.
// prefillCached is, on a decode, the prefill's cache hit.
func (s *Server) follow(ctx context.Context, q *engineRequest, res itemResult, em emitter, prefillCached int) (itemResult, error) {
	var text strings.Builder
	for {
		if err := s.stall(ctx); err != nil {
			return res, err
		}
		pr := s.eng.progress(q)
		res.cachedTokens = reportedCached(s.cfg, pr, prefillCached)
		for res.completionTokens < pr.generated {
			delta := genTokenText(res.seed, res.completionTokens)
			text.WriteString(delta)
			res.text = text.String()
			res.completionTokens++
			if em != nil && !em.token(res, delta, pr.maxNew) {
				return res, errStreamClosed
			}
		}
		if pr.state == stDone {
			if pr.aborted {
				return res, context.Canceled
			}
			if em != nil {
				em.finish(res)
			}
			return res, nil
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-q.notify:
		}
	}
}
