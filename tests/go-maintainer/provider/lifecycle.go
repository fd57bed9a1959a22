package provider

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

// PodStatus is the status the provider publishes for a pod when its
// lifecycle changes: the pod IP and the Ready condition, with the
// lifecycle state as the condition's reason.
type PodStatus struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	Phase     string `json:"phase"`
	PodIP     string `json:"podIP,omitempty"`
	Ready     bool   `json:"ready"`
	Reason    string `json:"reason,omitempty"`
	Message   string `json:"message,omitempty"`
}

// StatusPublisher publishes a pod's status (a virtual kubelet's
// UpdatePodStatus).
type StatusPublisher interface {
	PublishStatus(ctx context.Context, s PodStatus) error
}

// PodWriter reads a pod and merge-patches its annotations, with the
// errors cocoonfixup.Pods gives.
type PodWriter interface {
	Get(ctx context.Context, namespace, name string) ([]byte, error)
	PatchAnnotations(ctx context.Context, namespace, name string, p cocoonfixup.PodPatch) ([]byte, error)
}

// Lifecycle is the provider's table of lifecycle intents, the owner of
// the lifecycle keys (cocoonfixup.RunOptions.Lifecycle). Per pod it keeps
// the latest intent: the state with its message and the generation it
// was decided for, and the latest IP. Failed is sticky within a
// generation: a later ready or hibernated intent for the same generation
// publishes its IP only. Publishing writes the pod's status first, then
// the lifecycle annotations (uid precondition only).
type Lifecycle struct {
	Pods   PodWriter
	Status StatusPublisher

	mu      sync.Mutex
	entries map[string]*intentEntry // by pod uid
}

var _ cocoonfixup.LifecycleOwner = (*Lifecycle)(nil)

type intentEntry struct {
	// mu is held while the entry changes or is published.
	mu  sync.Mutex
	pod cocoonfixup.PodRef
	// intent is what the pod should show.
	intent cocoonfixup.LifecycleIntent
	// failedIn is the generation a failed state was decided for.
	failedIn string
	// status is the status last published, nil for none.
	status *PodStatus
	// annotated: the intent's annotations were written since it last
	// changed.
	annotated bool
	dropped   bool
}

// Publish takes the intent into the table and publishes it.
func (l *Lifecycle) Publish(ctx context.Context, pod cocoonfixup.PodRef, in cocoonfixup.LifecycleIntent) error {
	e := l.entry(pod)
	e.mu.Lock()
	defer e.mu.Unlock()
	write := e.take(in)
	return l.publish(ctx, e, write.Patch())
}

func (l *Lifecycle) entry(pod cocoonfixup.PodRef) *intentEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.entries == nil {
		l.entries = map[string]*intentEntry{}
	}
	e, ok := l.entries[pod.UID]
	if !ok || e.pod != pod {
		e = &intentEntry{pod: pod}
		l.entries[pod.UID] = e
	}
	return e
}

func (l *Lifecycle) drop(e *intentEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.dropped = true
	if l.entries[e.pod.UID] == e {
		delete(l.entries, e.pod.UID)
	}
}

// sticks is whether the entry's failed state holds against a ready or
// hibernated state decided for generation.
func (e *intentEntry) sticks(generation string) bool {
	return e.intent.State == cocoonfixup.LifecycleFailed && e.failedIn == generation
}

// take merges in into the entry and returns what of it is to be written.
func (e *intentEntry) take(in cocoonfixup.LifecycleIntent) cocoonfixup.LifecycleIntent {
	generation := in.ObservedGeneration
	if generation == "" {
		generation = e.intent.ObservedGeneration
	}
	switch in.State {
	case cocoonfixup.LifecycleReady, cocoonfixup.LifecycleHibernated:
		if e.sticks(generation) {
			in.State, in.Message, in.Ready = "", "", false
		}
	}
	if in.State != "" {
		e.intent.State, e.intent.Message, e.intent.Ready = in.State, in.Message, in.Ready
		e.failedIn = generation
	}
	if in.IP != "" {
		e.intent.IP = in.IP
	}
	e.intent.ObservedGeneration = generation
	e.annotated = false
	return in
}

