package legs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// AbortPath is SGLang's abort endpoint.
const AbortPath = "/abort_request"

// defaultAbortTimeout bounds one abort call.
const defaultAbortTimeout = 2 * time.Second

// HTTPAborter aborts requests through SGLang's POST /abort_request, one call
// per rid: {"rid": "<rid>"}. SGLang answers 200 whether or not it still
// knew the request, so an abort that races the request's end is harmless.
type HTTPAborter struct {
	// Client makes the calls; nil means http.DefaultClient.
	Client *http.Client
	// Timeout bounds each call; 0 means 2s.
	Timeout time.Duration
}

// Abort asks the engine at engineURL to abort the requests with these rids.
// It tries every rid and returns the errors joined.
func (a *HTTPAborter) Abort(ctx context.Context, engineURL string, rids []string) error {
	var errs []error
	for _, rid := range rids {
		if err := a.abortOne(ctx, engineURL, rid); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("abort on %s: %w", engineURL, errors.Join(errs...))
	}
	return nil
}

func (a *HTTPAborter) abortOne(ctx context.Context, engineURL, rid string) error {
	timeout := a.Timeout
	if timeout <= 0 {
		timeout = defaultAbortTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	body, err := json.Marshal(map[string]string{"rid": rid})
	if err != nil {
		return fmt.Errorf("encode abort of %s: %w", rid, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, engineURL+AbortPath, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("abort %s: %w", rid, err)
	}
	req.Header.Set("Content-Type", "application/json")
	client := a.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("abort %s: %w", rid, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("abort %s: %s: %s", rid, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
