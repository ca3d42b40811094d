package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The official OpenAI Python SDK, streaming and not, works through Envoy and duet.
func TestOpenAIPythonSDK(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, pd.Tools.Python, "openai_client.py", pd.EnvoyURL)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("openai_client.py: %v\n%s", err, stderr)
	}
	var got struct {
		Chat struct {
			Content string         `json:"content"`
			Usage   map[string]int `json:"usage"`
		} `json:"chat"`
		ChatStream struct {
			Chunks []string       `json:"chunks"`
			Usage  map[string]int `json:"usage"`
		} `json:"chat_stream"`
		Completions struct {
			Text  string         `json:"text"`
			Usage map[string]int `json:"usage"`
		} `json:"completions"`
		Error *struct {
			Type   string `json:"type"`
			Status int    `json:"status"`
		} `json:"error"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("bad output %s: %v", out, err)
	}
	if got.Chat.Content == "" || got.Chat.Usage["completion_tokens"] != 6 {
		t.Errorf("chat: %+v", got.Chat)
	}
	if len(got.ChatStream.Chunks) < 6 || got.ChatStream.Usage["completion_tokens"] != 6 {
		t.Errorf("chat stream: %+v", got.ChatStream)
	}
	if strings.TrimSpace(got.Completions.Text) == "" || got.Completions.Usage["completion_tokens"] != 5 {
		t.Errorf("completions: %+v", got.Completions)
	}
	if got.Error == nil || got.Error.Status != 400 || got.Error.Type != "BadRequestError" {
		t.Errorf("a bad request must surface as the SDK's BadRequestError: %+v", got.Error)
	}
}
