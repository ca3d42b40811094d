// Command duet-istio-check runs Istio's own code, offline, on deploy/istio's
// manifests. It lives in its own Go module so that Istio never becomes a
// dependency of duet; the Makefile builds it into .tools/ at the Istio
// version pinned in this module's go.mod.
//
// Usage:
//
//	duet-istio-check analyze -o OUT.json FILE...
//	duet-istio-check crd -crds crd-all.gen.yaml FILE...
//	duet-istio-check xds -o OUT.json [-proxy-type router|sidecar] [-proxy-name NAME] -proxy-namespace NS -proxy-ip IP -proxy-label k=v FILE...
//
// analyze runs istioctl analyze's analyzers with the Kubernetes objects of
// the files included (istioctl analyze --use-kube=false leaves them out), and
// writes the messages as JSON.
//
// crd validates every Istio object in the files against the OpenAPI schemas
// of Istio's CustomResourceDefinitions, the way a Kubernetes API server does
// (structural schema, defaults, unknown fields, CEL rules).
//
// xds feeds the files (Istio objects and the Kubernetes objects they refer
// to) to Istio's configuration generator, the code istiod runs, builds the
// configuration of the proxy the flags describe (a gateway, or the sidecar
// of a pod: its inbound listener carries the PeerAuthentication's TLS and
// the AuthorizationPolicy's RBAC filter), with every
// EnvoyFilter applied, and writes it as one Envoy bootstrap (JSON) that an
// upstream Envoy can load with --mode validate: the route configurations
// are inlined, a placeholder xds-grpc cluster stands for istiod, and the
// filters that only Istio's proxy build has are removed and listed on stderr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	istiolog "istio.io/istio/pkg/log"
)

func main() {
	// Istio's packages log to stdout by default; keep stdout for results.
	opts := istiolog.DefaultOptions()
	opts.OutputPaths = []string{"stderr"}
	opts.ErrorOutputPaths = []string{"stderr"}
	opts.SetDefaultOutputLevel(istiolog.OverrideScopeName, istiolog.WarnLevel)
	if err := istiolog.Configure(opts); err != nil {
		fmt.Fprintln(os.Stderr, "duet-istio-check: configure logging:", err)
		os.Exit(1)
	}
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "duet-istio-check:", err)
		os.Exit(1)
	}
}

// run dispatches a subcommand.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: duet-istio-check analyze|crd|xds [flags] FILE [FILE...]")
	}
	switch args[0] {
	case "crd":
		fs := flag.NewFlagSet("crd", flag.ContinueOnError)
		crds := fs.String("crds", "", "file of Istio CustomResourceDefinitions (crd-all.gen.yaml)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *crds == "" || fs.NArg() == 0 {
			return errors.New("crd: -crds and at least one file are required")
		}
		return validateCRDs(*crds, fs.Args(), stdout)
	case "analyze":
		fs := flag.NewFlagSet("analyze", flag.ContinueOnError)
		outFile := fs.String("o", "", "write the messages (JSON) to this file")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *outFile == "" || fs.NArg() == 0 {
			return errors.New("analyze: -o and at least one file are required")
		}
		return writeFile(*outFile, func(w io.Writer) error { return analyzeFiles(fs.Args(), w, stderr) })
	case "xds":
		fs := flag.NewFlagSet("xds", flag.ContinueOnError)
		var p proxySpec
		fs.StringVar(&p.Type, "proxy-type", "router", "router (a gateway) or sidecar")
		fs.StringVar(&p.Name, "proxy-name", "duet-gateway", "the proxy's pod name")
		fs.StringVar(&p.Namespace, "proxy-namespace", "", "the proxy's namespace")
		fs.StringVar(&p.IP, "proxy-ip", "", "the proxy's pod IP (as in the Kubernetes objects)")
		outFile := fs.String("o", "", "write the bootstrap (JSON) to this file")
		var labels stringList
		fs.Var(&labels, "proxy-label", "a label of the proxy's pod, key=value (repeatable)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *outFile == "" || p.Namespace == "" || p.IP == "" || len(labels) == 0 || fs.NArg() == 0 {
			return errors.New("xds: -o, -proxy-namespace, -proxy-ip, -proxy-label and at least one file are required")
		}
		if _, ok := proxyTypes[p.Type]; !ok {
			return fmt.Errorf("xds: -proxy-type %q: want router or sidecar", p.Type)
		}
		p.Labels = map[string]string{}
		for _, l := range labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				return fmt.Errorf("xds: -proxy-label %q is not key=value", l)
			}
			p.Labels[k] = v
		}
		return writeFile(*outFile, func(w io.Writer) error { return generate(ctx, p, fs.Args(), w, stderr) })
	default:
		return fmt.Errorf("unknown subcommand %q (want analyze, crd or xds)", args[0])
	}
}

// writeFile writes what write produces to path. Results go to files, not
// stdout: some of Istio's packages log to stdout while they initialise.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
