package kubeclient

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

// Only the authorizer's own sentence is an API error tried again; a
// policy's or a webhook's denial, even one quoting a tenant's text shaped
// like it, is a refusal.
func TestOnlyTheAuthorizersRefusalIsTriedAgain(t *testing.T) {
	for _, c := range []struct {
		message string
		again   bool
	}{
		{`pods "web-0" is forbidden: User "system:node:vk-cocoon" cannot patch resource "pods" in API group "" in the namespace "prod"`, true},
		{`pods is forbidden: User "cocoon-fixup:node-a" cannot list resource "pods" in API group "" at the cluster scope`, true},
		{`pods "web-0" is forbidden: ValidatingAdmissionPolicy 'cocoon-stack-annotations' with binding 'cocoon-stack-annotations' denied request: no`, false},
		{`admission webhook "validation.gatekeeper.sh" denied the request: [owner] pods "x" is forbidden: User "x" cannot patch resource "pods"`, false},
		{`pods "web-0" is forbidden: note says User "x" cannot patch resource "pods"`, false},
		{`pods "web-0" is forbidden: User "x" cannot`, false},
	} {
		err := &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden, Message: c.message}}
		got := classify(err, "patching")
		if errors.Is(got, cocoonfixup.ErrRefused) == c.again || !apierrors.IsForbidden(got) {
			t.Errorf("%q: %v; tried again: want %v", c.message, got, c.again)
		}
	}
}
