package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/tidwall/gjson"
)

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatRequest is one chat completion.
type ChatRequest struct {
	Model     string
	Messages  []Message
	MaxTokens int
	// Stream asks for a streaming response (with usage in the last chunk);
	// only streamed requests show their time to first token.
	Stream bool
	// Seed is the sampling seed (OpenAI's seed); 0 sends none.
	Seed int64
	// Class, if set, is sent as the API key of that class, APIKey(Class),
	// in Authorization, as a deployment tells its clients apart (duet
	// classes a request by the SHA-256 of its key: admission.api_keys).
	Class string
	// Tenant, if set, is sent in TenantHeader.
	Tenant string
}

// TenantHeader carries a request's tenant (ChatRequest.Tenant). It is not
// an x-duet-* header, which duet's Envoy removes from clients' requests:
// duet reads it where its configuration names it and trusts it
// (admission.tenant_header, admission.trust_client_headers), as the
// compose example does.
const TenantHeader = "x-tenant"

// APIKey is the bearer token the benchmark client sends for class: sk-<class>.
func APIKey(class string) string { return "sk-" + class }

// setHeaders sets the headers of a request of r on h: the content type,
// and the class's API key and the tenant where r names them.
func (r ChatRequest) setHeaders(h http.Header) {
	h.Set("Content-Type", "application/json")
	if r.Class != "" {
		h.Set("Authorization", "Bearer "+APIKey(r.Class))
	}
	if r.Tenant != "" {
		h.Set(TenantHeader, r.Tenant)
	}
}

// Body renders the request, with ignore_eos so that the engine generates
// exactly MaxTokens tokens.
func (r ChatRequest) Body() ([]byte, error) {
	m := map[string]any{
		"model":      r.Model,
		"messages":   r.Messages,
		"max_tokens": r.MaxTokens,
		"ignore_eos": true,
		"stream":     r.Stream,
	}
	if r.Stream {
		m["stream_options"] = map[string]any{"include_usage": true}
	}
	if r.Seed != 0 {
		m["seed"] = r.Seed
	}
	return json.Marshal(m)
}

// Outcome is what the client saw of one request, in wall-clock time.
type Outcome struct {
	// Stream is set for a streamed request.
	Stream bool
	// Sent is when the request was sent.
	Sent time.Time
	// First and Last are the arrivals of the first and the last chunk with
	// generated content (zero when none came, and for a request that was
	// not streamed).
	First, Last time.Time
	// Done is when the response ended: [DONE] for a stream, the whole body
	// otherwise, the refusal for a refused request (zero when it did not
	// end).
	Done time.Time
	// Chunks counts the chunks with generated content.
	Chunks int
	// Usage is the final usage chunk, when one came.
	Usage *Usage
	// Status is the HTTP status (0 when none arrived).
	Status int
	// Refused is set when the router answered 429 (Too Many Requests):
	// duet's admission shed the request. A refused request is neither
	// failed nor unfinished (Err stays empty); RetryAfter is the answer's
	// Retry-After header.
	Refused    bool
	RetryAfter string
	// Err describes a failure: a non-200 status, an in-stream error, a
	// transport error or a stream cut short. "" when the request succeeded.
	Err string
	// Canceled is set when the run's deadline or cancellation ended the
	// request; such a request is unfinished rather than failed.
	Canceled bool
}

// Usage is the OpenAI usage object of the final chunk.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens; HasCached
	// says whether the engine reported it.
	CachedTokens int
	HasCached    bool
}

// OK reports whether the request completed without error (a refused
// request did not).
func (o Outcome) OK() bool { return o.Err == "" && !o.Canceled && !o.Refused && !o.Done.IsZero() }

// Tokens returns the generated tokens: usage.completion_tokens when
// reported, else the content chunks seen.
func (o Outcome) Tokens() int {
	if o.Usage != nil && o.Usage.CompletionTokens > 0 {
		return o.Usage.CompletionTokens
	}
	return o.Chunks
}

// maxLine bounds one SSE line.
const maxLine = 4 << 20

// Send posts req to url (…/v1/chat/completions) and reads the response to
// its end. It never returns an error: failures are recorded in the Outcome.
func Send(ctx context.Context, client *http.Client, url string, req ChatRequest) Outcome {
	o := Outcome{Stream: req.Stream}
	body, err := req.Body()
	if err != nil {
		o.Err = err.Error()
		return o
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		o.Err = err.Error()
		return o
	}
	req.setHeaders(hreq.Header)
	o.Sent = time.Now()
	resp, err := client.Do(hreq)
	if err != nil {
		o.fail(ctx, err)
		return o
	}
	defer resp.Body.Close()
	o.Status = resp.StatusCode
	if resp.StatusCode == http.StatusTooManyRequests {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		o.Refused, o.RetryAfter = true, resp.Header.Get("Retry-After")
		o.Done = time.Now()
		return o
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		o.Err = fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		return o
	}
	read := o.readStream
	if !req.Stream {
		read = o.readBody
	}
	if err := read(resp.Body); err != nil {
		o.fail(ctx, err)
	}
	return o
}

// readBody reads a non-streaming response: its usage, or its error.
func (o *Outcome) readBody(r io.Reader) error {
	body, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if !gjson.ValidBytes(body) {
		return errors.New("invalid JSON response")
	}
	if err := o.frame(body); err != nil {
		return err
	}
	o.Done = time.Now()
	return nil
}

// fail records err, or a cancellation when ctx ended.
func (o *Outcome) fail(ctx context.Context, err error) {
	if ctx.Err() != nil {
		o.Canceled = true
		return
	}
	o.Err = err.Error()
}

// readStream consumes SSE frames until [DONE].
func (o *Outcome) readStream(r io.Reader) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := readLine(br)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("stream ended before [DONE]")
			}
			return err
		}
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if bytes.Equal(data, []byte("[DONE]")) {
			o.Done = time.Now()
			return nil
		}
		if err := o.frame(data); err != nil {
			return err
		}
	}
}

// frame handles one data frame.
func (o *Outcome) frame(data []byte) error {
	if e := gjson.GetBytes(data, "error"); e.Exists() {
		msg := e.Get("message").String()
		if msg == "" {
			msg = e.Raw
		}
		o.Err = "engine error: " + msg
		return nil
	}
	if c := gjson.GetBytes(data, "choices.0.delta.content"); c.String() != "" {
		now := time.Now()
		if o.First.IsZero() {
			o.First = now
		}
		o.Last = now
		o.Chunks++
	}
	if u := gjson.GetBytes(data, "usage"); u.IsObject() {
		o.Usage = &Usage{
			PromptTokens:     int(u.Get("prompt_tokens").Int()),
			CompletionTokens: int(u.Get("completion_tokens").Int()),
		}
		if c := u.Get("prompt_tokens_details.cached_tokens"); c.Exists() && c.Type != gjson.Null {
			o.Usage.CachedTokens, o.Usage.HasCached = int(c.Int()), true
		}
	}
	return nil
}

// readLine returns one line without its line ending.
func readLine(br *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		part, err := br.ReadSlice('\n')
		buf = append(buf, part...)
		if err == nil {
			return bytes.TrimRight(buf, "\r\n"), nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if len(buf) > 0 && errors.Is(err, io.EOF) {
				return bytes.TrimRight(buf, "\r\n"), nil
			}
			return nil, err
		}
		if len(buf) > maxLine {
			return nil, errors.New("SSE line too long")
		}
	}
}

// NewHTTPClient returns a client for many concurrent streams to one host.
func NewHTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 4096
	t.MaxIdleConnsPerHost = 4096
	t.DisableCompression = true
	return &http.Client{Transport: t}
}
