package kubeclient_test

// Each method of the adapter against the real API server, as the embedder
// (vk-cocoon's node identity, Options.NodeIdentity): reads, the guarded
// merge patch with the real 409 and 422, the node's pods, events and the
// event listing with the field selectors the package produces, and the
// truncation bound.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup/kubeclient"
)

// podDoc is the part of a pod document the tests read.
type podDoc struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace"`
		UID             string            `json:"uid"`
		ResourceVersion string            `json:"resourceVersion"`
		Annotations     map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
}

func parsePod(t *testing.T, doc []byte) podDoc {
	t.Helper()
	var p podDoc
	if err := json.Unmarshal(doc, &p); err != nil {
		t.Fatalf("the pod document %s: %v", doc, err)
	}
	return p
}

func ptr(s string) *string { return &s }

func TestGetReadsThePodAsTheAPIServerReturnsIt(t *testing.T) {
	l := theRealLab(t)
	ctx := context.Background()
	pods := l.embedder(t, kubeclient.Options{})
	pod := l.stackPod(t, tenantNS, unique("get"), vkNode, map[string]string{cocoonfixup.KeyManaged: "true"})

	doc, err := pods.Get(ctx, tenantNS, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	got := parsePod(t, doc)
	if got.APIVersion != "v1" || got.Kind != "Pod" || got.Metadata.UID != string(pod.UID) ||
		got.Metadata.ResourceVersion == "" || got.Spec.NodeName != vkNode || got.Metadata.Annotations[cocoonfixup.KeyManaged] != "true" {
		t.Errorf("Get answered %+v for %s (uid %s)", got, pod.Name, pod.UID)
	}

	// Not found: for a node identity the Node authorizer answers 403 (no
	// relationship), and the adapter's list on the node says there is none.
	if doc, err := pods.Get(ctx, tenantNS, "no-such-pod"); doc != nil || err != nil {
		t.Errorf("a missing pod: %s %v, want nil and no error", doc, err)
	}
	// The same 403 from the raw client, so the list is what told.
	if _, err := l.client(t, "vk-cocoon").CoreV1().Pods(tenantNS).Get(ctx, "no-such-pod", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the node's own get of a missing pod: %v, want the Node authorizer's 403", err)
	}
	// A pod on another node is not the node's: not there, as for the
	// daemon, which serves its node's pods only.
	other := l.stackPod(t, tenantNS, unique("get-other"), nodeA, nil)
	if doc, err := pods.Get(ctx, tenantNS, other.Name); doc != nil || err != nil {
		t.Errorf("a pod on %s: %s %v, want nil", nodeA, doc, err)
	}
	// Deleted: gone.
	if err := deletePod(ctx, l.client(t, "controller"), tenantNS, pod.Name); err != nil {
		t.Fatal(err)
	}
	if doc, err := pods.Get(ctx, tenantNS, pod.Name); doc != nil || err != nil {
		t.Errorf("a deleted pod: %s %v, want nil", doc, err)
	}
	// An identity bound to deploy/rbac.yaml gets the real 404.
	daemon := kubeclient.New(l.client(t, "daemon-"+nodeA), kubeclient.Options{NodeName: nodeA})
	if doc, err := daemon.Get(ctx, tenantNS, "no-such-pod"); doc != nil || err != nil {
		t.Errorf("the daemon identity, a missing pod: %s %v", doc, err)
	}
	// The authorizer's 403 (the tenant may not read pods of another
	// namespace) is about the identity: an API error the package tries
	// again, not a refusal of the pod.
	tenant := kubeclient.New(l.client(t, "tenant"), kubeclient.Options{})
	if _, err := tenant.Get(ctx, "default", "anything"); errors.Is(err, cocoonfixup.ErrRefused) || !apierrors.IsForbidden(err) {
		t.Errorf("the tenant reading default: %v, want an API error wrapping the authorizer's 403", err)
	}
}

func TestPatchAnnotationsCarriesTheUIDAndResourceVersionPreconditions(t *testing.T) {
	l := theRealLab(t)
	ctx := context.Background()
	pods := l.embedder(t, kubeclient.Options{})
	name := unique("patch")
	pod := l.stackPod(t, tenantNS, name, vkNode, map[string]string{cocoonfixup.KeyManaged: "true", cocoonfixup.KeyPostCloneHint: "old"})
	uid := string(pod.UID)

	// Written with both preconditions; the answer is the pod as written.
	doc, err := pods.PatchAnnotations(ctx, tenantNS, name, cocoonfixup.PodPatch{
		Annotations: cocoonfixup.Patch{cocoonfixup.KeyPostCloneState: ptr("running"), cocoonfixup.KeyPostCloneHint: nil},
		UID:         uid, ResourceVersion: pod.ResourceVersion,
	})
	if err != nil {
		t.Fatalf("a guarded patch: %v", err)
	}
	written := parsePod(t, doc)
	if written.Metadata.Annotations[cocoonfixup.KeyPostCloneState] != "running" || written.Metadata.ResourceVersion == pod.ResourceVersion {
		t.Errorf("the answer: %+v", written.Metadata)
	}
	if _, kept := written.Metadata.Annotations[cocoonfixup.KeyPostCloneHint]; kept {
		t.Errorf("a nil value did not remove the key: %v", written.Metadata.Annotations)
	}
	if written.Metadata.Annotations[cocoonfixup.KeyManaged] != "true" {
		t.Errorf("the patch touched another key: %v", written.Metadata.Annotations)
	}
	// Written through pods/status (the node may not patch the pod).
	managed := managedFields(t, l, tenantNS, name)
	if !strings.Contains(managed, `"manager":"cocoon-fixup"`) || !strings.Contains(managed, `"subresource":"status"`) {
		t.Errorf("the write's managed fields: %s", managed)
	}

	// The same stale read again: the real 409, told as ErrConflict with
	// the pod as it is now.
	doc, err = pods.PatchAnnotations(ctx, tenantNS, name, cocoonfixup.PodPatch{
		Annotations: cocoonfixup.Patch{cocoonfixup.KeyPostCloneState: ptr("done")},
		UID:         uid, ResourceVersion: pod.ResourceVersion,
	})
	if !errors.Is(err, cocoonfixup.ErrConflict) || !apierrors.IsConflict(err) || doc == nil {
		t.Fatalf("a stale resourceVersion: %v, want ErrConflict", err)
	}
	if now := parsePod(t, doc); now.Metadata.ResourceVersion != written.Metadata.ResourceVersion || now.Metadata.Annotations[cocoonfixup.KeyPostCloneState] != "running" {
		t.Errorf("ErrConflict came with %+v, want the pod as written before", now.Metadata)
	}

	// The uid precondition alone, no version: written.
	if _, err := pods.PatchAnnotations(ctx, tenantNS, name, cocoonfixup.PodPatch{
		Annotations: cocoonfixup.Patch{cocoonfixup.KeyPostCloneState: ptr("done")}, UID: uid,
	}); err != nil {
		t.Fatalf("the uid precondition alone: %v", err)
	}

	// A key the API server refuses (no valid annotation name): 422 with
	// the pod as it was, a refusal for good.
	if _, err := pods.PatchAnnotations(ctx, tenantNS, name, cocoonfixup.PodPatch{
		Annotations: cocoonfixup.Patch{"not a key!": ptr("x")}, UID: uid,
	}); !errors.Is(err, cocoonfixup.ErrRefused) || !apierrors.IsInvalid(err) {
		t.Errorf("an invalid key: %v, want ErrRefused wrapping the 422", err)
	}

	// The pod recreated with the same name on the same node: the real
	// API server answers the old uid with 422 ("field is immutable"), and
	// the pod read after it says the pod was replaced.
	controller := l.client(t, "controller")
	if err := deletePod(ctx, controller, tenantNS, name); err != nil {
		t.Fatal(err)
	}
	again := l.stackPod(t, tenantNS, name, vkNode, map[string]string{cocoonfixup.KeyManaged: "true"})
	raw := l.client(t, "vk-cocoon").CoreV1().Pods(tenantNS)
	body := fmt.Sprintf(`{"metadata":{"uid":%q,"annotations":{%q:"done"}}}`, uid, cocoonfixup.KeyPostCloneState)
	if _, err := raw.Patch(ctx, name, types.MergePatchType, []byte(body), metav1.PatchOptions{}, "status"); !apierrors.IsInvalid(err) {
		t.Errorf("the raw patch with the old uid: %v, want the real 422", err)
	}
	for _, version := range []string{"", pod.ResourceVersion, again.ResourceVersion} {
		_, err := pods.PatchAnnotations(ctx, tenantNS, name, cocoonfixup.PodPatch{
			Annotations: cocoonfixup.Patch{cocoonfixup.KeyPostCloneState: ptr("done")}, UID: uid, ResourceVersion: version,
		})
		if !errors.Is(err, cocoonfixup.ErrGone) {
			t.Errorf("the old uid with resourceVersion %q: %v, want ErrGone", version, err)
		}
	}
	if s := annotation(t, l, tenantNS, name, cocoonfixup.KeyPostCloneState); s != "" {
		t.Errorf("a write landed on the new pod: post-clone-state %q", s)
	}

	// Deleted: the node has no relationship to it any more (403), and its
	// list says it is not there: gone.
	if err := deletePod(ctx, controller, tenantNS, name); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.PatchAnnotations(ctx, tenantNS, name, cocoonfixup.PodPatch{
		Annotations: cocoonfixup.Patch{cocoonfixup.KeyPostCloneState: ptr("done")}, UID: string(again.UID),
	}); !errors.Is(err, cocoonfixup.ErrGone) {
		t.Errorf("a deleted pod: %v, want ErrGone", err)
	}
	// The daemon's identity gets the real 404 for the same.
	daemon := kubeclient.New(l.client(t, "daemon-"+nodeA), kubeclient.Options{NodeName: nodeA})
	if _, err := daemon.PatchAnnotations(ctx, tenantNS, name, cocoonfixup.PodPatch{
		Annotations: cocoonfixup.Patch{cocoonfixup.KeyPostCloneState: ptr("done")}, UID: string(again.UID),
	}); !errors.Is(err, cocoonfixup.ErrGone) || !apierrors.IsNotFound(err) {
		t.Errorf("the daemon identity, a deleted pod: %v, want ErrGone wrapping the 404", err)
	}
}

// Without NodeIdentity the node's write goes to the pod itself, which the
// Node authorizer refuses; a pod on another node is refused through
// pods/status too (NodeRestriction and the authorizer).
func TestANodeIdentityWritesOnlyItsPodsStatus(t *testing.T) {
	l := theRealLab(t)
	ctx := context.Background()
	pod := l.stackPod(t, tenantNS, unique("status"), vkNode, nil)
	plain := kubeclient.New(l.client(t, "vk-cocoon"), kubeclient.Options{NodeName: vkNode})
	_, err := plain.PatchAnnotations(ctx, tenantNS, pod.Name, cocoonfixup.PodPatch{
		Annotations: cocoonfixup.Patch{cocoonfixup.KeyPostCloneState: ptr("running")}, UID: string(pod.UID),
	})
	if err == nil || errors.Is(err, cocoonfixup.ErrRefused) || !apierrors.IsForbidden(err) {
		t.Errorf("the node patching the pod itself: %v, want an API error wrapping the authorizer's 403", err)
	}
	other := l.stackPod(t, tenantNS, unique("status-other"), nodeA, nil)
	_, err = l.embedder(t, kubeclient.Options{}).PatchAnnotations(ctx, tenantNS, other.Name, cocoonfixup.PodPatch{
		Annotations: cocoonfixup.Patch{cocoonfixup.KeyPostCloneState: ptr("running")}, UID: string(other.UID),
	})
	if !errors.Is(err, cocoonfixup.ErrGone) {
		t.Errorf("the node writing a pod of %s: %v, want ErrGone (not its pod)", nodeA, err)
	}
	if s := annotation(t, l, tenantNS, other.Name, cocoonfixup.KeyPostCloneState); s != "" {
		t.Errorf("the write landed: %q", s)
	}
}

func TestNodePodsListsOnlyTheNodesPods(t *testing.T) {
	l := theRealLab(t)
	ctx := context.Background()
	mine := map[string]bool{}
	for i := 0; i < 3; i++ {
		mine[l.stackPod(t, tenantNS, unique("mine"), vkNode, nil).Name] = true
	}
	theirs := l.stackPod(t, tenantNS, unique("theirs"), nodeA, nil).Name
	// Pages of one pod: the continue token is followed.
	for _, o := range []kubeclient.Options{{}, {PageSize: 1}} {
		docs, err := l.embedder(t, o).NodePods(ctx)
		if err != nil {
			t.Fatalf("page size %d: %v", o.PageSize, err)
		}
		seen := map[string]bool{}
		for _, doc := range docs {
			p := parsePod(t, doc)
			if p.Spec.NodeName != vkNode || p.Kind != "Pod" {
				t.Errorf("page size %d: %s/%s on %q (kind %q)", o.PageSize, p.Metadata.Namespace, p.Metadata.Name, p.Spec.NodeName, p.Kind)
			}
			seen[p.Metadata.Name] = true
		}
		for name := range mine {
			if !seen[name] {
				t.Errorf("page size %d: %s is missing", o.PageSize, name)
			}
		}
		if seen[theirs] {
			t.Errorf("page size %d: %s of %s was listed", o.PageSize, theirs, nodeA)
		}
	}
	// More than the bound: an error, never a part.
	if docs, err := l.embedder(t, kubeclient.Options{PageSize: 1, NodePodPages: 2}).NodePods(ctx); err == nil || docs != nil {
		t.Errorf("past the bound: %d pods, %v; want an error", len(docs), err)
	}
	// Without the field selector the node may not list.
	if _, err := l.client(t, "vk-cocoon").CoreV1().Pods("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the node listing every pod: %v, want 403", err)
	}
	if _, err := kubeclient.New(l.client(t, "vk-cocoon"), kubeclient.Options{}).NodePods(ctx); err == nil {
		t.Error("NodePods without a node name listed")
	}
}

