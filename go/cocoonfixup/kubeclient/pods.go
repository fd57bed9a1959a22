package kubeclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

// Get reads the pod (its JSON as the API server returns it); nil and no
// error when it is not found, or, with Options.NodeIdentity, not on the
// node.
func (p *Pods) Get(ctx context.Context, namespace, name string) ([]byte, error) {
	pod, err := p.read(ctx, namespace, name)
	if err != nil || pod == nil {
		return nil, err
	}
	return podDocument(pod)
}

// read is the pod, or nil when it is not found. With NodeIdentity a 403 is
// what the Node authorizer answers for a pod not bound to the node (it has
// no relationship to it): the node's own list by name then says whether
// the pod is there (its answer is the pod, read another way) or not (nil).
func (p *Pods) read(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	what := fmt.Sprintf("reading pod %s/%s", namespace, name)
	pod, err := p.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		return pod, nil
	case apierrors.IsNotFound(err):
		return nil, nil
	case apierrors.IsForbidden(err) && p.o.NodeIdentity && p.o.NodeName != "":
		on, lerr := p.onNode(ctx, namespace, name)
		if lerr != nil {
			return nil, fmt.Errorf("%w; then listing it on node %s to tell whether it is there: %w", classify(err, what), p.o.NodeName, lerr)
		}
		return on, nil
	}
	return nil, classify(err, what)
}

// onNode is the pod named name in namespace if it is bound to NodeName,
// else nil: a list by spec.nodeName and metadata.name, which the Node
// authorizer allows the node.
func (p *Pods) onNode(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	selector := fields.AndSelectors(
		fields.OneTermEqualSelector("spec.nodeName", p.o.NodeName),
		fields.OneTermEqualSelector("metadata.name", name),
	)
	list, err := p.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{FieldSelector: selector.String()})
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		if list.Items[i].Name == name {
			return &list.Items[i], nil
		}
	}
	return nil, nil
}

func podDocument(pod *corev1.Pod) ([]byte, error) {
	pod.APIVersion, pod.Kind = "v1", "Pod"
	return document(pod)
}

// PatchAnnotations merge-patches the pod's annotations (a nil value
// removes the key) with metadata.uid, and metadata.resourceVersion when
// not empty, as preconditions, through pods/status with
// Options.NodeIdentity, and returns the pod the API server answered with.
//
// A refusal is told apart by the pod as it is after it: 404, or a 409 or
// 422 (or with NodeIdentity a 403) with the pod gone or of another uid,
// is ErrGone (the real API server answers another uid with 422, "field is
// immutable"); a 409 with the pod at another resourceVersion is
// ErrConflict, returned with that pod; the authorizer's 403 with the pod
// still there is an API error, tried again (an API server that has just
// started answers so until it has loaded its bindings); any other 403 or
// 422 (an admission denial) is ErrRefused; a 409 with the pod still as
// asked (a write raced this one) is an API error.
func (p *Pods) PatchAnnotations(ctx context.Context, namespace, name string, patch cocoonfixup.PodPatch) ([]byte, error) {
	what := fmt.Sprintf("patching the annotations of pod %s/%s", namespace, name)
	if patch.UID == "" {
		return nil, fmt.Errorf("%w: %s: no uid precondition; pass the pod's metadata.uid", cocoonfixup.ErrRefused, what)
	}
	annotations := map[string]*string(patch.Annotations)
	if annotations == nil {
		annotations = map[string]*string{}
	}
	meta := map[string]any{"uid": patch.UID, "annotations": annotations}
	if patch.ResourceVersion != "" {
		meta["resourceVersion"] = patch.ResourceVersion
	}
	body, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return nil, fmt.Errorf("%s: encoding the patch: %w", what, err)
	}
	var subresources []string
	if p.o.NodeIdentity {
		subresources = []string{"status"}
	}
	written, err := p.client.CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, body,
		metav1.PatchOptions{FieldManager: p.o.ReportingController}, subresources...)
	if err == nil {
		return podDocument(written)
	}
	code := statusCode(err)
	told := code == http.StatusConflict || code == http.StatusUnprocessableEntity ||
		(code == http.StatusForbidden && p.o.NodeIdentity)
	if !told {
		return nil, classify(err, what)
	}
	// Which precondition failed, if one did: only the live pod tells.
	live, rerr := p.read(ctx, namespace, name)
	switch {
	case rerr != nil:
		return nil, fmt.Errorf("%s: %w; then reading the pod to tell why failed: %w", what, err, rerr)
	case live == nil:
		return nil, fmt.Errorf("%w: %s: %w; the pod is gone", cocoonfixup.ErrGone, what, err)
	case string(live.UID) != patch.UID:
		return nil, fmt.Errorf("%w: %s: %w; the pod now has uid %s, not %s (it was replaced)", cocoonfixup.ErrGone, what, err, live.UID, patch.UID)
	case code == http.StatusConflict && patch.ResourceVersion != "" && live.ResourceVersion != patch.ResourceVersion:
		doc, derr := podDocument(live)
		if derr != nil {
			return nil, derr
		}
		return doc, fmt.Errorf("%w: %s: %w; the pod is at resourceVersion %s, not %s", cocoonfixup.ErrConflict, what, err, live.ResourceVersion, patch.ResourceVersion)
	case code == http.StatusConflict:
		// Same pod, same version: another write raced this one.
		return nil, fmt.Errorf("%s: %w (the pod still has uid %s)", what, err, patch.UID)
	case code == http.StatusForbidden && authorizerRefusal(err):
		// The pod is there and the authorizer refused the identity: an
		// API error, tried again (classify).
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return nil, fmt.Errorf("%w: %s: %w", cocoonfixup.ErrRefused, what, err)
}

// NodePods lists every pod on Options.NodeName in all namespaces (field
// selector spec.nodeName, which a node identity needs for the list to be
// allowed), in pages of Options.PageSize, at most Options.NodePodPages of
// them: a node with more is an error, never a partial list.
func (p *Pods) NodePods(ctx context.Context) ([][]byte, error) {
	if p.o.NodeName == "" {
		return nil, fmt.Errorf("listing the node's pods: no node name (Options.NodeName), and the field selector would match every unscheduled pod; set it")
	}
	what := fmt.Sprintf("listing the pods on node %s", p.o.NodeName)
	opts := metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", p.o.NodeName).String(),
		Limit:         p.o.PageSize,
	}
	var out [][]byte
	for page := 0; page < p.o.NodePodPages; page++ {
		list, err := p.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
		if err != nil {
			return nil, classify(err, what)
		}
		for i := range list.Items {
			doc, err := podDocument(&list.Items[i])
			if err != nil {
				return nil, err
			}
			out = append(out, doc)
		}
		if list.Continue == "" {
			return out, nil
		}
		opts.Continue = list.Continue
	}
	return nil, fmt.Errorf("%s: more than %d pages of %d pods; raise Options.NodePodPages if the node really runs that many", what, p.o.NodePodPages, p.o.PageSize)
}
