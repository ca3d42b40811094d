// Package legs follows the two legs of every prefill/decode request and
// aborts the surviving leg on its engine when the other one fails.
//
// Envoy sends a PD request to the decode engine and mirrors it to the prefill
// engine, and it never relates the two: when the prefill fails, the decode
// engine keeps the request (and its KV slots) until SGLang's KV wait times
// out (SGLANG_DISAGGREGATION_WAITING_TIMEOUT, 300 s by default), and the
// client waits with it. The Tracker learns each leg's end from the access-log
// feedback and acts at once:
//
//   - the prefill leg failed (error status, reset, refused connection) while
//     the decode leg runs: abort the decode leg, so the client gets an error
//     now instead of after the KV timeout;
//   - the decode leg failed, or the client went away, while the prefill leg
//     runs: abort the prefill leg, which would otherwise hold its KV until
//     the bootstrap timeout;
//   - an engine was ejected as dead or hung (scheduler health): abort the
//     partner legs of the requests it still holds.
//
// Aborts use SGLang's POST /abort_request with the request's rid, which duet
// sets to its own request id (extproc writes it into the body).
package legs
