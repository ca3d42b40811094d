package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode"
)

// maxBodyBytes bounds the response body read from an engine.
const maxBodyBytes = 8 << 20

// maxSnippetBytes bounds how much of an error response is quoted in errors.
const maxSnippetBytes = 200

// response is the outcome of one GET that reached the engine.
type response struct {
	status    int
	body      []byte // up to maxBodyBytes; only a snippet for non-2xx answers
	startedAt time.Time
}

// ok reports whether the engine answered 2xx.
func (r response) ok() bool { return r.status >= 200 && r.status <= 299 }

// statusError describes a non-2xx answer from an engine.
type statusError struct {
	url     string
	status  int
	snippet string
}

// Error implements error.
func (e *statusError) Error() string {
	msg := fmt.Sprintf("GET %s: HTTP %d", e.url, e.status)
	if e.snippet != "" {
		msg += ": " + e.snippet
	}
	return msg
}

// get sends GET u with the given Accept header. An error means no answer
// was obtained (transport failure, cancelled context, oversize or unreadable
// body); any HTTP status is returned as a response. Failures to connect or
// to read the body match ErrTransport. now stamps startedAt.
func get(ctx context.Context, client *http.Client, now func() time.Time, u, accept string) (response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return response{}, fmt.Errorf("GET %s: %w", u, err)
	}
	req.Header.Set("Accept", accept)
	started := now()
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message repeats the URL
		}
		return response{}, fmt.Errorf("GET %s: %w", u, &transportError{err: err})
	}
	defer resp.Body.Close()
	out := response{status: resp.StatusCode, startedAt: started}
	limit := int64(maxBodyBytes)
	if !out.ok() {
		limit = maxSnippetBytes
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return response{}, fmt.Errorf("GET %s: read body: %w", u, &transportError{err: err})
	}
	if out.ok() && int64(len(body)) > limit {
		return response{}, fmt.Errorf("GET %s: %w (limit %d bytes)", u, ErrBodyTooLarge, limit)
	}
	out.body = body
	return out, nil
}

// errorFor returns the error for a non-2xx response to GET u.
func errorFor(u string, r response) error {
	return &statusError{url: u, status: r.status, snippet: snippet(r.body)}
}

// snippet makes a short, single-line, printable excerpt of an error body.
func snippet(b []byte) string {
	if len(b) > maxSnippetBytes {
		b = b[:maxSnippetBytes]
	}
	s := strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, strings.ToValidUTF8(string(b), ""))
	return strings.Join(strings.Fields(s), " ")
}
