// Package docker holds the Dockerfiles of duet's images (duet and
// duet-sim), built by `make image`. Without a Docker engine to build them,
// its tests check them statically: each parses with BuildKit's Dockerfile
// parser, every base image is pinned, the Go image matches go.mod's Go
// version, the binary is built static (CGO_ENABLED=0) into a final stage
// that runs it as a non-root user, the -X flags name variables that exist,
// and the build context's ignore file keeps every file the build needs.
package docker

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	dockerfile "github.com/moby/buildkit/frontend/dockerfile/parser"
)

// images are the Dockerfiles and what each builds.
var images = []struct {
	dockerfile string
	pkg        string // the main package built
	binary     string // installed as /usr/local/bin/<binary>
}{
	{"duet.Dockerfile", "./cmd/duet", "duet"},
	{"duet-sim.Dockerfile", "./cmd/duet-sim", "duet-sim"},
}

// repoRoot is the build context of every Dockerfile.
const repoRoot = "../.."

// instruction is one parsed Dockerfile line.
type instruction struct {
	cmd   string   // lower case: from, run, copy, ...
	args  []string // the arguments, exec-form lists unquoted
	flags []string // --from=..., --mount=...
	json  bool     // exec form
	line  int
}

func parse(t *testing.T, path string) []instruction {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := dockerfile.Parse(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, w := range res.Warnings {
		t.Errorf("%s: parser warning: %s", path, w.Short)
	}
	var out []instruction
	for _, n := range res.AST.Children {
		in := instruction{cmd: strings.ToLower(n.Value), flags: n.Flags, json: n.Attributes["json"], line: n.StartLine}
		for a := n.Next; a != nil; a = a.Next {
			in.args = append(in.args, a.Value)
		}
		out = append(out, in)
	}
	return out
}

// stage is one FROM and the instructions after it.
type stage struct {
	image, name string
	body        []instruction
}

// stages splits a Dockerfile into its global ARG defaults and its stages,
// with ${ARG} expanded in each FROM.
func stages(t *testing.T, ins []instruction) (map[string]string, []stage) {
	t.Helper()
	global := map[string]string{}
	var out []stage
	for _, in := range ins {
		switch {
		case in.cmd == "from":
			image := os.Expand(in.args[0], func(k string) string { return global[k] })
			s := stage{image: image}
			if len(in.args) == 3 && strings.EqualFold(in.args[1], "as") {
				s.name = in.args[2]
			}
			out = append(out, s)
		case len(out) == 0 && in.cmd == "arg":
			k, v, ok := strings.Cut(in.args[0], "=")
			if !ok {
				t.Errorf("line %d: global ARG %s has no default", in.line, k)
			}
			global[k] = v
		case len(out) > 0:
			out[len(out)-1].body = append(out[len(out)-1].body, in)
		default:
			t.Errorf("line %d: %s before the first FROM", in.line, in.cmd)
		}
	}
	return global, out
}

// goDirective returns go.mod's go version.
func goDirective(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	return string(m[1])
}

var pinned = regexp.MustCompile(`^[a-z0-9./-]+:[0-9][A-Za-z0-9._-]*$`)

func TestDockerfiles(t *testing.T) {
	goVersion := goDirective(t)
	for _, img := range images {
		t.Run(img.dockerfile, func(t *testing.T) {
			global, st := stages(t, parse(t, img.dockerfile))
			if len(st) < 2 {
				t.Fatalf("%d stages, want a build stage and a runtime stage", len(st))
			}
			for _, s := range st {
				if !pinned.MatchString(s.image) {
					t.Errorf("FROM %s: not pinned to a version", s.image)
				}
			}
			if got := global["GO_VERSION"]; got != goVersion {
				t.Errorf("GO_VERSION %q, want go.mod's %q", got, goVersion)
			}

			build, final := st[0], st[len(st)-1]
			if !strings.HasPrefix(build.image, "golang:"+goVersion) || build.name == "" {
				t.Errorf("build stage FROM %s AS %q: want a named golang:%s stage", build.image, build.name, goVersion)
			}
			var goBuild string
			for _, in := range build.body {
				if in.cmd == "run" && strings.Contains(strings.Join(in.args, " "), "go build") {
					goBuild = strings.Join(in.args, " ")
				}
			}
			if !strings.Contains(goBuild, "CGO_ENABLED=0") || !strings.Contains(goBuild, " "+img.pkg) {
				t.Errorf("build stage: want a static `CGO_ENABLED=0 go build ... %s`, got %q", img.pkg, goBuild)
			}
			checkLinkerFlags(t, goBuild, img.pkg)

			var user string
			var copied, entrypoint bool
			for _, in := range final.body {
				switch in.cmd {
				case "user":
					user = in.args[0]
				case "copy":
					if slices.Contains(in.flags, "--from="+build.name) && in.args[len(in.args)-1] == "/usr/local/bin/"+img.binary {
						copied = true
					}
				case "entrypoint":
					entrypoint = in.json && len(in.args) == 1 && in.args[0] == "/usr/local/bin/"+img.binary
				case "run":
					t.Errorf("line %d: the runtime stage runs nothing (RUN %s)", in.line, strings.Join(in.args, " "))
				}
			}
			if uid, _, _ := strings.Cut(user, ":"); uid == "" || uid == "0" || uid == "root" {
				t.Errorf("runtime stage USER %q: want a non-root user", user)
			}
			if !copied {
				t.Errorf("runtime stage: no COPY --from=%s of the binary to /usr/local/bin/%s", build.name, img.binary)
			}
			if !entrypoint {
				t.Errorf("runtime stage: want ENTRYPOINT [\"/usr/local/bin/%s\"] in exec form", img.binary)
			}
		})
	}
}

// checkLinkerFlags checks that every -X flag of the go build command names
// a package-level string variable of the built main package: the linker
// silently ignores a -X whose variable does not exist.
func checkLinkerFlags(t *testing.T, goBuild, pkg string) {
	t.Helper()
	vars := map[string]bool{}
	fset := token.NewFileSet()
	dir := filepath.Join(repoRoot, pkg)
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				for _, name := range spec.(*ast.ValueSpec).Names {
					vars[name.Name] = true
				}
			}
		}
	}
	for _, m := range regexp.MustCompile(`-X main\.([A-Za-z_][A-Za-z0-9_]*)=`).FindAllStringSubmatch(goBuild, -1) {
		if !vars[m[1]] {
			t.Errorf("-X main.%s: %s has no package-level variable %s", m[1], pkg, m[1])
		}
	}
}

