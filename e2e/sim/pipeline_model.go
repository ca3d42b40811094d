package sim

import (
	"context"
	"strings"
)

// runItemModel serves one item on the engine model (a profile is set):
// the item becomes an engine request on its rank and its tokens are
// streamed as the engine's steps make them.
func (s *Server) runItemModel(ctx context.Context, req *inferRequest, p *itemPlan, it *inflightItem, res itemResult, em emitter) (itemResult, error) {
	spec := requestSpec{rank: p.rank, prompt: p.in.promptTokens, blocks: p.in.blocks, maxNew: p.in.maxTokens}
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
	return s.follow(ctx, q, res, em)
}

// runPrefillModel is the prefill leg: the conflict check, then the
// engine's prefill (queueing, chunks, prefix cache) and KV transfer; the
// room is done when the transfer ends, and the leg answers with its one
// token.
func (s *Server) runPrefillModel(ctx context.Context, req *inferRequest, p *itemPlan, res itemResult, em emitter, spec requestSpec) (itemResult, error) {
	room := *p.room
	if msg := s.prefillConflict(req, p); msg != "" {
		s.rooms.set(room, p.rank, RoomFailed, msg)
		return res, internalErrorf("%s", msg)
	}
	s.rooms.set(room, p.rank, RoomPending, "")
	q, err := s.eng.submit(spec)
	if err != nil {
		s.rooms.set(room, p.rank, RoomFailed, err.Error())
		return res, err
	}
	defer s.eng.abort(q)
	pr, err := s.waitState(ctx, q, stDone)
	if err == nil {
		err = s.stall(ctx)
	}
	if err != nil {
		s.rooms.set(room, p.rank, RoomFailed, prefillFailure(ctx, err))
		return res, err
	}
	res.cachedTokens = pr.cached
	s.rooms.set(room, p.rank, RoomDone, "")
	if err := s.awaitTransfer(ctx, room); err != nil {
		s.rooms.set(room, p.rank, RoomFailed, prefillFailure(ctx, err))
		return res, err
	}
	return s.generate(ctx, nil, res, 1, false, em)
}

// runDecodeModel is the decode leg: KV preallocation (queued while the
// rank's KV is short), the wait for the prefill's KV, then decoding in
// the engine.
func (s *Server) runDecodeModel(ctx context.Context, p *itemPlan, it *inflightItem, res itemResult, em emitter, spec requestSpec) (itemResult, error) {
	q, err := s.eng.submit(spec)
	if err != nil {
		return res, err
	}
	defer s.eng.abort(q)
	if _, err := s.waitState(ctx, q, stTransfer); err != nil {
		return res, err
	}
	if !p.fakeKV {
		if err := s.kv.waitKV(ctx, s.kvWait(p)); err != nil {
			return res, err
		}
	}
	it.setStage(stageRunning)
	s.eng.kvArrived(q)
	return s.follow(ctx, q, res, em)
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
func (s *Server) follow(ctx context.Context, q *engineRequest, res itemResult, em emitter) (itemResult, error) {
	var text strings.Builder
	for {
		if err := s.stall(ctx); err != nil {
			return res, err
		}
		pr := s.eng.progress(q)
		res.cachedTokens = pr.cached
		for res.completionTokens < pr.generated {
			delta := tokenText(res.completionTokens)
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
