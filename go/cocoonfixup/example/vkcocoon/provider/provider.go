// Package provider is the example's virtual-kubelet provider, the part
// that owns the post-clone step, shaped as vk-cocoon's: CreatePod starts
// the step in a goroutine per pod, DeletePod and a hibernation cancel it
// (the pod's `running` stays for later, nothing is marked failed), and
// the start of the provider resumes work it finds `running`. Run does the
// whole step and, when it stops, says when and how to try again; the
// provider only owns its goroutines and timers and hands Run its cocoon
// and its Kubernetes client. The example's command runs it over
// stand-ins, and the client-go adapter's tests
// (go/cocoonfixup/kubeclient) run it against a real API server.
package provider

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

// Provider is the part of a virtual-kubelet provider that owns the
// post-clone step: one goroutine per pod, cancelled on delete and
// hibernation.
type Provider struct {
	Planner  *cocoonfixup.Planner
	Cocoon   cocoonfixup.VM
	API      cocoonfixup.Pods
	Leases   cocoonfixup.Leases
	Settings cocoonfixup.Settings
	// Records keeps each pod's record (its retry budget) across retries
	// and restarts; Admission bounds the pods worked on at once.
	Records   cocoonfixup.Records
	Admission *cocoonfixup.Admission
	// Done receives each pod's outcome (or error) when its step ends.
	Done func(pod string, out *cocoonfixup.Outcome, err error)

	mu        sync.Mutex
	running   map[string]context.CancelFunc // by pod uid
	watched   map[string]bool               // by pod uid: what Observe last said
	observing map[string]int                // by pod uid: ObservePod calls under way
	deleted   map[string]bool               // by pod uid: deleted while observed
	wg        sync.WaitGroup
}

// Meta is what the provider reads of a pod's JSON.
type Meta struct {
	Metadata cocoonfixup.PodMeta `json:"metadata"`
}

// CreatePod is called once the pod's VM is cloned and started: the step
// runs in the background.
func (p *Provider) CreatePod(pod []byte) error {
	return p.start(pod, cocoonfixup.TriggerEvent)
}

func (p *Provider) start(pod []byte, trigger cocoonfixup.Trigger) error {
	var m Meta
	if err := json.Unmarshal(pod, &m); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.mu.Lock()
	if p.running == nil {
		p.running = map[string]context.CancelFunc{}
	}
	if _, busy := p.running[m.Metadata.UID]; busy {
		p.mu.Unlock()
		cancel()
		return nil
	}
	p.running[m.Metadata.UID] = cancel
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer func() {
			p.mu.Lock()
			delete(p.running, m.Metadata.UID)
			p.mu.Unlock()
			cancel()
		}()
		var out *cocoonfixup.Outcome
		var err error
		tries := 0
		for {
			p.mu.Lock()
			watched := p.watched[m.Metadata.UID]
			p.mu.Unlock()
			out, err = p.Planner.Run(ctx, pod, p.Cocoon, p.API, cocoonfixup.RunOptions{
				Trigger: trigger, Tries: tries, Leases: p.Leases, Settings: p.Settings,
				Records: p.Records, Admission: p.Admission, WatchedSinceNew: watched,
			})
			// The step stopped before it could decide (a cocoon or API
			// error): the library says when and how to try again, and
			// the provider only waits, until the pod is deleted. Any
			// other end, a stop not to be tried again among them, is
			// the step's last word until the pod's next CreatePod or the
			// provider's next start.
			var stop *cocoonfixup.StopError
			if !errors.As(err, &stop) || stop.Again == nil {
				break
			}
			wait := time.NewTimer(stop.Again.After)
			select {
			case <-wait.C:
			case <-ctx.Done():
				wait.Stop()
			}
			if ctx.Err() != nil {
				break
			}
			now, gerr := p.API.Get(ctx, m.Metadata.Namespace, m.Metadata.Name)
			if gerr == nil {
				// Gone, or another pod of the name (its own CreatePod
				// runs its step): this one is over.
				var again Meta
				if now == nil || json.Unmarshal(now, &again) != nil || again.Metadata.UID != m.Metadata.UID {
					break
				}
				pod = now
			}
			trigger, tries = stop.Again.Trigger, stop.Again.Tries
		}
		if p.Done != nil {
			p.Done(m.Metadata.Namespace+"/"+m.Metadata.Name, out, err)
		}
	}()
	return nil
}

