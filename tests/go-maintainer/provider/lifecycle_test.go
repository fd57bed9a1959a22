package provider

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

// pods is one pod in memory, with every status and write in order.
type pods struct {
	uid         string
	annotations map[string]string
	log         []string
}

func (p *pods) Get(ctx context.Context, namespace, name string) ([]byte, error) {
	if p.uid == "" {
		return nil, nil
	}
	return json.Marshal(map[string]any{"metadata": map[string]any{
		"namespace": namespace, "name": name, "uid": p.uid, "annotations": p.annotations,
	}})
}

func (p *pods) PatchAnnotations(ctx context.Context, namespace, name string, patch cocoonfixup.PodPatch) ([]byte, error) {
	if patch.UID != p.uid || patch.ResourceVersion != "" {
		return nil, fmt.Errorf("%w: uid %s", cocoonfixup.ErrGone, patch.UID)
	}
	for k, v := range patch.Annotations {
		if v == nil {
			delete(p.annotations, k)
		} else {
			p.annotations[k] = *v
		}
	}
	p.log = append(p.log, fmt.Sprintf("patch %d keys", len(patch.Annotations)))
	return p.Get(ctx, namespace, name)
}

func (p *pods) PublishStatus(ctx context.Context, s PodStatus) error {
	p.log = append(p.log, fmt.Sprintf("status ready=%v ip=%s reason=%s", s.Ready, s.PodIP, s.Reason))
	return nil
}

func table() (*Lifecycle, *pods) {
	p := &pods{uid: "u1", annotations: map[string]string{cocoonfixup.KeyGeneration: "1"}}
	return &Lifecycle{Pods: p, Status: p}, p
}

var pod = cocoonfixup.PodRef{Namespace: "prod", Name: "demo-0", UID: "u1"}

func publish(t *testing.T, l *Lifecycle, in cocoonfixup.LifecycleIntent) {
	t.Helper()
	if err := l.Publish(context.Background(), pod, in); err != nil {
		t.Fatal(err)
	}
}

func reconcile(t *testing.T, l *Lifecycle) int {
	t.Helper()
	n, err := l.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func ready(generation, ip string) cocoonfixup.LifecycleIntent {
	return cocoonfixup.LifecycleIntent{State: cocoonfixup.LifecycleReady, Ready: true, ObservedGeneration: generation, IP: ip}
}

func failed(generation, message string) cocoonfixup.LifecycleIntent {
	return cocoonfixup.LifecycleIntent{State: cocoonfixup.LifecycleFailed, Message: message, ObservedGeneration: generation}
}

// The status is published before the annotations, and a reconcile of a
// pod that shows the table writes nothing.
func TestStatusFirstThenAnnotationsAndNothingMore(t *testing.T) {
	l, p := table()
	publish(t, l, ready("1", "10.0.0.5"))
	want := []string{"status ready=true ip=10.0.0.5 reason=ready", "patch 4 keys"}
	if !reflect.DeepEqual(p.log, want) {
		t.Fatalf("log %q, want %q", p.log, want)
	}
	if p.annotations[cocoonfixup.KeyLifecycleState] != "ready" || p.annotations[cocoonfixup.KeyIP] != "10.0.0.5" {
		t.Fatalf("annotations %v", p.annotations)
	}
	if n := reconcile(t, l); n != 0 || len(p.log) != 2 {
		t.Fatalf("reconcile published %d: %q", n, p.log)
	}
}

// Failed sticks within its generation: a later ready publishes its IP
// only, and the table stays failed.
func TestFailedSticksWithinItsGeneration(t *testing.T) {
	l, p := table()
	publish(t, l, failed("1", "attempt 1: exit 5"))
	publish(t, l, ready("1", "10.0.0.5"))
	if got := p.annotations[cocoonfixup.KeyLifecycleState]; got != "failed" {
		t.Fatalf("lifecycle-state %q, want failed", got)
	}
	if got := p.annotations[cocoonfixup.KeyIP]; got != "10.0.0.5" {
		t.Fatalf("ip %q", got)
	}
	last := p.log[len(p.log)-2]
	if last != "status ready=false ip=10.0.0.5 reason=failed" {
		t.Fatalf("status %q", last)
	}
	if n := reconcile(t, l); n != 0 {
		t.Fatalf("reconcile published %d", n)
	}
}

// When the generation moves on, a ready intent is published again for
// it; a failed one stays with its own generation, which the new one
// unsticks: a ready for the new generation replaces it.
func TestANewGenerationRepublishesAndUnsticks(t *testing.T) {
	l, p := table()
	publish(t, l, ready("1", "10.0.0.5"))
	p.annotations[cocoonfixup.KeyGeneration] = "2"
	if n := reconcile(t, l); n != 1 {
		t.Fatalf("reconcile published %d, want 1", n)
	}
	if got := p.annotations[cocoonfixup.KeyLifecycleObservedGeneration]; got != "2" {
		t.Fatalf("observed generation %q, want 2", got)
	}
	if n := reconcile(t, l); n != 0 {
		t.Fatalf("a second reconcile published %d", n)
	}

	publish(t, l, failed("2", "exhausted"))
	p.annotations[cocoonfixup.KeyGeneration] = "3"
	writes := len(p.log)
	if n := reconcile(t, l); n != 0 || len(p.log) != writes {
		t.Fatalf("a failed intent was carried into generation 3: %q", p.log[writes:])
	}
	publish(t, l, ready("3", "10.0.0.6"))
	if got := p.annotations[cocoonfixup.KeyLifecycleState]; got != "ready" {
		t.Fatalf("lifecycle-state %q, want ready", got)
	}
}

// What the pod no longer shows is written again; a pod that is gone
// leaves the table.
func TestReconcileRepairsAndForgets(t *testing.T) {
	l, p := table()
	publish(t, l, ready("1", "10.0.0.5"))
	delete(p.annotations, cocoonfixup.KeyIP)
	if n := reconcile(t, l); n != 1 || p.annotations[cocoonfixup.KeyIP] != "10.0.0.5" {
		t.Fatalf("reconcile published %d: %v", n, p.annotations)
	}
	p.uid = "u2"
	if n := reconcile(t, l); n != 0 {
		t.Fatalf("reconcile published %d for a pod that is gone", n)
	}
	if len(l.entries) != 0 {
		t.Fatalf("the table kept %d entries", len(l.entries))
	}
}