func TestEventIsAnEventsV1EventAsTheDaemonReportsIt(t *testing.T) {
	l := theRealLab(t)
	ctx := context.Background()
	pod := l.stackPod(t, tenantNS, unique("event"), vkNode, nil)
	e := cocoonfixup.Event{Type: "Normal", Reason: cocoonfixup.ReasonSucceeded, Message: "kind=linux_static attempts=1 scenario=oci-networkd", Action: "PostCloneFixup"}
	if err := l.embedder(t, kubeclient.Options{}).Event(ctx, tenantNS, pod.Name, string(pod.UID), e); err != nil {
		t.Fatal(err)
	}
	events := eventsAbout(t, l, tenantNS, string(pod.UID))
	if len(events) != 1 {
		t.Fatalf("%d events about the pod, want 1: %+v", len(events), events)
	}
	got := events[0]
	if got.Reason != e.Reason || got.Note != e.Message || got.Type != e.Type || got.Action != e.Action ||
		got.ReportingController != kubeclient.DefaultReportingController || got.ReportingInstance != vkNode ||
		got.Regarding.Kind != "Pod" || got.Regarding.Name != pod.Name || got.Regarding.Namespace != tenantNS ||
		got.EventTime.IsZero() || !strings.HasPrefix(got.Name, pod.Name+".") {
		t.Errorf("the event as written: %+v", got)
	}
	// One without an action takes its reason as the action, which
	// events.k8s.io/v1 requires.
	if err := l.embedder(t, kubeclient.Options{}).Event(ctx, tenantNS, pod.Name, string(pod.UID), cocoonfixup.Event{Type: "Warning", Reason: "NoAction"}); err != nil {
		t.Errorf("an event without an action: %v", err)
	}
}

