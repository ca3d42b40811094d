// Package auth decides who may talk to duet. On the gRPC port, where Envoy
// opens its ext_proc and access-log streams, a Guard requires mutual TLS,
// a bearer token, or both, and refuses every other caller with gRPC
// Unauthenticated. On the admin port, AdminHandler keeps the health and
// metrics endpoints open to probes and scrapers and puts the pages that
// show request ids and targets behind a token unless the port listens on
// loopback only. Every refusal is counted in duet_auth_refused_total and
// logged at most once per LogEvery per reason.
//
// Credentials come from files, which Reload reads again (on SIGHUP), so
// that certificates and tokens rotate without a restart. docs/security.md
// gives the threat model.
package auth
