package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Outcome is how one request ended, as its client saw it.
type Outcome int

// The outcomes, from best to worst. Every one but OutcomeLost is an answer a
// client can act on.
const (
	OutcomeServed     Outcome = iota // a complete answer
	OutcomeError                     // an HTTP error with a JSON message
	OutcomeStreamErr                 // a stream that carried an error event
	OutcomeAborted                   // finish_reason "abort": the engine was told to stop
	OutcomeTerminated                // a stream cut without [DONE] (engine died mid-stream)
	OutcomeLost                      // no answer in time, or an answer nobody can act on
)

// Outcomes lists every Outcome in order.
var Outcomes = []Outcome{OutcomeServed, OutcomeError, OutcomeStreamErr, OutcomeAborted, OutcomeTerminated, OutcomeLost}

var outcomeNames = [...]string{"served", "error", "stream_error", "aborted", "terminated", "lost"}

// String returns the outcome's name.
func (o Outcome) String() string { return outcomeNames[o] }

// Result is one request's outcome and how long its client waited.
type Result struct {
	// ID is the x-request-id the request carried, for finding it in logs.
	ID      string
	Outcome Outcome
	Status  int
	Wait    time.Duration
	Detail  string
}

// Chat sends chat request number i (streamed or not, max_tokens of
// maxTokens) to Envoy at baseURL with client, and classifies the answer.
// The client's timeout bounds the wait: a request that hits it is lost.
func Chat(ctx context.Context, client *http.Client, baseURL string, i int, stream bool, maxTokens int) Result {
	return ChatWith(ctx, client, baseURL, i, stream, maxTokens, ChatExtra{})
}

// ChatExtra shapes a Chat request further.
type ChatExtra struct {
	// PromptTokens, when positive, pads the prompt to about that many
	// tokens (4 characters each).
	PromptTokens int
	// APIKey, when set, is sent as the bearer token (duet's admission
	// classes requests by its hash).
	APIKey string
}

// ChatWith is Chat with extra.
func ChatWith(ctx context.Context, client *http.Client, baseURL string, i int, stream bool, maxTokens int, extra ChatExtra) Result {
	start := time.Now()
	id := fmt.Sprintf("chat-%d-%d", i, start.UnixNano())
	r := chat(ctx, client, baseURL, id, i, stream, maxTokens, extra)
	r.ID, r.Wait = id, time.Since(start)
	return r
}

func chat(ctx context.Context, client *http.Client, baseURL, id string, i int, stream bool, maxTokens int, extra ChatExtra) Result {
	content := fmt.Sprintf("Request %d: tell me about disaggregated serving.", i)
	if extra.PromptTokens > 0 {
		content += " " + strings.Repeat("abcd", extra.PromptTokens)
	}
	body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":%v}`,
		content, maxTokens, stream)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return Result{Outcome: OutcomeLost, Detail: err.Error()}
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-request-id", id)
	if extra.APIKey != "" {
		req.Header.Set("authorization", "Bearer "+extra.APIKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return Result{Outcome: OutcomeLost, Detail: err.Error()}
	}
	defer resp.Body.Close()
	r := Result{Status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		data, err := io.ReadAll(resp.Body)
		if err != nil || !jsonMessage(data) {
			r.Outcome, r.Detail = OutcomeLost, fmt.Sprintf("status %d without a JSON error: %q (%v)", resp.StatusCode, data, err)
			return r
		}
		r.Outcome, r.Detail = OutcomeError, string(data)
		return r
	}
	if !stream {
		return classifyJSON(resp.Body, r)
	}
	return classifySSE(resp.Body, r)
}

// classifyJSON reads a non-streamed 200 answer.
func classifyJSON(body io.Reader, r Result) Result {
	data, err := io.ReadAll(body)
	if err != nil {
		r.Outcome, r.Detail = OutcomeTerminated, err.Error()
		if strings.Contains(err.Error(), "Client.Timeout") {
			r.Outcome = OutcomeLost
		}
		return r
	}
	var v struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(data, &v); err != nil || len(v.Choices) == 0 {
		r.Outcome, r.Detail = OutcomeLost, fmt.Sprintf("200 without choices: %q", data)
		return r
	}
	if v.Choices[0].FinishReason == "abort" {
		r.Outcome = OutcomeAborted
	}
	return r
}

// classifySSE reads a streamed 200 answer up to [DONE].
func classifySSE(body io.Reader, r Result) Result {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimPrefix(sc.Text(), "data: ")
		switch {
		case line == "[DONE]":
			return r
		case strings.HasPrefix(line, `{"error"`):
			r.Outcome, r.Detail = OutcomeStreamErr, line
		case strings.Contains(line, `"finish_reason":"abort"`):
			r.Outcome = OutcomeAborted
		}
	}
	if r.Outcome == OutcomeServed {
		r.Outcome = OutcomeTerminated
		if err := sc.Err(); err != nil {
			r.Detail = err.Error()
			if strings.Contains(r.Detail, "Client.Timeout") {
				r.Outcome = OutcomeLost
			}
		}
	}
	return r
}

// jsonMessage reports whether data is a JSON error with a message, in the
// OpenAI envelope or SGLang's own shapes.
func jsonMessage(data []byte) bool {
	var v struct {
		Message string `json:"message"`
		Detail  string `json:"detail"`
		Error   struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	return json.Unmarshal(bytes.TrimSpace(data), &v) == nil && (v.Message != "" || v.Detail != "" || v.Error.Message != "")
}