// stackEvent posts the stack's event about pod as vk-cocoon posts it
// (the stack's event source; reportingController vk-cocoon unless
// reporter says otherwise), as the identity who.
func stackEvent(t *testing.T, c kubernetes.Interface, pod *corev1.Pod, reason, eventType, reporter string) {
	t.Helper()
	now := time.Now()
	_, err := c.EventsV1().Events(pod.Namespace).Create(context.Background(), &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Namespace: pod.Namespace, Name: fmt.Sprintf("%s.%x", pod.Name, now.UnixNano())},
		EventTime:           metav1.NewMicroTime(now),
		Regarding:           corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Type:                eventType,
		Reason:              reason,
		Note:                "the stack's " + reason,
		Action:              "Wake",
		ReportingController: reporter,
		ReportingInstance:   reporter,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("posting %s: %v", reason, err)
	}
}

// wakeSelectors are the field selectors the package produces for a pod
// (core's memory::field_selectors): one per kind of wake event and
// accepted reporter. The end-to-end wake sees them passed for real.
func wakeSelectors(uid string) []string {
	return []string{
		"regarding.uid=" + uid + ",reason=Woken,type=Normal,reportingController=vk-cocoon",
		"regarding.uid=" + uid + ",reason=HibernateSnapshotExists,type=Warning,reportingController=vk-cocoon",
	}
}

