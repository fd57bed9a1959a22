// Package kubeclient is cocoonfixup.Pods over client-go: the reads, the
// guarded annotation writes and the events of the post-clone step, for a
// Go program that already talks to the API server with a
// kubernetes.Interface (vk-cocoon, a virtual-kubelet provider). It is a
// module of its own, so that the cocoonfixup package stays free of
// dependencies; only a program that wants client-go pays for it.
//
// A *Pods implements cocoonfixup.Pods, cocoonfixup.NodePodLister (the
// node's pods, for Options.AcceptAnnotatedVMNames) and
// cocoonfixup.EventLister (the stack's wake events, which tell a hibernate
// wake), and speaks to the API server as the node daemon does:
//
//   - PatchAnnotations is a JSON merge patch that carries metadata.uid, and
//     metadata.resourceVersion when given, as preconditions, so that a
//     write never lands on another incarnation of the pod or on a pod that
//     changed since the read it was decided from. The API server answers a
//     stale resourceVersion with 409 Conflict and another uid with 422
//     Invalid ("field is immutable"); the pod read after either tells which
//     it was (ErrConflict with the pod as it is now, or ErrGone).
//   - Events are new events.k8s.io/v1 objects regarding the pod by uid,
//     reported as the daemon reports them (reportingController
//     cocoon-fixup, the node as the instance), never updated.
//   - Lists are paged (Options.PageSize) and bounded (Options.NodePodPages,
//     Options.EventPages).
//
// Errors wrap cocoonfixup.ErrGone (404, or the uid precondition failed),
// cocoonfixup.ErrRefused (401, an admission plugin's 403, 422 and every
// other 4xx but 404, 409 and 429: another try would get the same answer)
// or cocoonfixup.ErrConflict (PatchAnnotations only), beside the client-go
// error itself (apierrors.IsForbidden and the like still work); anything
// else (429, 5xx, no answer, and the authorizer's 403, which an API server
// that has just started answers until it has loaded its bindings) is an
// API error, which the package retries.
// The adapter itself does not retry: client-go already waits out a 429's
// Retry-After, and the package's step is tried again as a whole.
//
// # The identity
//
// An embedder such as vk-cocoon runs as its node, user
// system:node:<node name> in group system:nodes, and sets
// Options.NodeIdentity. Kubernetes' Node authorizer lets a node read the
// pods bound to it (list and watch only with the field selector
// spec.nodeName=<node>, which NodePods sends), patch their pods/status but
// not the pods themselves, and create events but not list them; and it
// answers a read of a pod that is not, or no longer, bound to the node
// with 403, not 404. So with NodeIdentity:
//
//   - annotations are written through pods/status, which keeps metadata
//     changes for pods and which the Node authorizer and the
//     NodeRestriction admission plugin allow for the node's own pods
//     (deploy/admission-policy.yaml lists vk-cocoon among the stack, who
//     may write every key);
//   - a 403 on a pod is checked against the node's pods (a list by
//     spec.nodeName and metadata.name, which the node may make): a pod
//     not on the node is gone (Get answers nil, PatchAnnotations
//     ErrGone), as it is for the daemon;
//   - list on events.k8s.io events is granted by deploy/rbac-embedder.yaml
//     (ClusterRole cocoon-fixup-embedder, bound to system:node:vk-cocoon)
//     (change the subject to the embedder's identity). Without it
//     ListEvents is refused, the step logs a warning and goes on without
//     the stack's wake events, so a wake that only the events witness is
//     taken for a clone.
//
// An identity bound to deploy/rbac.yaml's ClusterRole (pods get, list,
// watch, patch; events create, list) needs none of this.
//
// # Use
//
//	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
//	clientset, err := kubernetes.NewForConfig(config)
//	pods := kubeclient.New(clientset, kubeclient.Options{
//		NodeName:     "vk-cocoon", // the node whose pods NodePods lists, the events' instance
//		NodeIdentity: true,        // the clientset is system:node:vk-cocoon
//	})
//	out, err := planner.Run(ctx, pod, myCocoon, pods, cocoonfixup.RunOptions{Records: myRecords})
package kubeclient

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

// DefaultReportingController is the reportingController of the events
// Event writes, and the field manager of the patches, unless
// Options.ReportingController says otherwise: the node daemon's own name,
// so that the step's events are the daemon's whoever carries the step out
// (`cocoon-fixup capture` keeps only events of this reporter, and the
// library never takes them for the stack's wake events).
const DefaultReportingController = "cocoon-fixup"

// DefaultPageSize is the items asked for per list request, as the daemon
// asks: a node runs 110 pods by default, so one page is the common case.
const DefaultPageSize = 500

// DefaultNodePodPages bounds NodePods: 20 pages of DefaultPageSize, 10,000
// pods. A node with more is refused rather than listed in part, since the
// list proves that no other pod claims a VM name.
const DefaultNodePodPages = 20

// DefaultEventPages bounds each ListEvents: 2 pages of DefaultPageSize,
// the 1,000 events a selector the daemon reads at most. The selectors the
// package passes name the pod, the reason, the type and the reporter, so
// more than that were forged, and the rest is reported as
// cocoonfixup.ErrEventsTruncated.
const DefaultEventPages = 2

