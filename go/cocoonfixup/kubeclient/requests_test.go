package kubeclient_test

// Request counts (BENCHMARKS.md): the API server's own
// apiserver_request_total, read as admin before and after a piece of work,
// by verb and resource. The test's own requests in between (the
// controller creating the pod, the stack's event, the polls that see the
// work end) are counted on the client side, as the API server labels them,
// and taken off, so what is left is the path's own.

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// counts are requests by "VERB resource[/subresource]", the resource
// qualified by its group when it has one ("POST events.k8s.io/events").
type counts map[string]int

func requestKey(verb, group, resource, subresource string) string {
	if group != "" {
		resource = group + "/" + resource
	}
	if subresource != "" {
		resource += "/" + subresource
	}
	return verb + " " + resource
}

var (
	metricLine = regexp.MustCompile(`^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$`)
	labelPair  = regexp.MustCompile(`(\w+)="([^"]*)"`)
)

// scrape reads apiserver_request_total from the API server's /metrics as
// admin, by verb and resource (every code together). Requests to URLs
// that are no resource (/metrics itself, /healthz) are left out.
func scrape(ctx context.Context, admin kubernetes.Interface) (counts, error) {
	text, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	out := counts{}
	for _, line := range strings.Split(string(text), "\n") {
		m := metricLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, pair := range labelPair.FindAllStringSubmatch(m[1], -1) {
			labels[pair[1]] = pair[2]
		}
		if labels["resource"] == "" {
			continue
		}
		n, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return nil, fmt.Errorf("apiserver_request_total %q: %w", line, err)
		}
		out[requestKey(labels["verb"], labels["group"], labels["resource"], labels["subresource"])] += int(n)
	}
	return out, nil
}

// minus is c - other, the keys left with a count (negative ones too: they
// would say the subtraction is wrong).
func (c counts) minus(other counts) counts {
	out := counts{}
	for k, n := range c {
		if d := n - other[k]; d != 0 {
			out[k] = d
		}
	}
	for k, n := range other {
		if _, ok := c[k]; !ok {
			out[k] = -n
		}
	}
	return out
}

// only keeps the requests about the given resources, core or of a group
// (pods, events): the API server's own housekeeping (its identity lease
// every 10 s) falls into any window and is left out.
func (c counts) only(resources ...string) counts {
	out := counts{}
	for k, n := range c {
		// "VERB resource[/sub]" or "VERB group/resource[/sub]".
		segs := strings.Split(strings.SplitN(k, " ", 2)[1], "/")
		for _, r := range resources {
			if segs[0] == r || (len(segs) > 1 && segs[1] == r) {
				out[k] = n
				break
			}
		}
	}
	return out
}

func (c counts) String() string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, c[k]))
	}
	return strings.Join(parts, " ")
}

// counter counts the requests a test's own clients send, keyed as the API
// server's metric labels them.
type counter struct {
	mu sync.Mutex
	c  counts
}

func (k *counter) take() counts {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := k.c
	k.c = counts{}
	return out
}

// wrap makes config's requests counted.
func (k *counter) wrap(config *rest.Config) *rest.Config {
	config = rest.CopyConfig(config)
	config.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(req *http.Request) (*http.Response, error) {
			if key := labelOf(req); key != "" {
				k.mu.Lock()
				if k.c == nil {
					k.c = counts{}
				}
				k.c[key]++
				k.mu.Unlock()
			}
			return rt.RoundTrip(req)
		})
	})
	return config
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// labelOf is the request's key as the API server's metric labels it:
// /api/v1/[namespaces/NS/]RESOURCE[/NAME[/SUB]] or
// /apis/GROUP/VERSION/..., the verb from the method (GET of a collection is
// LIST, or WATCH with watch=true; a PATCH of an apply patch is APPLY);
// "" for a URL that is no resource.
func labelOf(req *http.Request) string {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	var group string
	var rest []string
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		rest = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		group, rest = parts[1], parts[3:]
	default:
		return ""
	}
	if len(rest) >= 3 && rest[0] == "namespaces" {
		rest = rest[2:]
	}
	resource, name, sub := rest[0], "", ""
	if len(rest) > 1 {
		name = rest[1]
	}
	if len(rest) > 2 {
		sub = rest[2]
	}
	verb := req.Method
	switch {
	case req.Method == http.MethodGet && req.URL.Query().Get("watch") == "true":
		verb = "WATCH"
	case req.Method == http.MethodGet && name == "":
		verb = "LIST"
	case req.Method == http.MethodPatch && strings.HasPrefix(req.Header.Get("Content-Type"), "application/apply-patch"):
		verb = "APPLY"
	}
	return requestKey(verb, group, resource, sub)
}
