package extproc

import (
	"encoding/json"
	"net/http"

	"github.com/duet-router/duet/envoy/contract"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// openAIError is the error envelope OpenAI clients parse.
type openAIError struct {
	Error openAIErrorBody `json:"error"`
}

type openAIErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	// Code is the HTTP status, or OpenAI's code name where it has one
	// (model_not_found).
	Code any `json:"code"`
}

// errorType maps an HTTP status to the OpenAI error type name.
func errorType(status int) string {
	switch {
	case status == http.StatusRequestEntityTooLarge || status < 500:
		return "invalid_request_error"
	default:
		return "server_error"
	}
}

// immediateError builds an ext_proc immediate response that ends the request
// in Envoy with status and an OpenAI-format JSON error. details shows up in
// Envoy's %RESPONSE_CODE_DETAILS%.
func immediateError(status int, details, message string) *extprocv3.ProcessingResponse {
	return errorResponse(status, details, openAIErrorBody{Message: message, Type: errorType(status), Code: status})
}

// errorResponse is immediateError with the whole error object given.
func errorResponse(status int, details string, e openAIErrorBody) *extprocv3.ProcessingResponse {
	body, _ := json.Marshal(openAIError{Error: e})
	return immediateJSON(status, details, body)
}

// immediateJSON builds an ext_proc immediate response: status with a JSON
// body, answered by Envoy without any upstream. details shows up in Envoy's
// %RESPONSE_CODE_DETAILS% as duet_<details>.
func immediateJSON(status int, details string, body []byte) *extprocv3.ProcessingResponse {
	// Tag the reply so Envoy's local_reply_config leaves duet's body alone.
	md, _ := structpb.NewStruct(map[string]any{contract.MetadataNamespace: map[string]any{"local_reply": true}})
	return &extprocv3.ProcessingResponse{
		DynamicMetadata: md,
		Response: &extprocv3.ProcessingResponse_ImmediateResponse{
			ImmediateResponse: &extprocv3.ImmediateResponse{
				Status: &typev3.HttpStatus{Code: typev3.StatusCode(status)},
				Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
					setHeader("content-type", "application/json"),
				}},
				Body:    body,
				Details: "duet_" + details,
			},
		},
	}
}

// setHeader is an overwrite-or-add header mutation.
func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}