func TestListEventsTakesThePackagesSelectors(t *testing.T) {
	l := theRealLab(t)
	ctx := context.Background()
	pod := l.stackPod(t, tenantNS, unique("list-events"), vkNode, nil)
	vk := l.client(t, "vk-cocoon")
	controller := l.client(t, "controller")
	stackEvent(t, vk, pod, "Woken", "Normal", "vk-cocoon")
	stackEvent(t, vk, pod, "HibernateSnapshotExists", "Warning", "vk-cocoon")
	// Look-alikes the selectors leave out: another reporter, another type,
	// the host's own event, another pod's.
	stackEvent(t, controller, pod, "Woken", "Normal", "someone-else")
	stackEvent(t, vk, pod, "Woken", "Warning", "vk-cocoon")
	pods := l.embedder(t, kubeclient.Options{})
	if err := pods.Event(ctx, tenantNS, pod.Name, string(pod.UID), cocoonfixup.Event{Type: "Normal", Reason: "Woken", Action: "Resume"}); err != nil {
		t.Fatal(err)
	}
	other := l.stackPod(t, tenantNS, unique("list-events-other"), vkNode, nil)
	stackEvent(t, vk, other, "Woken", "Normal", "vk-cocoon")

	for i, selector := range wakeSelectors(string(pod.UID)) {
		docs, err := pods.ListEvents(ctx, tenantNS, selector)
		if err != nil {
			t.Fatalf("%s: %v", selector, err)
		}
		want := []string{"Woken", "HibernateSnapshotExists"}[i]
		if len(docs) != 1 {
			t.Fatalf("%s: %d events, want exactly the stack's %s", selector, len(docs), want)
		}
		var e eventsv1.Event
		if err := json.Unmarshal(docs[0], &e); err != nil {
			t.Fatal(err)
		}
		if e.APIVersion != "events.k8s.io/v1" || e.Kind != "Event" || e.Reason != want || e.ReportingController != "vk-cocoon" || string(e.Regarding.UID) != string(pod.UID) || e.EventTime.IsZero() {
			t.Errorf("%s: %+v", selector, e)
		}
	}
	// A field the API server does not select by is its 400, a refusal.
	if _, err := pods.ListEvents(ctx, tenantNS, "reportingInstance=vk-cocoon"); !errors.Is(err, cocoonfixup.ErrRefused) || !apierrors.IsBadRequest(err) {
		t.Errorf("an unsupported field: %v, want ErrRefused wrapping the 400", err)
	}
}

