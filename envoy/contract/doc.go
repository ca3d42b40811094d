// Package contract holds the names that duet and its Envoy configuration
// share: the routing headers duet sets and Envoy strips from clients, the
// dynamic-metadata namespace and keys, and the access-log names. Package
// extproc sets them, package envoy renders the bootstrap that reads them,
// and package extproc/accesslog reads them back from Envoy's access logs;
// docs/envoy-contract.md records what was proved on a real Envoy.
package contract