// TestDockerIgnore checks each Dockerfile's ignore file (BuildKit reads
// <Dockerfile>.dockerignore next to the Dockerfile): it leaves out the
// bulky and built directories, and keeps every Go file and embedded file
// the binary is built from.
func TestDockerIgnore(t *testing.T) {
	for _, img := range images {
		t.Run(img.dockerfile, func(t *testing.T) {
			data, err := os.ReadFile(img.dockerfile + ".dockerignore")
			if err != nil {
				t.Fatal(err)
			}
			var patterns []string
			for line := range strings.SplitSeq(string(data), "\n") {
				if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
					patterns = append(patterns, line)
				}
			}
			for _, must := range []string{".git", ".venv", "bin"} {
				if !slices.Contains(patterns, must) {
					t.Errorf("%s is not ignored", must)
				}
			}
			for _, f := range sourceFiles(t, img.pkg) {
				for _, p := range patterns {
					if ignored(p, f) {
						t.Errorf("%s is ignored by %q but the build needs it", f, p)
					}
				}
			}
		})
	}
}

// ignored reports whether the .dockerignore pattern p excludes path (slash
// separated, relative to the context): a plain pattern excludes that path and
// everything under it; a "**/" pattern matches the base name anywhere.
func ignored(p, path string) bool {
	if base, ok := strings.CutPrefix(p, "**/"); ok {
		m, _ := filepath.Match(base, filepath.Base(path))
		return m
	}
	for dir := path; dir != "." && dir != "/"; dir = filepath.Dir(dir) {
		if m, _ := filepath.Match(p, dir); m {
			return true
		}
	}
	return false
}