func TestListEventsSaysWhenItWasCut(t *testing.T) {
	l := theRealLab(t)
	ctx := context.Background()
	pod := l.stackPod(t, tenantNS, unique("flood"), vkNode, nil)
	vk := l.client(t, "vk-cocoon")
	for i := 0; i < 5; i++ {
		stackEvent(t, vk, pod, "Woken", "Normal", "vk-cocoon")
	}
	selector := wakeSelectors(string(pod.UID))[0]
	for _, c := range []struct {
		pageSize  int64
		pages     int
		read      int
		truncated bool
	}{
		{pageSize: 2, pages: 2, read: 4, truncated: true},
		{pageSize: 2, pages: 3, read: 5, truncated: false},
		{pageSize: 0, pages: 0, read: 5, truncated: false},
	} {
		docs, err := l.embedder(t, kubeclient.Options{PageSize: c.pageSize, EventPages: c.pages}).ListEvents(ctx, tenantNS, selector)
		if len(docs) != c.read || errors.Is(err, cocoonfixup.ErrEventsTruncated) != c.truncated || (err != nil && !c.truncated) {
			t.Errorf("pages of %d, at most %d: %d events, %v; want %d, truncated %v", c.pageSize, c.pages, len(docs), err, c.read, c.truncated)
		}
	}
}

// deploy/rbac-embedder.yaml, and nothing the tests add,
// lets the embedder's node identity list the events a wake is told by.
func TestTheEmbeddersIdentityMayListEventsAsShipped(t *testing.T) {
	l := theRealLab(t)
	if _, err := l.embedder(t, kubeclient.Options{}).ListEvents(context.Background(), tenantNS, "reason=Woken"); err != nil {
		t.Fatalf("vk-cocoon's ListEvents with deploy/ as shipped: %v", err)
	}
}

func eventsAbout(t *testing.T, l *lab, namespace, uid string) []eventsv1.Event {
	t.Helper()
	list, err := l.client(t, "admin").EventsV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "regarding.uid=" + uid})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func annotation(t *testing.T, l *lab, namespace, name, key string) string {
	t.Helper()
	pod, err := l.client(t, "admin").CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod.Annotations[key]
}

func managedFields(t *testing.T, l *lab, namespace, name string) string {
	t.Helper()
	pod, err := l.client(t, "admin").CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(pod.ManagedFields)
	return string(out)
}
