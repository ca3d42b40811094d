package extproc

import (
	"encoding/json"
	"errors"
	"fmt"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/extproc/tokenize"
)

// Pool is one model's engines as the Server routes to them: the model
// names it serves and what picks among its engines.
type Pool struct {
	// Name names the pool in contract.HeaderPool, metrics and logs.
	Name string
	// Models are the names clients send in `model` for this pool; the
	// first is the name its engines serve. Empty (a single pool only)
	// serves every request whatever its model.
	Models []string
	// Aliases are further names clients may send; duet rewrites them to
	// Models[0] in the body.
	Aliases []string
	// Picker chooses the pool's targets; required.
	Picker Picker
	// PrefillCluster is the Envoy cluster of the pool's prefill engines,
	// named in contract.HeaderMirror.
	PrefillCluster string
	// Fallbacks, when set, names a second decode host for Envoy's retry.
	Fallbacks DecodeFallbacker
	// Tokenizer, when set, turns prompts into the token ids the pool's
	// engines compute (its chat template and tokenizer), so the prefix
	// index keys token blocks; nil routes by the text estimate.
	Tokenizer *tokenize.Model
	// Admission, when set, queues the pool's inference requests while its
	// engines are saturated; nil routes every request at once.
	Admission *Admission
}

// pools finds the pool of a request by its model.
type pools struct {
	list []*Pool
	// byModel maps every model name and alias to its pool; nil when the
	// single pool serves every model.
	byModel map[string]*Pool
	// aliases maps each alias to the model name it is rewritten to.
	aliases map[string]string
	// models is the body of GET /v1/models.
	models []byte
	// created is the models' creation time in it (duet's start).
	created int64
	// served lists the served model names, for errors.
	served string
}

// newPools checks the pools and indexes them by model name. Either one pool
// serves every model (no Models), or every pool names its models.
func newPools(list []Pool, created time.Time) (*pools, error) {
	if len(list) == 0 {
		return nil, errors.New("extproc: at least one pool (or a Picker) is required")
	}
	ps := &pools{}
	seenNames := map[string]bool{}
	for i := range list {
		p := &list[i]
		switch {
		case p.Picker == nil:
			return nil, fmt.Errorf("extproc: pool %q has no Picker", p.Name)
		case p.PrefillCluster == "":
			return nil, fmt.Errorf("extproc: pool %q has no prefill cluster name", p.Name)
		case seenNames[p.Name]:
			return nil, fmt.Errorf("extproc: two pools are named %q", p.Name)
		}
		seenNames[p.Name] = true
		ps.list = append(ps.list, p)
	}
	byModel := 0
	for _, p := range ps.list {
		if len(p.Models) > 0 {
			byModel++
		}
	}
	switch {
	case byModel == 0 && len(ps.list) == 1:
		return ps, nil
	case byModel != len(ps.list):
		return nil, errors.New("extproc: with several pools, every pool must name its models")
	}
	ps.created = created.Unix()
	var served []string
	for _, p := range ps.list {
		served = append(served, p.Models...)
	}
	ps.served = strings.Join(served, ", ")
	ps.byModel = map[string]*Pool{}
	ps.aliases = map[string]string{}
	type modelObject struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	listing := struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}{Object: "list", Data: []modelObject{}}
	for _, p := range ps.list {
		for _, names := range [][]string{p.Models, p.Aliases} {
			for _, m := range names {
				if _, dup := ps.byModel[m]; dup {
					return nil, fmt.Errorf("extproc: model %q is served by two pools", m)
				}
				ps.byModel[m] = p
			}
		}
		for _, a := range p.Aliases {
			ps.aliases[a] = p.Models[0]
		}
		for _, m := range p.Models {
			listing.Data = append(listing.Data, modelObject{ID: m, Object: "model", Created: created.Unix(), OwnedBy: p.Name})
		}
	}
	var err error
	if ps.models, err = json.Marshal(listing); err != nil {
		return nil, fmt.Errorf("extproc: list models: %w", err)
	}
	return ps, nil
}

// byModelName reports whether requests are routed by their model (else the
// single pool takes them all).
func (ps *pools) byModelName() bool { return ps.byModel != nil }

// modelNotFoundError is a model no pool serves, or a missing one (model
// ""); served lists the models the gateway serves.
type modelNotFoundError struct{ model, served string }

func (e *modelNotFoundError) Error() string {
	if e.model == "" {
		return "the request names no model; this gateway serves " + e.served
	}
	return fmt.Sprintf("the model `%s` does not exist; this gateway serves %s", truncate(e.model, 200), e.served)
}

// forBody returns the pool of an inference request, and the model name to
// write into its body ("" to leave the body's model as it is).
func (ps *pools) forBody(route Route, body *Body) (*Pool, string, error) {
	if !ps.byModelName() {
		return ps.list[0], "", nil
	}
	model := body.field("model")
	if !model.Exists() || model.Type == gjson.Null || model.String() == "" {
		if route == RouteGenerate && len(ps.list) == 1 {
			// SGLang's /generate takes no model: one pool serves them all.
			return ps.list[0], "", nil
		}
		return nil, "", &modelNotFoundError{served: ps.served}
	}
	if model.Type != gjson.String {
		return nil, "", fmt.Errorf("%w: model must be a string", errBadBody)
	}
	name := model.String()
	p, ok := ps.byModel[name]
	if !ok {
		return nil, "", &modelNotFoundError{model: name, served: ps.served}
	}
	return p, ps.aliases[name], nil
}

// forOther returns the pool of a request that is not an inference request
// (no body to read a model from): the first pool.
func (ps *pools) forOther() *Pool { return ps.list[0] }

// truncate shortens s to at most n bytes for messages.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// modelsPath reports whether a GET is for the OpenAI model list
// (/v1/models) or one model (/v1/models/{model}), and which model.
func modelsPath(method, path string) (model string, one, ok bool) {
	if method != http.MethodGet {
		return "", false, false
	}
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch {
	case path == "/v1/models" || path == "/v1/models/":
		return "", false, true
	case strings.HasPrefix(path, "/v1/models/"):
		return strings.TrimPrefix(path, "/v1/models/"), true, true
	}
	return "", false, false
}

// answerModels answers GET /v1/models (every pool's models) and
// GET /v1/models/{model} from duet, without an engine.
func (ps *pools) answerModels(model string, one bool) *extprocv3.ProcessingResponse {
	body := ps.models
	if one {
		p, ok := ps.byModel[model]
		if !ok {
			return modelNotFound(&modelNotFoundError{model: model, served: ps.served})
		}
		body, _ = json.Marshal(map[string]any{"id": model, "object": "model", "created": ps.created, "owned_by": p.Name})
	}
	return immediateJSON(http.StatusOK, "models", body)
}

// modelNotFound is OpenAI's answer to a model it does not serve: 404 with
// code model_not_found and param model.
func modelNotFound(err *modelNotFoundError) *extprocv3.ProcessingResponse {
	param := "model"
	return errorResponse(http.StatusNotFound, "model_not_found", openAIErrorBody{
		Message: err.Error(), Type: "invalid_request_error", Param: &param, Code: "model_not_found",
	})
}