// sourceFiles lists, relative to the repository root, the Go and embedded
// files of pkg and of every package of this module it imports.
func sourceFiles(t *testing.T, pkg string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json=Dir,Module,GoFiles,EmbedFiles", pkg)
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			Dir                 string
			Module              *struct{ Main bool }
			GoFiles, EmbedFiles []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.Module == nil || !p.Module.Main {
			continue
		}
		rel, err := filepath.Rel(root, p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range append(p.GoFiles, p.EmbedFiles...) {
			files = append(files, filepath.ToSlash(filepath.Join(rel, f)))
		}
	}
	if len(files) == 0 {
		t.Fatalf("go list found no source files of %s", pkg)
	}
	return files
}

func TestIgnored(t *testing.T) {
	for _, c := range []struct {
		pattern, path string
		want          bool
	}{
		{"docs", "docs/design.md", true},
		{"docs", "cmd/docs/x.go", false},
		{"deploy", "deploy/compose/compose.yaml", true},
		{"bin", "bin", true},
		{"**/*_test.go", "scheduler/pick_test.go", true},
		{"**/*_test.go", "scheduler/pick.go", false},
		{"*.test", "duet.test", true},
		{"e2e/bench", "e2e/sim/engine.go", false},
	} {
		if got := ignored(c.pattern, c.path); got != c.want {
			t.Errorf("ignored(%q, %q) = %v, want %v", c.pattern, c.path, got, c.want)
		}
	}
}

// TestBuildCommand runs each Dockerfile's `go build` command, as written
// (with its build arguments set), on a copy of the build context filtered
// by the ignore file, and checks that the binary is static (no ELF
// interpreter, so it runs on any base image) and, for duet, that
// `duet version` reports the version and commit given as build arguments.
func TestBuildCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	const version, commit = "v9.9.9-test", "0123456789abcdef0123456789abcdef01234567"
	for _, img := range images {
		t.Run(img.dockerfile, func(t *testing.T) {
			_, st := stages(t, parse(t, img.dockerfile))
			var script string
			for _, in := range st[0].body {
				if in.cmd == "run" && strings.Contains(strings.Join(in.args, " "), "go build") {
					script = strings.Join(in.args, " ")
				}
			}
			if script == "" {
				t.Fatal("no go build in the build stage")
			}
			src := filepath.Join(t.TempDir(), "src")
			copyContext(t, img.dockerfile+".dockerignore", src)
			out := filepath.Join(t.TempDir(), "out")
			script = strings.ReplaceAll(script, "/out/", out+"/")
			cmd := exec.Command("sh", "-c", script)
			cmd.Dir = src
			cmd.Env = append(os.Environ(), "VERSION="+version, "COMMIT="+commit, "GOFLAGS=-mod=readonly")
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", script, err, b)
			}
			bin := filepath.Join(out, img.binary)
			f, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
					t.Errorf("%s is dynamically linked (program header %v)", img.binary, p.Type)
				}
			}
			if img.binary != "duet" {
				return
			}
			got, err := exec.Command(bin, "version").Output()
			if err != nil {
				t.Fatalf("duet version: %v", err)
			}
			if want := "duet " + version + " commit " + commit + " "; !strings.HasPrefix(string(got), want) {
				t.Errorf("duet version = %q, want it to start with %q", got, want)
			}
		})
	}
}

// copyContext copies the repository into dst, leaving out what the ignore
// file at ignorePath excludes, as the Docker client does with the context.
func copyContext(t *testing.T, ignorePath, dst string) {
	t.Helper()
	data, err := os.ReadFile(ignorePath)
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for line := range strings.SplitSeq(string(data), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, line)
		}
	}
	err = filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(repoRoot, path)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		for _, p := range patterns {
			if ignored(p, rel) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		t.Fatalf("copy the build context: %v", err)
	}
}
