package kubeclient

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

// Event records e about the pod as a new events.k8s.io/v1 Event, named and
// filled as client-go's and kube-runtime's recorders fill a first
// occurrence (`<pod>.<nanoseconds, hex>`, the event time now), regarding
// the pod with its uid, reported by Options.ReportingController and
// Options.ReportingInstance. An event without an action gets its reason as
// the action, which events.k8s.io/v1 requires.
func (p *Pods) Event(ctx context.Context, namespace, name, uid string, e cocoonfixup.Event) error {
	now := p.o.Now()
	action := e.Action
	if action == "" {
		action = e.Reason
	}
	event := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("%s.%x", name, now.UnixNano())},
		EventTime:  metav1.NewMicroTime(now),
		Regarding: corev1.ObjectReference{
			APIVersion: "v1", Kind: "Pod", Namespace: namespace, Name: name, UID: types.UID(uid),
		},
		Type:                e.Type,
		Reason:              e.Reason,
		Note:                e.Message,
		Action:              action,
		ReportingController: p.o.ReportingController,
		ReportingInstance:   p.o.ReportingInstance,
	}
	if _, err := p.client.EventsV1().Events(namespace).Create(ctx, event, metav1.CreateOptions{}); err != nil {
		return classify(err, fmt.Sprintf("recording the %s event on pod %s/%s", e.Reason, namespace, name))
	}
	return nil
}

// ListEvents lists the events.k8s.io/v1 events in namespace that
// fieldSelector selects, passed to the API server as it is, in pages of
// Options.PageSize, at most Options.EventPages of them. When the API
// server has more after the last page read (a continue token), the events
// read come back with an error wrapping cocoonfixup.ErrEventsTruncated.
// With a field selector the API server may hand out a continue token when
// nothing more matches (it filters as it pages): the package reads a cut
// listing the safe way, as the daemon does with the same bound.
func (p *Pods) ListEvents(ctx context.Context, namespace, fieldSelector string) ([][]byte, error) {
	what := fmt.Sprintf("listing the events in %s with %q", namespace, fieldSelector)
	opts := metav1.ListOptions{FieldSelector: fieldSelector, Limit: p.o.PageSize}
	var out [][]byte
	for page := 0; page < p.o.EventPages; page++ {
		list, err := p.client.EventsV1().Events(namespace).List(ctx, opts)
		if err != nil {
			return nil, classify(err, what)
		}
		for i := range list.Items {
			event := &list.Items[i]
			event.APIVersion, event.Kind = "events.k8s.io/v1", "Event"
			doc, err := document(event)
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
	return out, fmt.Errorf("%w: %s: %d read in %d pages of %d, and the API server has more", cocoonfixup.ErrEventsTruncated, what, len(out), p.o.EventPages, p.o.PageSize)
}
