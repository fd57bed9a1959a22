package cocoonfixup

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// script writes an executable shell script standing in for cocoon-fixup.
func script(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cocoon-fixup")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// A node or build that cannot serve is ErrConfig, says what to install or
// build, and is not retryable: a caller that retries ErrRetryable stops.
// A child that a busy node did not start in time, or that was killed from
// outside before it answered, is ErrUnavailable: tried again.
func TestSetupErrorsArePermanent(t *testing.T) {
	saved := handshakeTimeout
	handshakeTimeout = 2 * time.Second
	defer func() { handshakeTimeout = saved }()
	cases := []struct {
		name string
		o    Options
		says []string
	}{
		{"silent (retryable)", Options{Backend: BackendProcess, Binary: script(t, "exec sleep 60\n")},
			[]string{"did not answer in 2s"}},
		// A wrapper that does not exec leaves its child holding the pipes:
		// the wait for it is bounded all the same.
		{"wrapper without exec (retryable)", Options{Backend: BackendProcess, Binary: script(t, "sleep 60\n")},
			[]string{"did not answer in 2s"}},
		{"killed (retryable)", Options{Backend: BackendProcess, Binary: script(t, "kill -KILL $$\n")},
			[]string{"was killed before it answered"}},
		{"missing", Options{Backend: BackendProcess, Binary: filepath.Join(t.TempDir(), "cocoon-fixup")},
			[]string{"was not found", "install cocoon-fixup " + Version, "COCOON_FIXUP_BIN"}},
		{"exits", Options{Backend: BackendProcess, Binary: script(t, "echo 'no such subcommand' >&2\nexit 2\n")},
			[]string{"did not answer", "no such subcommand", "install cocoon-fixup " + Version}},
		{"another ABI", Options{Backend: BackendProcess, Binary: script(t, "read -r line\necho '{\"id\":1,\"ok\":{\"abi\":3,\"version\":\"0.0.1\"}}'\nexec cat >/dev/null\n")},
			[]string{`speaks ABI version 3 (release "0.0.1")`, fmt.Sprintf("needs ABI version %d", abiVersion), "install cocoon-fixup " + Version}},
	}
	if !haveLibrary {
		cases = append(cases, struct {
			name string
			o    Options
			says []string
		}{"linked without the tag", Options{Backend: BackendLinked}, []string{"-tags cocoonfixup_linked", "-tags cocoonfixup_dynamic"}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := NewPlanner(ctx, c.o)
			if err == nil {
				p.Close()
				t.Fatal("NewPlanner served")
			}
			if strings.HasSuffix(c.name, "(retryable)") {
				if errors.Is(err, ErrConfig) || !errors.Is(err, ErrRetryable) || !errors.Is(err, ErrUnavailable) {
					t.Fatalf("not a retryable ErrUnavailable: %v", err)
				}
			} else if !errors.Is(err, ErrConfig) || errors.Is(err, ErrRetryable) || errors.Is(err, ErrUnavailable) {
				t.Fatalf("not a permanent ErrConfig: %v", err)
			}
			for _, want := range c.says {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q: %v", want, err)
				}
			}
		})
	}
}

// BackendAuto is the child process unless the build links the library,
// and the library is the package's release: no warning.
func TestAutoIsTheBuildsBackend(t *testing.T) {
	p, err := NewPlanner(ctx, Options{Binary: cli(t), NoPluginDir: true, NoCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	want := BackendProcess
	if haveLibrary {
		want = BackendLinked
	}
	if p.Backend() != want {
		t.Fatalf("BackendAuto reached %s, this build's is %s", p.Backend(), want)
	}
	for _, w := range p.Warnings() {
		if strings.Contains(w, "release") {
			t.Fatalf("a warning about the release: %s", w)
		}
	}
}

// A child of another release with the same ABI serves, with a warning in
// Warnings and to Options.Log.
func TestAnotherReleaseWarns(t *testing.T) {
	bin := script(t, "read -r line\necho '{\"id\":1,\"ok\":{\"abi\":"+strconv.Itoa(abiVersion)+",\"version\":\"0.0.0-other\"}}'\nexec '"+cli(t)+"' embed\n")
	var heard []string
	p, err := NewPlanner(ctx, Options{Backend: BackendProcess, Binary: bin, NoPluginDir: true, NoCache: true,
		CocoonRoot: filepath.Join(root, "examples", "cocoon-root"),
		Log:        func(level, message string) { heard = append(heard, level+": "+message) }})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	want := `the cocoon-fixup binary is release "0.0.0-other" and this package release ` + Version
	found := false
	for _, w := range p.Warnings() {
		found = found || strings.Contains(w, want)
	}
	if !found {
		t.Fatalf("no warning %q in %q", want, p.Warnings())
	}
	if len(heard) != 1 || !strings.HasPrefix(heard[0], "warn: "+want) {
		t.Fatalf("Options.Log heard %q", heard)
	}
	pod := read(t, filepath.Join(root, "examples", "no-fixup", "pod.json"))
	vm := read(t, filepath.Join(root, "examples", "no-fixup", "vm.json"))
	if r, err := p.Plan(ctx, pod, vm, Overrides{}); err != nil || r.NeedsFixup {
		t.Fatalf("the planner does not serve: %+v %v", r, err)
	}
}

// Version is the workspace's version (Cargo.toml), which the library
// reports.
func TestVersionIsTheWorkspaces(t *testing.T) {
	f, err := os.Open(filepath.Join(root, "Cargo.toml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	section, version := "", ""
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		line := strings.TrimSpace(lines.Text())
		if strings.HasPrefix(line, "[") {
			section = line
		} else if section == "[workspace.package]" && strings.HasPrefix(line, "version") {
			version = strings.Trim(strings.TrimSpace(strings.SplitN(line, "=", 2)[1]), `"`)
		}
	}
	if version == "" {
		t.Fatal("Cargo.toml has no [workspace.package] version")
	}
	if version != Version {
		t.Fatalf("Version is %q, the workspace's version %q: keep them equal", Version, version)
	}
}