// ObservePod is called for every pod the provider's watch sees: each pod
// of a list or re-list (live false) and each watch event but a deletion
// (live true), in order. The pod's record notes a hibernation, so the VM that comes after
// it is a wake for the step (no PnP for a Cloud Hypervisor Windows VM),
// with no event needed.
func (p *Provider) ObservePod(ctx context.Context, pod []byte, live bool) error {
	if p.Records == nil {
		return nil
	}
	var m Meta
	if err := json.Unmarshal(pod, &m); err != nil {
		return err
	}
	uid := m.Metadata.UID
	p.mu.Lock()
	watched := p.watched[uid]
	if p.observing == nil {
		p.observing, p.deleted = map[string]int{}, map[string]bool{}
	}
	p.observing[uid]++
	p.mu.Unlock()
	watched, err := p.Planner.Observe(ctx, pod, p.Records, cocoonfixup.ObserveOptions{Live: live, WatchedSinceNew: watched})
	p.mu.Lock()
	defer p.mu.Unlock()
	p.observing[uid]--
	gone := p.deleted[uid]
	if p.observing[uid] == 0 {
		delete(p.observing, uid)
		delete(p.deleted, uid)
	}
	// A pod deleted while its Observe ran keeps no entry.
	if !gone {
		if p.watched == nil {
			p.watched = map[string]bool{}
		}
		p.watched[uid] = watched
	}
	return err
}

// PrepareParent prepares a CocoonSet's parent before its snapshot is
// taken: its VM is made safe to clone (network files that match any
// virtio NIC, a DHCP client identity from the MAC), and the pod says by
// which plugin. The clones made from the snapshot get the parent's
// vm.cocoonstack.io/prepared annotation from CloneAnnotations.
func (p *Provider) PrepareParent(ctx context.Context, pod []byte) (*cocoonfixup.Outcome, error) {
	return p.Planner.Prepare(ctx, pod, p.Cocoon, p.API, cocoonfixup.RunOptions{Settings: p.Settings})
}

// CloneAnnotations are the annotations a clone of parent carries on from
// it (set them on the clone's pod when it is made): the preparation.
func CloneAnnotations(parent []byte) (map[string]string, error) {
	var m Meta
	if err := json.Unmarshal(parent, &m); err != nil {
		return nil, err
	}
	out := map[string]string{}
	if v := m.Metadata.Annotations[cocoonfixup.KeyPrepared]; v != "" {
		out[cocoonfixup.KeyPrepared] = v
	}
	return out, nil
}

// DeletePod stops the pod's step, if one runs: its context is cancelled,
// so the action under way is abandoned and nothing more is written.
func (p *Provider) DeletePod(uid string) {
	p.stop(uid, true)
}

// Hibernate is the stack asking for the pod's VM to hibernate: the step
// stops as on delete (the library also leaves a pod whose hibernation is
// requested alone when it reads it); the pod is still watched.
func (p *Provider) Hibernate(uid string) { p.stop(uid, false) }

func (p *Provider) stop(uid string, gone bool) {
	p.mu.Lock()
	cancel := p.running[uid]
	if gone {
		delete(p.watched, uid)
		if p.observing[uid] > 0 {
			p.deleted[uid] = true
		}
	}
	p.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// Reconcile is the provider's start: every pod on the node is handed to
// Run with TriggerStartup, and the library decides (work left `running`
// resumes with ResumedAfterRestart, an IP wait left behind is waited
// again, a pod already ready or not a clone is left alone).
func (p *Provider) Reconcile(pods [][]byte) error {
	for _, pod := range pods {
		if err := p.start(pod, cocoonfixup.TriggerStartup); err != nil {
			return err
		}
	}
	return nil
}

// Wait waits for every step to end.
func (p *Provider) Wait() { p.wg.Wait() }

// Records keeps the pods' records in memory (a provider keeps them in a
// file per uid on the node, writable by it alone, to outlive its
// restarts: a record can start work, such as a wake's, so nobody else
// may write it; not in a ConfigMap others can edit).
type Records struct {
	mu sync.Mutex
	m  map[string]json.RawMessage
}

// Load is the record kept for uid.
func (r *Records) Load(ctx context.Context, uid string) (json.RawMessage, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[uid], nil
}

// Store keeps uid's record.
func (r *Records) Store(ctx context.Context, uid string, record json.RawMessage) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]json.RawMessage{}
	}
	r.m[uid] = append(json.RawMessage(nil), record...)
	return nil
}
