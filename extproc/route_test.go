package extproc

import "testing"

func TestClassifyRoute(t *testing.T) {
	tests := []struct {
		method, path string
		want         Route
	}{
		{"POST", "/v1/chat/completions", RouteChat},
		{"POST", "/v1/chat/completions?x=1", RouteChat},
		{"POST", "/v1/chat/completions/", RouteChat},
		{"POST", "/v1/completions", RouteCompletions},
		{"POST", "/generate", RouteGenerate},
		{"POST", "/v1/responses", RouteResponses},
		{"GET", "/v1/chat/completions", RouteOther},
		{"GET", "/v1/models", RouteOther},
		{"POST", "/v1/embeddings", RouteOther},
		{"POST", "/generate_stream", RouteOther},
	}
	for _, tt := range tests {
		if got := ClassifyRoute(tt.method, tt.path); got != tt.want {
			t.Errorf("ClassifyRoute(%s %s) = %v, want %v", tt.method, tt.path, got, tt.want)
		}
	}
	if !RouteChat.OpenAI() || RouteGenerate.OpenAI() || RouteOther.Inference() {
		t.Error("route predicates wrong")
	}
}

func TestAdminPath(t *testing.T) {
	tests := []struct {
		path string
		want bool
	}{
		{"/abort_request", true},
		{"/abort_request/", true},
		{"/flush_cache?now=1", true},
		{"/update_weights_from_disk", true},
		{"/generate", false},
		{"/v1/models", false},
		{"/health", false},
		{"/abort_request_x", false},
	}
	for _, tt := range tests {
		if got := AdminPath(tt.path); got != tt.want {
			t.Errorf("AdminPath(%q) = %v, want %v", tt.path, got, tt.want)
		}
	}
}
