// Command duet is an Envoy external processor that routes LLM inference
// requests for prefill/decode disaggregated serving with data-parallel ranks.
//
// Usage:
//
//	duet [serve] -config duet.yaml      run the ext_proc server (default);
//	                                    SIGHUP reloads the endpoint lists
//	duet envoy-config -config duet.yaml print the matching Envoy bootstrap
//	                  [-out envoy.yaml] (or write it to a file)
//	duet certs -out DIR [-hosts ...]    make a CA, duet's server and Envoy's
//	                                    client certificates, and tokens
//	duet tokenize -config duet.yaml     print a request body's token ids and
//	              [-pool NAME] [-json]  page blocks (body on stdin)
//	duet version                        print the version, commit and Go version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc/experimental"

	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/extproc"
)

// The gRPC proto codec takes its buffers from the process's default pool
// (see extproc.BufferPool); grpc-go allows replacing it only at init.
func init() { experimental.SetDefaultBufferPool(extproc.BufferPool()) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "duet:", err)
		os.Exit(1)
	}
}

// run dispatches the subcommand in args.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "version":
		fmt.Fprintln(stdout, buildVersionLine())
		return nil
	case "certs":
		return runCerts(args, stdout, stderr)
	case "tokenize":
		return runTokenize(args, os.Stdin, stdout, stderr)
	case "serve", "envoy-config":
	default:
		return fmt.Errorf("unknown command %q (want serve, envoy-config, certs, tokenize or version)", cmd)
	}
	fs := flag.NewFlagSet("duet "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "duet.yaml", "path of duet's YAML configuration")
	var out *string
	if cmd == "envoy-config" {
		out = fs.String("out", "", "write the bootstrap to this file instead of stdout (for images without a shell)")
	}
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	if cmd == "envoy-config" {
		if *out != "" {
			return writeEnvoyConfigFile(*out, cfg)
		}
		return writeEnvoyConfig(stdout, cfg)
	}
	return serve(ctx, cfg, *path)
}

// parseFlags parses a subcommand's args, which take no positional
// arguments; help is true when -h asked for the usage (already printed).
func parseFlags(fs *flag.FlagSet, args []string) (help bool, err error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return true, nil
		}
		return false, err
	}
	if fs.NArg() > 0 {
		return false, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return false, nil
}
