// Package vm is the program's own view of cocoon, shaped as a
// virtual-kubelet provider's runtime is: a typed VM from `cocoon vm
// inspect`, and an exec that streams the command's output and reports a
// non-zero exit as an error carrying its code. It knows nothing of
// cocoonfixup.
package vm

import (
	"context"
	"errors"
	"io"
)

// ErrVMNotFound is returned wrapped when cocoon says the VM does not
// exist. Any other error of Inspect leaves open whether it does.
var ErrVMNotFound = errors.New("vm not found")

// NetworkInfo is a NIC's static address; nil for a DHCP NIC.
type NetworkInfo struct {
	IP      string
	Gateway string
	Prefix  int
}

// NetworkConfig is one NIC of the VM.
type NetworkConfig struct {
	Tap       string
	MAC       string
	NetNSPath string
	Network   *NetworkInfo
}

// VM is the runtime's view of a cocoon VM. It has no image and no
// creation time: the runtime does not read them.
type VM struct {
	ID         string
	Name       string
	Hypervisor string
	State      string
	// IP and MAC are the first NIC's.
	IP             string
	MAC            string
	CPU            int
	Mem            int64
	PID            int
	NetworkConfigs []*NetworkConfig
}

// Runtime drives cocoon.
type Runtime interface {
	// Inspect returns the VM; an error wrapping ErrVMNotFound when cocoon
	// says there is no such VM.
	Inspect(ctx context.Context, vmID string) (*VM, error)
	// Exec runs argv in the VM with env set, stdin (nil: none) as its
	// input, writing its standard output and error to stdout and stderr,
	// until ctx ends. A command that ran and exited non-zero is an
	// *ExitError.
	Exec(ctx context.Context, vmID string, argv []string, env map[string]string, stdin io.Reader, stdout, stderr io.Writer) error
}
