package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

// Without the binary, an untagged build still reaches for the child
// process (never the library, which it does not link), and says what to
// install with an error no retry mends.
func TestWithoutTheBinary(t *testing.T) {
	ctx := context.Background()
	_, err := open(ctx, filepath.Join(t.TempDir(), "cocoon-fixup"))
	if !errors.Is(err, cocoonfixup.ErrConfig) || errors.Is(err, cocoonfixup.ErrRetryable) {
		t.Fatalf("not a permanent ErrConfig: %v", err)
	}
	if !strings.Contains(err.Error(), "install cocoon-fixup "+cocoonfixup.Version) {
		t.Fatalf("the error does not say what to install: %v", err)
	}
	_, err = cocoonfixup.NewPlanner(ctx, cocoonfixup.Options{Backend: cocoonfixup.BackendLinked})
	if !errors.Is(err, cocoonfixup.ErrConfig) || !strings.Contains(err.Error(), "-tags cocoonfixup_linked") {
		t.Fatalf("BackendLinked in an untagged build: %v", err)
	}
}

// With the binary (COCOON_FIXUP_BIN), BackendAuto is the child process and
// it serves.
func TestWithTheBinary(t *testing.T) {
	bin := os.Getenv("COCOON_FIXUP_BIN")
	if bin == "" {
		t.Skip("COCOON_FIXUP_BIN is not set: `cargo build -p fixup-host --bin cocoon-fixup` and set it to target/debug/cocoon-fixup")
	}
	ctx := context.Background()
	p, err := open(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Backend() != cocoonfixup.BackendProcess {
		t.Fatalf("BackendAuto reached %s in an untagged build", p.Backend())
	}
	if w := p.Warnings(); len(w) != 0 {
		t.Fatalf("warnings: %q", w)
	}
	out, err := handle(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if out.Action != cocoonfixup.HandledNothing || out.HandsOff != cocoonfixup.HandsOffNotManaged {
		t.Fatalf("a plain pod's step: %+v", out)
	}
}
