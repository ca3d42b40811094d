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
//	duet help [COMMAND]                 list the commands, or describe one
//	                                    (also duet -h, duet COMMAND -h)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
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

// command is one of duet's subcommands, as `duet help` lists it.
type command struct {
	name, summary string
}

// commands are duet's subcommands, in the order `duet help` lists them.
var commands = []command{
	{"serve", "run the ext_proc server and the admin port (the default command)"},
	{"envoy-config", "print, or write with -out, the Envoy bootstrap that matches the configuration"},
	{"certs", "make a CA, duet's and Envoy's certificates, and the tokens, for auth"},
	{"tokenize", "print a request body's token ids and prefix blocks as a pool's tokenizer makes them"},
	{"version", "print the version, the commit and the Go version"},
	{"help", "print this list, or with a command's name that command's help"},
}

// printUsage writes duet's help: what it is and its subcommands, one line
// each.
func printUsage(w io.Writer) {
	fmt.Fprint(w, `duet routes LLM requests to SGLang prefill/decode (PD) engines as an Envoy
external processor (ext_proc).

Usage: duet [command] [flags]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-13s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
"duet COMMAND -h" describes a command and its flags. serve, envoy-config and
tokenize read the configuration named by -config (default duet.yaml); the
README's "Running it" section shows one and docs/configuration.md lists every
key.
`)
}

// setUsage makes fs's -h print the command's synopsis and a sentence saying
// what it does before its flags.
func setUsage(fs *flag.FlagSet, synopsis, description string) {
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: %s\n\n%s\n", synopsis, description)
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprint(w, "\nFlags:\n")
			fs.PrintDefaults()
		}
	}
}

// run dispatches the subcommand in args.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help":
			printUsage(stdout)
			return nil
		}
	}
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "help":
		if len(args) == 0 {
			printUsage(stdout)
			return nil
		}
		if len(args) > 1 || args[0] == "help" {
			return fmt.Errorf("help: want one command's name, got %q", args)
		}
		return run(ctx, []string{args[0], "-h"}, stdout, stderr)
	case "version":
		fs := flag.NewFlagSet("duet version", flag.ContinueOnError)
		fs.SetOutput(stderr)
		setUsage(fs, "duet version", "Version prints duet's version, the commit it was built from and the Go version that built it.")
		if help, err := parseFlags(fs, args); help || err != nil {
			return err
		}
		fmt.Fprintln(stdout, buildVersionLine())
		return nil
	case "certs":
		return runCerts(args, stdout, stderr)
	case "tokenize":
		return runTokenize(args, os.Stdin, stdout, stderr)
	case "serve", "envoy-config":
	default:
		return fmt.Errorf("unknown command %q (want serve, envoy-config, certs, tokenize, version or help; duet -h describes them)", cmd)
	}
	fs := flag.NewFlagSet("duet "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "duet.yaml", "path of duet's YAML configuration")
	var out *string
	if cmd == "envoy-config" {
		out = fs.String("out", "", "write the bootstrap to this file instead of stdout (for images without a shell)")
		setUsage(fs, "duet envoy-config [-config FILE] [-out FILE]",
			"Envoy-config prints the Envoy bootstrap that matches duet's configuration: the listener, the ext_proc\n"+
				"and access-log clusters that reach duet, and the engine pools' clusters.")
	} else {
		setUsage(fs, "duet [serve] [-config FILE]",
			"Serve runs duet: the ext_proc and access-log gRPC server Envoy calls, and the admin port\n"+
				"(/healthz, /readyz, /metrics, /status). SIGHUP reloads the configuration; SIGTERM stops it.")
	}
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	cfg, err := loadConfig(*path, cmd == "serve")
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

// loadConfig is config.Load (config.LoadServing when serving), saying how
// to get a configuration when the file does not exist.
func loadConfig(path string, serving bool) (*config.Config, error) {
	load := config.Load
	if serving {
		load = config.LoadServing
	}
	cfg, err := load(path)
	if _, serr := os.Stat(path); err != nil && errors.Is(serr, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w (pass -config FILE, or write %s: README.md's \"Running it\" shows one and "+
			"docs/configuration.md lists every key; \"make demo\" writes a working one into the logs directory it prints)", err, path)
	}
	return cfg, err
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
