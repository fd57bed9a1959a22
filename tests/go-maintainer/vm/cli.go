package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"syscall"
)

// CLI is the Runtime that runs the cocoon binary.
type CLI struct {
	Binary string
}

var _ Runtime = CLI{}

// ExitError is a command that ran and exited non-zero. ExitStatus is -1
// when a signal ended it; Unwrap then reaches the *exec.ExitError that
// says which.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Code < 0 {
		return fmt.Sprintf("command ended: %v", e.Err)
	}
	return fmt.Sprintf("command exited with status %d", e.Code)
}

// ExitStatus is the command's exit status.
func (e *ExitError) ExitStatus() int { return e.Code }

// Exited is true: the command ran.
func (e *ExitError) Exited() bool { return true }

func (e *ExitError) Unwrap() error { return e.Err }

// inspected is what `cocoon vm inspect --json` prints, the fields the
// runtime reads.
type inspected struct {
	ID         string `json:"id"`
	Hypervisor string `json:"hypervisor"`
	State      string `json:"state"`
	PID        int    `json:"pid"`
	Config     struct {
		Name   string `json:"name"`
		CPU    int    `json:"cpu"`
		Memory int64  `json:"memory"`
	} `json:"config"`
	NetworkConfigs []struct {
		Tap       string `json:"tap"`
		MAC       string `json:"mac"`
		NetNSPath string `json:"netns_path"`
		Network   *struct {
			IP      string `json:"ip"`
			Gateway string `json:"gateway"`
			Prefix  int    `json:"prefix"`
		} `json:"network"`
	} `json:"network_configs"`
}

// Inspect runs `cocoon vm inspect --json <id>`.
func (c CLI) Inspect(ctx context.Context, vmID string) (*VM, error) {
	var stdout, stderr bytes.Buffer
	if err := c.run(ctx, []string{"vm", "inspect", "--json", vmID}, nil, &stdout, &stderr); err != nil {
		said := strings.TrimSpace(stderr.String())
		var exit *ExitError
		if errors.As(err, &exit) && notFound(said, vmID) {
			return nil, fmt.Errorf("cocoon vm inspect %s: %w: %s", vmID, ErrVMNotFound, said)
		}
		return nil, fmt.Errorf("cocoon vm inspect %s: %w: %s", vmID, err, said)
	}
	var d inspected
	if err := json.Unmarshal(stdout.Bytes(), &d); err != nil {
		return nil, fmt.Errorf("cocoon vm inspect %s: reading its output: %w", vmID, err)
	}
	v := &VM{ID: d.ID, Name: d.Config.Name, Hypervisor: d.Hypervisor, State: d.State, CPU: d.Config.CPU, Mem: d.Config.Memory, PID: d.PID}
	for _, n := range d.NetworkConfigs {
		nc := &NetworkConfig{Tap: n.Tap, MAC: n.MAC, NetNSPath: n.NetNSPath}
		if n.Network != nil {
			nc.Network = &NetworkInfo{IP: n.Network.IP, Gateway: n.Network.Gateway, Prefix: n.Network.Prefix}
		}
		v.NetworkConfigs = append(v.NetworkConfigs, nc)
	}
	if len(v.NetworkConfigs) > 0 {
		v.MAC = v.NetworkConfigs[0].MAC
		if v.NetworkConfigs[0].Network != nil {
			v.IP = v.NetworkConfigs[0].Network.IP
		}
	}
	return v, nil
}

// notFound is whether cocoon's error says the VM does not exist; other
// failures (a missing binary, a refused sudo) say nothing about the VM.
func notFound(stderr, vmID string) bool {
	s := strings.ToLower(stderr)
	return strings.Contains(s, "vm not found") || strings.Contains(s, "no such vm") ||
		strings.Contains(s, "vm "+strings.ToLower(vmID)+" not found")
}

// Exec runs `cocoon vm exec <id> -- argv...`. The CLI takes no
// environment of its own: env is set in the guest by `env K=V ...`
// before argv, keys sorted.
func (c CLI) Exec(ctx context.Context, vmID string, argv []string, env map[string]string, stdin io.Reader, stdout, stderr io.Writer) error {
	args := []string{"vm", "exec", vmID, "--"}
	if len(env) > 0 {
		keys := make([]string, 0, len(env))
		for k := range env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		args = append(args, "env")
		for _, k := range keys {
			args = append(args, k+"="+env[k])
		}
	}
	args = append(args, argv...)
	if err := c.run(ctx, args, stdin, stdout, stderr); err != nil {
		return fmt.Errorf("cocoon vm exec %s: %w", vmID, err)
	}
	return nil
}

// run runs cocoon with args in a process group of its own, killed whole
// when ctx ends, so that no grandchild outlives the call.
func (c CLI) run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	cmd := exec.Command(c.Binary, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	waited := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		case <-waited:
		}
	}()
	err := cmd.Wait()
	close(waited)
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return &ExitError{Code: exit.ExitCode(), Err: exit}
	}
	return err
}
