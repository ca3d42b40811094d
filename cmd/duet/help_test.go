package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// duet -h, --help and help list every subcommand and succeed; each
// subcommand's -h says what it does before its flags.
func TestHelp(t *testing.T) {
	tests := []struct {
		name string
		args []string
		// wantOut is on stdout, wantErr on stderr (the flag package's -h),
		// in order.
		wantOut, wantErr []string
	}{
		{"-h", []string{"-h"}, []string{"Usage: duet [command]", "serve ", "envoy-config ", "certs ", "tokenize ", "version ", "help "}, nil},
		{"--help", []string{"--help"}, []string{"Commands:", "envoy-config "}, nil},
		{"-help", []string{"-help"}, []string{"Commands:"}, nil},
		{"help", []string{"help"}, []string{"Commands:", "tokenize "}, nil},
		{"help serve", []string{"help", "serve"}, nil, []string{"Usage: duet [serve]", "Serve runs duet", "-config"}},
		{"serve -h", []string{"serve", "-h"}, nil, []string{"Serve runs duet", "Flags:", "-config"}},
		{"envoy-config -h", []string{"envoy-config", "-h"}, nil, []string{"Envoy-config prints the Envoy bootstrap", "Flags:", "-out"}},
		{"certs -h", []string{"certs", "-h"}, nil, []string{"Certs makes the credentials", "Flags:", "-hosts"}},
		{"tokenize -h", []string{"tokenize", "-h"}, nil, []string{"Tokenize reads a request body", "Flags:", "-pool"}},
		{"version -h", []string{"version", "-h"}, nil, []string{"Version prints duet's version"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if err := run(context.Background(), tt.args, &out, &errOut); err != nil {
				t.Fatalf("err = %v, want nil (exit 0)", err)
			}
			for _, c := range []struct {
				got  string
				want []string
			}{{out.String(), tt.wantOut}, {errOut.String(), tt.wantErr}} {
				rest := c.got
				for _, w := range c.want {
					i := strings.Index(rest, w)
					if i < 0 {
						t.Fatalf("output lacks %q (in order):\n%s", w, c.got)
					}
					rest = rest[i+len(w):]
				}
			}
		})
	}
}

// duet with no duet.yaml in the working directory says how to get one.
func TestMissingDefaultConfig(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, args := range [][]string{nil, {"serve"}, {"envoy-config"}, {"tokenize"}} {
		err := run(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil {
			t.Fatalf("%q: no error without duet.yaml", args)
		}
		for _, want := range []string{"open duet.yaml: no such file or directory", "pass -config FILE", `"Running it"`, "docs/configuration.md", `"make demo"`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%q: %v\nlacks %q", args, err, want)
			}
		}
	}
	if err := run(context.Background(), []string{"help", "launch"}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), `unknown command "launch"`) {
		t.Errorf("help launch: %v", err)
	}
}