// Options set up Pods. The zero value suits an identity bound to
// deploy/rbac.yaml's role, with no node pods listed.
type Options struct {
	// NodeName is the node whose pods NodePods lists (field selector
	// spec.nodeName), and the events' reportingInstance unless
	// ReportingInstance is set. NodePods refuses to list with none: the
	// selector would match every pod not yet scheduled.
	NodeName string
	// NodeIdentity says the clientset authenticates as the node NodeName
	// (system:node:<NodeName>, as a virtual kubelet does): annotations are
	// written through pods/status, and a 403 on a pod is checked against
	// the node's pods (the package doc's "The identity"). It needs
	// NodeName.
	NodeIdentity bool
	// ReportingController is the events' reportingController and the
	// patches' field manager ("": DefaultReportingController).
	ReportingController string
	// ReportingInstance is the events' reportingInstance ("": NodeName,
	// else the reporting controller).
	ReportingInstance string
	// PageSize is the items asked for per list request (0:
	// DefaultPageSize).
	PageSize int64
	// NodePodPages is the most pages NodePods reads (0:
	// DefaultNodePodPages).
	NodePodPages int
	// EventPages is the most pages one ListEvents reads (0:
	// DefaultEventPages).
	EventPages int
	// Now is the events' time (nil: time.Now).
	Now func() time.Time
}

// Pods is cocoonfixup.Pods, NodePodLister and EventLister over a
// clientset. It holds no state of its own beyond its options: safe for
// use by many goroutines at once, as the clientset is.
type Pods struct {
	client kubernetes.Interface
	o      Options
}

var (
	_ cocoonfixup.Pods          = (*Pods)(nil)
	_ cocoonfixup.NodePodLister = (*Pods)(nil)
	_ cocoonfixup.EventLister   = (*Pods)(nil)
)

// New is Pods over clientset (a *kubernetes.Clientset, or a fake one in
// tests), with o's zero fields at their defaults.
func New(clientset kubernetes.Interface, o Options) *Pods {
	if o.ReportingController == "" {
		o.ReportingController = DefaultReportingController
	}
	if o.ReportingInstance == "" {
		o.ReportingInstance = o.NodeName
	}
	if o.ReportingInstance == "" {
		o.ReportingInstance = o.ReportingController
	}
	if o.PageSize <= 0 {
		o.PageSize = DefaultPageSize
	}
	if o.NodePodPages <= 0 {
		o.NodePodPages = DefaultNodePodPages
	}
	if o.EventPages <= 0 {
		o.EventPages = DefaultEventPages
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Pods{client: clientset, o: o}
}

// statusCode is the HTTP status the API server answered err with, or 0
// when it did not answer (a transport error, a timeout).
func statusCode(err error) int32 {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Code
	}
	return 0
}

// classify wraps err, a failed request about what, in the package's kind
// of failure: ErrGone for 404, ErrRefused for a 4xx another try would get
// again, nothing (an API error, retried) for 409, 429, the authorizer's
// 403, 5xx and no answer.
func classify(err error, what string) error {
	code := statusCode(err)
	switch {
	case code == http.StatusNotFound:
		return fmt.Errorf("%w: %s: %w", cocoonfixup.ErrGone, what, err)
	case code == http.StatusConflict || code == http.StatusTooManyRequests:
	case code == http.StatusForbidden && authorizerRefusal(err):
		// The authorizer's 403 is about the identity, not the pod: an API
		// server that has just started answers so until its authorizer has
		// loaded the bindings, and a fixed binding needs no restart; an
		// API error, which the package tries again, as the daemon does.
	case code >= 400 && code < 500:
		return fmt.Errorf("%w: %s: %w", cocoonfixup.ErrRefused, what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// authorizerRefusal says whether a 403 is in RBAC's or the Node
// authorizer's words (`User "…" cannot get resource "pods" …`), not an
// admission plugin's.
//
// The sentence is anchored where it starts, so that an admission
// webhook's denial quoting a tenant's text (`admission webhook "…" denied
// the request: …`) or a policy's is never taken for it.
func authorizerRefusal(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	head, user, ok := strings.Cut(status.Status().Message, ` is forbidden: User "`)
	if !ok {
		return false
	}
	// What is forbidden: `pods` or `pods "name"`, nothing else before.
	words := strings.Split(head, " ")
	if len(words) > 2 || words[0] == "" || strings.Trim(words[0], "abcdefghijklmnopqrstuvwxyz0123456789./-") != "" {
		return false
	}
	if len(words) == 2 {
		n := words[1]
		if len(n) < 2 || n[0] != '"' || n[len(n)-1] != '"' || strings.Contains(n[1:len(n)-1], `"`) {
			return false
		}
	}
	_, rest, ok := strings.Cut(user, `" cannot `)
	if !ok {
		return false
	}
	verb, after, ok := strings.Cut(rest, " ")
	return ok && verb != "" && strings.HasPrefix(after, `resource "`)
}

// document is obj's JSON. Callers set obj's apiVersion and kind first
// (client-go's typed clients leave them empty on the objects they decode),
// so that it is the object as the API server prints it.
func document(obj any) ([]byte, error) {
	doc, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encoding %T as JSON: %w", obj, err)
	}
	return doc, nil
}
