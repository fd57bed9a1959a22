package kubeclient_test

// The real API server these tests run against: lab/kube's cocoon-kube-lab
// (etcd and kube-apiserver v1.37 in one process on loopback, Node,RBAC
// authorization, the default admission chain; docs/kubernetes.md), from
// COCOON_FIXUP_KUBE_LAB, started once for the test binary, with
// deploy/rbac.yaml, deploy/rbac-embedder.yaml and deploy/admission-policy.yaml applied by server-side
// apply as they ship. Without COCOON_FIXUP_KUBE_LAB the tests say loudly
// that they were skipped, unless COCOON_FIXUP_REQUIRE_KUBE=1 makes that a
// failure (host/capi/tests/kubeclient.rs sets both).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup/kubeclient"
)

const (
	// vkNode is vk-cocoon's node: the lab's vk-cocoon identity is
	// system:node:vk-cocoon, the embedder's.
	vkNode = "vk-cocoon"
	nodeA  = "node-a"
	nodeB  = "node-b"
	// tenantNS exists in the lab with its default service account.
	tenantNS = "tenant-a"
	// e2eNS is the end-to-end test's own namespace, made by prepare.
	e2eNS = "kubeclient-e2e"
	// fieldManager applies the deploy files.
	fieldManager = "cocoon-kubeclient-tests"
)

// repo is the repository's root, from this module's folder.
var repo = filepath.Join("..", "..", "..")

type lab struct {
	dir   string
	log   string
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

var (
	labOnce sync.Once
	theLab  *lab
	labErr  error
)

func required() bool { return os.Getenv("COCOON_FIXUP_REQUIRE_KUBE") == "1" }

// unavailable skips t loudly, or fails it where the tests are required;
// fix says what makes the test run.
func unavailable(t *testing.T, why, fix string) {
	t.Helper()
	if required() {
		t.Fatalf("the kubeclient tests cannot run against a real kube-apiserver and COCOON_FIXUP_REQUIRE_KUBE=1: %s; %s", why, fix)
	}
	msg := fmt.Sprintf("*** SKIPPED: %s (the kubeclient tests against a real kube-apiserver): %s; %s, or run `cargo test -p fixup-capi --test kubeclient`, which does. ***", t.Name(), why, fix)
	fmt.Fprintln(os.Stderr, "\n"+msg+"\n")
	t.Skip(msg)
}

// theRealLab is the running lab with deploy/ applied, started on first
// use.
func theRealLab(t *testing.T) *lab {
	t.Helper()
	binary := os.Getenv("COCOON_FIXUP_KUBE_LAB")
	if binary == "" {
		unavailable(t, "COCOON_FIXUP_KUBE_LAB is not set", "build the lab (`cd lab/kube && go build -trimpath -o ../../target/cocoon-kube-lab .`) and set it to the binary")
	}
	labOnce.Do(func() { theLab, labErr = startLab(binary) })
	if labErr != nil {
		t.Fatalf("the lab: %v", labErr)
	}
	return theLab
}

func TestMain(m *testing.M) {
	code := m.Run()
	if theLab != nil {
		theLab.stop()
		// The lab's log is kept for a failed run only: it names itself.
		if code == 0 {
			os.Remove(theLab.log)
		} else {
			fmt.Fprintf(os.Stderr, "the lab's log (kube-apiserver, etcd): %s\n", theLab.log)
		}
	}
	os.Exit(code)
}

func startLab(binary string) (*lab, error) {
	started := time.Now()
	dir, err := os.MkdirTemp("", "cocoon-kube-lab-kubeclient-")
	if err != nil {
		return nil, err
	}
	// The lab's own log (kube-apiserver's and etcd's), beside its folder.
	l := &lab{dir: dir, log: dir + ".log"}
	logFile, err := os.Create(l.log)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	l.cmd = exec.Command(binary, "--dir", dir, "--node", nodeA, "--node", nodeB, "--remove-dir-on-exit")
	l.cmd.Stderr = logFile
	if l.stdin, err = l.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := l.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := l.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", binary, err)
	}
	ready := make(chan string, 1)
	go func() {
		scanner := bufio.NewScanner(stdout)
		for scanner.Scan() {
			if line := scanner.Text(); strings.HasPrefix(line, "ready ") {
				ready <- line
			}
		}
	}()
	select {
	case line := <-ready:
		fmt.Fprintf(os.Stderr, "cocoon-kube-lab: %s (seen after %.1fs)\n", line, time.Since(started).Seconds())
	case <-time.After(180 * time.Second):
		l.stop()
		return nil, fmt.Errorf("cocoon-kube-lab did not get ready in 180 s; its log: %s", l.log)
	}
	if err := l.prepare(); err != nil {
		l.stop()
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "the lab is ready with deploy/ applied after %.1fs\n", time.Since(started).Seconds())
	return l, nil
}

// stop ends the lab: at EOF of its standard input it shuts down and
// removes its folder.
func (l *lab) stop() {
	l.stdin.Close()
	done := make(chan struct{})
	go func() { l.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		l.cmd.Process.Kill()
	}
}

// config is the REST config of one of the lab's identities: admin,
// controller, tenant, vk-cocoon, cocoon-fixup, daemon-<node>.
func (l *lab) config(name string) (*rest.Config, error) {
	config, err := clientcmd.BuildConfigFromFlags("", l.kubeconfig(name))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return config, nil
}

