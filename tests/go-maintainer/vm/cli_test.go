package vm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// script is a stand-in cocoon: a shell script in a test directory.
func script(t *testing.T, body string) CLI {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cocoon")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return CLI{Binary: path}
}

func TestInspectGivesTheTypedVM(t *testing.T) {
	c := script(t, `[ "$1 $2 $3 $4" = "vm inspect --json vm-1" ] || exit 9
echo '{"id":"vm-1","hypervisor":"firecracker","state":"running","pid":7,"created_at":"2025-01-01T00:00:00Z",
 "config":{"name":"vk-a","image":"ghcr.io/x/y:1","cpu":2,"memory":1024},
 "network_configs":[{"tap":"tap0","mac":"52:54:00:00:00:01","network":{"ip":"10.0.0.5","prefix":24,"gateway":"10.0.0.1"}},{"tap":"tap1","mac":"52:54:00:00:00:02"}]}'`)
	v, err := c.Inspect(context.Background(), "vm-1")
	if err != nil {
		t.Fatal(err)
	}
	if v.Name != "vk-a" || v.Hypervisor != "firecracker" || v.IP != "10.0.0.5" || v.MAC != "52:54:00:00:00:01" || v.CPU != 2 || v.Mem != 1024 || v.PID != 7 {
		t.Fatalf("%+v", v)
	}
	if len(v.NetworkConfigs) != 2 || v.NetworkConfigs[1].Network != nil || v.NetworkConfigs[0].Network.Prefix != 24 {
		t.Fatalf("%+v", v.NetworkConfigs)
	}
}

func TestInspectOfAVMThatIsNotThere(t *testing.T) {
	c := script(t, `echo "Error: vm $4 not found" >&2; exit 1`)
	_, err := c.Inspect(context.Background(), "vm-1")
	if !errors.Is(err, ErrVMNotFound) {
		t.Fatalf("%v, want ErrVMNotFound", err)
	}
	c = script(t, `echo "sudo: a password is required" >&2; exit 1`)
	_, err = c.Inspect(context.Background(), "vm-1")
	if err == nil || errors.Is(err, ErrVMNotFound) {
		t.Fatalf("%v, want another error", err)
	}
}

func TestExecStreamsAndReportsTheExit(t *testing.T) {
	c := script(t, `shift 4; echo "out:$*"; echo err >&2; exit 3`)
	var stdout, stderr bytes.Buffer
	err := c.Exec(context.Background(), "vm-1", []string{"sh", "-c", "x"}, map[string]string{"B": "2", "A": "1"}, nil, &stdout, &stderr)
	var exit interface{ ExitStatus() int }
	if !errors.As(err, &exit) || exit.ExitStatus() != 3 {
		t.Fatalf("%v, want exit status 3", err)
	}
	if got := stdout.String(); got != "out:env A=1 B=2 sh -c x\n" || stderr.String() != "err\n" {
		t.Fatalf("stdout %q stderr %q", got, stderr.String())
	}
}

func TestExecEndsWithItsContextAndLeavesNoChild(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	c := script(t, `sleep 1000 & echo $! > `+pidFile+`; wait`)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := c.Exec(ctx, "vm-1", []string{"true"}, nil, nil, &bytes.Buffer{}, &bytes.Buffer{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v, want the deadline", err)
	}
	pid, _ := os.ReadFile(pidFile)
	stat, err := os.ReadFile("/proc/" + strings.TrimSpace(string(pid)) + "/stat")
	if err == nil && !strings.Contains(string(stat), ") Z") {
		t.Fatalf("the guest's sleep outlived the exec: %s", stat)
	}
}