func (e *intentEntry) statusNow() PodStatus {
	return PodStatus{
		Namespace: e.pod.Namespace, Name: e.pod.Name, UID: e.pod.UID,
		Phase: "Running", PodIP: e.intent.IP, Ready: e.intent.State == cocoonfixup.LifecycleReady,
		Reason: string(e.intent.State), Message: e.intent.Message,
	}
}

// publish publishes the entry's status when it changed, then writes
// patch. A pod that is gone leaves the table.
func (l *Lifecycle) publish(ctx context.Context, e *intentEntry, patch cocoonfixup.Patch) error {
	if e.dropped {
		return cocoonfixup.ErrGone
	}
	status := e.statusNow()
	if e.status == nil || *e.status != status {
		if err := l.Status.PublishStatus(ctx, status); err != nil {
			return fmt.Errorf("publishing the status of %s/%s: %w", e.pod.Namespace, e.pod.Name, err)
		}
		e.status = &status
	}
	if len(patch) > 0 {
		_, err := l.Pods.PatchAnnotations(ctx, e.pod.Namespace, e.pod.Name, cocoonfixup.PodPatch{Annotations: patch, UID: e.pod.UID})
		if errors.Is(err, cocoonfixup.ErrGone) {
			l.drop(e)
		}
		if err != nil {
			return fmt.Errorf("writing the lifecycle of %s/%s: %w", e.pod.Namespace, e.pod.Name, err)
		}
	}
	e.annotated = true
	return nil
}

// Reconcile publishes again what the pods do not show: an intent whose
// write failed or was overwritten, a status not published; and, when a
// pod's generation has moved on, its intent for the new generation. A
// failed intent is not carried into a new generation: it stays recorded
// for the one it was decided in, which the new generation unsticks. A
// pod that is gone, or whose name another pod now holds, leaves the
// table. It returns how many pods it published for; nothing is written
// when the pods show the table.
func (l *Lifecycle) Reconcile(ctx context.Context) (int, error) {
	l.mu.Lock()
	entries := make([]*intentEntry, 0, len(l.entries))
	for _, e := range l.entries {
		entries = append(entries, e)
	}
	l.mu.Unlock()
	sort.Slice(entries, func(i, j int) bool {
		a, b := entries[i].pod, entries[j].pod
		return a.Namespace < b.Namespace || a.Namespace == b.Namespace && a.Name < b.Name
	})
	published := 0
	var failed []string
	for _, e := range entries {
		did, err := l.reconcile(ctx, e)
		if did {
			published++
		}
		if err != nil {
			failed = append(failed, err.Error())
		}
	}
	if len(failed) > 0 {
		return published, fmt.Errorf("%d of %d pods not reconciled: %v", len(failed), len(entries), failed)
	}
	return published, nil
}

func (l *Lifecycle) reconcile(ctx context.Context, e *intentEntry) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.dropped {
		return false, nil
	}
	doc, err := l.Pods.Get(ctx, e.pod.Namespace, e.pod.Name)
	if err != nil {
		return false, err
	}
	var annotations map[string]string
	if doc != nil {
		m, err := metaOf(doc)
		if err != nil {
			return false, fmt.Errorf("reading pod %s/%s: %w", e.pod.Namespace, e.pod.Name, err)
		}
		if m.Metadata.UID != e.pod.UID {
			doc = nil
		}
		annotations = m.Metadata.Annotations
	}
	if doc == nil {
		l.drop(e)
		return false, nil
	}
	generation := annotations[cocoonfixup.KeyGeneration]
	if generation != "" && generation != e.intent.ObservedGeneration && e.intent.State != cocoonfixup.LifecycleFailed {
		e.intent.ObservedGeneration = generation
		e.annotated = false
	}
	var patch cocoonfixup.Patch
	if want := e.intent.Patch(); !e.annotated || !shows(annotations, want) {
		patch = want
	}
	if len(patch) == 0 && e.status != nil && *e.status == e.statusNow() {
		return false, nil
	}
	return true, l.publish(ctx, e, patch)
}

// shows is whether annotations hold patch: each value set, each nil
// absent.
func shows(annotations map[string]string, patch cocoonfixup.Patch) bool {
	for k, v := range patch {
		have, ok := annotations[k]
		if v == nil && ok || v != nil && (!ok || have != *v) {
			return false
		}
	}
	return true
}
