// Package provider is the program's provider over cocoonfixup: it
// adapts its own runtime to the package, owns the lifecycle keys through
// its intent table, and runs the post-clone step for a pod it has just
// booted and, after its own restart, for every pod on its node: the
// library decides which have work.
package provider

import (
	"context"
	"errors"
	"fmt"
	"io"

	"example.com/maintainer/vm"
	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

// Provider runs the post-clone step.
type Provider struct {
	Planner   *cocoonfixup.Planner
	Runtime   vm.Runtime
	API       *APIServer
	Lifecycle *Lifecycle
	Settings  cocoonfixup.Settings
	// Records keeps the pods' records across the provider's restarts
	// (nil: none).
	Records cocoonfixup.Records
	// SourceImage is the source image of the snapshot the provider
	// clones from, as `cocoon snapshot inspect` tells it; "" when it
	// does not know.
	SourceImage string
	Log         func(level, message string)
}

// Guest is the runtime as the package's VM: exec streams through
// Runtime.Exec, and the record is the typed VM with only what it has.
func (p *Provider) Guest() cocoonfixup.StreamVM {
	return cocoonfixup.StreamVM{
		Stream: func(ctx context.Context, id string, argv []string, stdout, stderr io.Writer) error {
			return p.Runtime.Exec(ctx, id, argv, nil, nil, stdout, stderr)
		},
		Record: func(ctx context.Context, id string) (*cocoonfixup.VMRecord, error) {
			v, err := p.Runtime.Inspect(ctx, id)
			if errors.Is(err, vm.ErrVMNotFound) {
				return nil, vmGone{err}
			}
			if err != nil {
				return nil, err
			}
			return Record(v), nil
		},
	}
}

// Record is the typed VM as the package's record. The VM has no image
// and no creation time, so the record has neither: the step never
// guesses them.
func Record(v *vm.VM) *cocoonfixup.VMRecord {
	r := &cocoonfixup.VMRecord{ID: v.ID, Config: cocoonfixup.VMConfig{Name: v.Name}, NetworkConfigs: []cocoonfixup.VMNetwork{}}
	for _, nc := range v.NetworkConfigs {
		if nc == nil {
			continue
		}
		n := cocoonfixup.VMNetwork{MAC: nc.MAC, Tap: nc.Tap}
		if nc.Network != nil {
			n.Network = &cocoonfixup.StaticNet{IP: nc.Network.IP, Prefix: nc.Network.Prefix, Gateway: nc.Network.Gateway}
		}
		r.NetworkConfigs = append(r.NetworkConfigs, n)
	}
	return r
}

// vmGone is the runtime's not-found as the package's ErrVMGone, keeping
// the runtime's error.
type vmGone struct{ err error }

func (g vmGone) Error() string        { return g.err.Error() }
func (g vmGone) Unwrap() error        { return g.err }
func (g vmGone) Is(target error) bool { return target == cocoonfixup.ErrVMGone }

func (p *Provider) options(trigger cocoonfixup.Trigger, boot cocoonfixup.Boot) cocoonfixup.RunOptions {
	return cocoonfixup.RunOptions{
		Trigger: trigger, Settings: p.Settings, Log: p.Log, Records: p.Records,
		Lifecycle: p.Lifecycle, Boot: boot, SourceImage: p.SourceImage,
	}
}

// PostClone runs the step for a pod whose VM the provider has just
// booted; boot says how.
func (p *Provider) PostClone(ctx context.Context, pod []byte, boot cocoonfixup.Boot) (*cocoonfixup.Outcome, error) {
	return p.Planner.Run(ctx, pod, p.Guest(), p.API, p.options(cocoonfixup.TriggerEvent, boot))
}

// Result is how the step ended for one pod of StartupReconcile.
type Result struct {
	Namespace string
	Name      string
	Outcome   *cocoonfixup.Outcome
	Err       error
}

// StartupReconcile is the provider's start: every pod on its node is
// handed to Run with TriggerStartup, its VM found running (BootResume),
// one after another, and the library decides what each needs. The
// results are the pods it had work for: those it left alone or found
// parked are not listed.
func (p *Provider) StartupReconcile(ctx context.Context) ([]Result, error) {
	pods, err := p.API.NodePods(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the node's pods: %w", err)
	}
	var results []Result
	for _, pod := range pods {
		m, err := metaOf(pod)
		if err != nil {
			return results, fmt.Errorf("reading a listed pod: %w", err)
		}
		r := Result{Namespace: m.Metadata.Namespace, Name: m.Metadata.Name}
		r.Outcome, r.Err = p.Planner.Run(ctx, pod, p.Guest(), p.API, p.options(cocoonfixup.TriggerStartup, cocoonfixup.BootResume))
		if r.Err == nil && (r.Outcome.Action == cocoonfixup.HandledNothing || r.Outcome.Action == cocoonfixup.HandledParked) {
			continue
		}
		results = append(results, r)
	}
	return results, nil
}