func (l *lab) kubeconfig(name string) string { return filepath.Join(l.dir, name+".kubeconfig") }

func (l *lab) clientset(name string) (*kubernetes.Clientset, error) {
	config, err := l.config(name)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(config)
}

func (l *lab) client(t *testing.T, name string) *kubernetes.Clientset {
	t.Helper()
	c, err := l.clientset(name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// embedder is the adapter as vk-cocoon would make it: its node identity.
func (l *lab) embedder(t *testing.T, o kubeclient.Options) *kubeclient.Pods {
	t.Helper()
	o.NodeName, o.NodeIdentity = vkNode, true
	return kubeclient.New(l.client(t, "vk-cocoon"), o)
}

// prepare applies deploy/rbac.yaml, deploy/rbac-embedder.yaml and
// deploy/admission-policy.yaml,
// makes the end-to-end namespace, and waits until the policy and the
// embedder's event listing are in force.
func (l *lab) prepare() error {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	admin, err := l.config("admin")
	if err != nil {
		return err
	}
	for _, file := range []string{"deploy/rbac.yaml", "deploy/rbac-embedder.yaml", "deploy/admission-policy.yaml"} {
		if err := apply(ctx, admin, filepath.Join(repo, file)); err != nil {
			return err
		}
	}
	adminClient, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return err
	}
	if _, err := adminClient.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e2eNS}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	// No controller manager: the default service account the
	// ServiceAccount admission plugin wants is made by hand.
	if _, err := adminClient.CoreV1().ServiceAccounts(e2eNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	vk, err := l.clientset("vk-cocoon")
	if err != nil {
		return err
	}
	embedder := kubeclient.New(vk, kubeclient.Options{NodeName: vkNode, NodeIdentity: true})
	// deploy/rbac-embedder.yaml lets it list events, once
	// the authorizer's caches have the binding.
	if err := until(ctx, "the embedder's event listing (deploy/rbac-embedder.yaml)", func() (bool, error) {
		_, err := embedder.ListEvents(ctx, tenantNS, "reason=Woken")
		return err == nil, nil
	}); err != nil {
		return err
	}
	// A policy is enforced once the API server's informer has it: probe
	// until a tenant's protected key is refused.
	tenant, err := l.clientset("tenant")
	if err != nil {
		return err
	}
	return until(ctx, "the admission policy", func() (bool, error) {
		name := unique("probe")
		_, err := tenant.CoreV1().Pods(tenantNS).Create(ctx, podObject(name, nodeA, map[string]string{cocoonfixup.KeyVMID: "probe"}), metav1.CreateOptions{})
		switch {
		case err == nil:
			deletePod(ctx, tenant, tenantNS, name)
			return false, nil
		case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy"):
			return true, nil
		case apierrors.IsForbidden(err):
			// The authorizer's caches may lag the lab's bindings.
			return false, nil
		}
		return false, err
	})
}

// until polls ready every 100 ms until it holds, fails, or ctx ends.
func until(ctx context.Context, what string, ready func() (bool, error)) error {
	for {
		ok, err := ready()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// apply applies every document of a YAML file by server-side apply, as
// `kubectl apply --server-side -f` does.
func apply(ctx context.Context, config *rest.Config, path string) error {
	text, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(config)
	if err != nil {
		return err
	}
	groups, err := restmapper.GetAPIGroupResources(disco)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	dyn, err := dynamic.NewForConfig(config)
	if err != nil {
		return err
	}
	decoder := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(text), 4096)
	for {
		var doc map[string]any
		if err := decoder.Decode(&doc); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if doc == nil {
			continue
		}
		obj := &unstructured.Unstructured{Object: doc}
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", path, gvk, err)
		}
		resource := dyn.Resource(mapping.Resource)
		var api dynamic.ResourceInterface = resource
		if ns := obj.GetNamespace(); ns != "" {
			api = resource.Namespace(ns)
		}
		if _, err := api.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: fieldManager, Force: true}); err != nil {
			return fmt.Errorf("%s: applying %s %s: %w", path, gvk.Kind, obj.GetName(), err)
		}
	}
}

var serial atomic.Int64

// unique is a pod name no other test uses.
func unique(prefix string) string { return fmt.Sprintf("%s-%d", prefix, serial.Add(1)) }

func podObject(name, node string, annotations map[string]string) *corev1.Pod {
	off := false
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "guest"}, Annotations: annotations},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			AutomountServiceAccountToken: &off,
			Containers:                   []corev1.Container{{Name: "guest", Image: "example.invalid/guest:1"}},
		},
	}
}

// stackPod is a pod the stack's controller creates, on node.
func (l *lab) stackPod(t *testing.T, namespace, name, node string, annotations map[string]string) *corev1.Pod {
	t.Helper()
	pod, err := l.client(t, "controller").CoreV1().Pods(namespace).Create(context.Background(), podObject(name, node, annotations), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the controller creates %s/%s: %v", namespace, name, err)
	}
	return pod
}

// deletePod deletes at once: no kubelet here confirms a graceful
// deletion.
func deletePod(ctx context.Context, c kubernetes.Interface, namespace, name string) error {
	zero := int64(0)
	err := c.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
