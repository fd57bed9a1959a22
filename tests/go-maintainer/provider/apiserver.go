package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

// APIServer reads and writes pods and events over the API server's REST
// with net/http: the package's Pods, NodePodLister and EventLister.
type APIServer struct {
	Base string
	Node string
	// Controller is the events' reportingController.
	Controller string
}

func (a *APIServer) do(ctx context.Context, method, path, contentType string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, a.Base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return resp.StatusCode, out, err
}

func podPath(namespace, name string) string {
	return "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(name)
}

// Get reads the pod; nil when it is not found.
func (a *APIServer) Get(ctx context.Context, namespace, name string) ([]byte, error) {
	status, body, err := a.do(ctx, http.MethodGet, podPath(namespace, name), "", nil)
	switch {
	case err != nil:
		return nil, err
	case status == http.StatusNotFound:
		return nil, nil
	case status != http.StatusOK:
		return nil, fmt.Errorf("GET pod %s/%s: %d %s", namespace, name, status, body)
	}
	return body, nil
}

// PatchAnnotations merge-patches the pod's annotations with the uid, and
// the resourceVersion when given, as preconditions.
func (a *APIServer) PatchAnnotations(ctx context.Context, namespace, name string, p cocoonfixup.PodPatch) ([]byte, error) {
	meta := map[string]any{"uid": p.UID, "annotations": p.Annotations}
	if p.ResourceVersion != "" {
		meta["resourceVersion"] = p.ResourceVersion
	}
	body, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return nil, err
	}
	status, out, err := a.do(ctx, http.MethodPatch, podPath(namespace, name), "application/merge-patch+json", body)
	switch {
	case err != nil:
		return nil, err
	case status == http.StatusOK:
		return out, nil
	case status == http.StatusNotFound:
		return nil, fmt.Errorf("%w: %s", cocoonfixup.ErrGone, out)
	case status == http.StatusConflict && p.ResourceVersion == "":
		// Only the uid was a precondition: another pod holds the name.
		return nil, fmt.Errorf("%w: %s", cocoonfixup.ErrGone, out)
	case status == http.StatusConflict:
		// The uid or the resourceVersion: the pod now says which.
		now, gerr := a.Get(ctx, namespace, name)
		if gerr != nil {
			return nil, gerr
		}
		if now == nil || uidOf(now) != p.UID {
			return nil, fmt.Errorf("%w: %s", cocoonfixup.ErrGone, out)
		}
		return now, cocoonfixup.ErrConflict
	case status == http.StatusUnauthorized || status == http.StatusForbidden || status == http.StatusUnprocessableEntity:
		return nil, fmt.Errorf("%w: %d %s", cocoonfixup.ErrRefused, status, out)
	}
	return nil, fmt.Errorf("PATCH pod %s/%s: %d %s", namespace, name, status, out)
}

// Event records an event (events.k8s.io/v1) regarding the pod.
func (a *APIServer) Event(ctx context.Context, namespace, name, uid string, e cocoonfixup.Event) error {
	instance := a.Controller
	if a.Node != "" {
		instance += "-" + a.Node
	}
	body, err := json.Marshal(map[string]any{
		"apiVersion": "events.k8s.io/v1", "kind": "Event",
		"metadata":  map[string]any{"generateName": name + ".", "namespace": namespace},
		"eventTime": time.Now().UTC().Format("2006-01-02T15:04:05.000000Z07:00"),
		"regarding": map[string]any{"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid},
		"reason":    e.Reason, "note": e.Message, "type": e.Type, "action": e.Action,
		"reportingController": a.Controller, "reportingInstance": instance,
	})
	if err != nil {
		return err
	}
	status, out, err := a.do(ctx, http.MethodPost, "/apis/events.k8s.io/v1/namespaces/"+url.PathEscape(namespace)+"/events", "application/json", body)
	if err == nil && status/100 != 2 {
		err = fmt.Errorf("POST event: %d %s", status, out)
	}
	return err
}

func (a *APIServer) items(ctx context.Context, path string) ([][]byte, error) {
	status, body, err := a.do(ctx, http.MethodGet, path, "", nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %s", path, status, body)
	}
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, err
	}
	out := make([][]byte, len(list.Items))
	for i, item := range list.Items {
		out[i] = item
	}
	return out, nil
}

// NodePods lists every pod on the node.
func (a *APIServer) NodePods(ctx context.Context) ([][]byte, error) {
	if a.Node == "" {
		return nil, errors.New("no node name given")
	}
	return a.items(ctx, "/api/v1/pods?fieldSelector="+url.QueryEscape("spec.nodeName="+a.Node))
}

// ListEvents lists the namespace's events the field selector matches.
func (a *APIServer) ListEvents(ctx context.Context, namespace, fieldSelector string) ([][]byte, error) {
	return a.items(ctx, "/apis/events.k8s.io/v1/namespaces/"+url.PathEscape(namespace)+"/events?fieldSelector="+url.QueryEscape(fieldSelector))
}

// podMeta is the part of a pod the provider reads itself.
type podMeta struct {
	Metadata cocoonfixup.PodMeta `json:"metadata"`
}

func metaOf(doc []byte) (podMeta, error) {
	var m podMeta
	err := json.Unmarshal(doc, &m)
	return m, err
}

func uidOf(doc []byte) string {
	m, _ := metaOf(doc)
	return m.Metadata.UID
}
