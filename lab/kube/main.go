// Command cocoon-kube-lab runs a real Kubernetes API server for the tests:
// etcd embedded and kube-apiserver (k8s.io/kubernetes/cmd/kube-apiserver/app)
// in this one process, on 127.0.0.1 only, with TLS, client certificates,
// Node,RBAC authorization, service-account token signing and the default
// admission chain. No scheduler, no controller manager, no kubelet: the
// tests create pods with spec.nodeName set.
//
// It writes into --dir one kubeconfig per identity (docs/kubernetes.md):
//
//	admin.kubeconfig            system:masters
//	daemon-<node>.kubeconfig    CN=cocoon-fixup:<node>, O=cocoon:fixup-daemons
//	cocoon-fixup.kubeconfig     CN=cocoon-fixup (the shared first-install user)
//	controller.kubeconfig       a TokenRequest token of cocoon-system/cocoon-operator
//	tenant.kubeconfig           CN=tenant-a-user, `edit` in namespace tenant-a
//	vk-cocoon.kubeconfig        CN=system:node:vk-cocoon, O=system:nodes
//
// then the file `ready` (the server's URL) and the line `ready <URL>` on
// standard output. It stops by itself when standard input reaches EOF
// (unless --watch-stdin=false), when its parent process goes away, and on
// SIGINT or SIGTERM. Its data (certificates, keys, etcd) stays in --dir, so
// it can be started again on the same data.
package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"

	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/component-base/featuregate"
)

const (
	operatorNamespace = "cocoon-system"
	operatorAccount   = "cocoon-operator"
	tenantNamespace   = "tenant-a"
	tenantUser        = "tenant-a-user"
	daemonGroup       = "cocoon:fixup-daemons"
	daemonUserPrefix  = "cocoon-fixup:"
	sharedDaemonUser  = "cocoon-fixup"
	adminUser         = "cocoon-lab-admin"
	vkCocoonUser      = "system:node:vk-cocoon"
	// The stack's own RBAC for the controller: the operator's manifests
	// grant it, deploy/ does not ship them, so the lab stands in for them.
	stackRole = "cocoon-lab-stack"
)

type nodeList []string

func (n *nodeList) String() string { return strings.Join(*n, ",") }
func (n *nodeList) Set(v string) error {
	for _, name := range strings.Split(v, ",") {
		if name = strings.TrimSpace(name); name != "" {
			*n = append(*n, name)
		}
	}
	return nil
}

func main() {
	var nodes nodeList
	dir := flag.String("dir", "", "directory for the kubeconfigs, certificates and (by default) etcd's data (required)")
	etcdDir := flag.String("etcd-dir", "", "etcd's data directory (default DIR/etcd); start again on the same one to keep the objects")
	watchStdin := flag.Bool("watch-stdin", true, "exit when standard input reaches EOF")
	verbose := flag.Int("v", 0, "kube-apiserver log verbosity")
	removeDir := flag.Bool("remove-dir-on-exit", false, "remove --dir (and so etcd's data) when stopping: for a test's throw-away cluster")
	port := flag.Int("port", 0, "the API server's port on 127.0.0.1 (default: a free one); start again on the same port and --dir to restart the same cluster")
	auditLog := flag.String("audit-log", "", "write kube-apiserver's audit log here (JSON lines): who sent each request, and the body of every write to pods and events")
	flag.Var(&nodes, "node", "a node name to write daemon-<node>.kubeconfig for (repeat, or comma-separated)")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "cocoon-kube-lab: --dir is required")
		os.Exit(2)
	}
	if *etcdDir == "" {
		*etcdDir = filepath.Join(*dir, "etcd")
	}
	err := run(labOptions{
		dir: *dir, etcdDir: *etcdDir, nodes: nodes, watchStdin: *watchStdin,
		verbose: *verbose, removeDirOnExit: *removeDir, port: *port, auditLog: *auditLog,
	})
	if *removeDir {
		_ = os.RemoveAll(*dir)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cocoon-kube-lab: %v\n", err)
		os.Exit(1)
	}
}

// labOptions are the command line's.
type labOptions struct {
	dir, etcdDir    string
	nodes           []string
	watchStdin      bool
	verbose         int
	removeDirOnExit bool
	port            int
	auditLog        string
}

func run(o labOptions) error {
	dir, etcdDir, nodes, watchStdin, verbose, removeDirOnExit := o.dir, o.etcdDir, o.nodes, o.watchStdin, o.verbose, o.removeDirOnExit
	start := time.Now()
	for _, n := range nodes {
		if strings.ContainsAny(n, ":/ ") {
			return fmt.Errorf("node name %q: no ':', '/' or space", n)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "pki"), 0o700); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(dir, "ready"))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopWhenOrphaned(cancel, watchStdin)
	// However the shutdown goes, the process is gone soon after.
	go func() {
		<-ctx.Done()
		time.Sleep(20 * time.Second)
		fmt.Fprintln(os.Stderr, "cocoon-kube-lab: shutdown took too long, exiting")
		if removeDirOnExit {
			_ = os.RemoveAll(dir)
		}
		os.Exit(1)
	}()

	pki, err := loadOrCreatePKI(filepath.Join(dir, "pki"))
	if err != nil {
		return fmt.Errorf("certificates: %w", err)
	}

	etcd, etcdURL, err := startEtcd(etcdDir)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()

	listener, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(o.port)))
	if err != nil {
		return err
	}
	port := listener.Addr().(*net.TCPAddr).Port
	serverURL := "https://127.0.0.1:" + strconv.Itoa(port)

	var audit []string
	if o.auditLog != "" {
		policy := filepath.Join(dir, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
			return err
		}
		audit = []string{
			"--audit-policy-file=" + policy,
			"--audit-log-path=" + o.auditLog,
			"--audit-log-format=json",
			"--audit-log-mode=blocking",
			"--audit-log-maxsize=0",
		}
	}

	apiErr := make(chan error, 1)
	go func() {
		apiErr <- runAPIServer(ctx, listener, port, etcdURL, pki, verbose, audit)
	}()

	adminKey, adminCert, err := pki.client(adminUser, "system:masters")
	if err != nil {
		return err
	}
	adminCfg := &rest.Config{
		Host:            serverURL,
		TLSClientConfig: rest.TLSClientConfig{CAData: pki.caPEM, CertData: adminCert, KeyData: adminKey},
		QPS:             100,
		Burst:           200,
	}
	if err := waitReady(ctx, adminCfg, apiErr); err != nil {
		return err
	}
	if err := writeKubeconfig(dir, "admin", serverURL, pki.caPEM, adminCert, adminKey, ""); err != nil {
		return err
	}
	admin, err := kubernetes.NewForConfig(adminCfg)
	if err != nil {
		return err
	}
	if err := bootstrap(ctx, admin); err != nil {
		return fmt.Errorf("bootstrap objects: %w", err)
	}

	certIdentities := []struct{ file, cn, org string }{
		{"cocoon-fixup", sharedDaemonUser, daemonGroup},
		{"tenant", tenantUser, ""},
		{"vk-cocoon", vkCocoonUser, "system:nodes"},
	}
	for _, n := range nodes {
		certIdentities = append(certIdentities, struct{ file, cn, org string }{"daemon-" + n, daemonUserPrefix + n, daemonGroup})
	}
	for _, id := range certIdentities {
		key, cert, err := pki.client(id.cn, id.org)
		if err != nil {
			return err
		}
		if err := writeKubeconfig(dir, id.file, serverURL, pki.caPEM, cert, key, ""); err != nil {
			return err
		}
	}

	// The controller authenticates as its service account, with a token
	// from the TokenRequest API, as a pod of the operator would.
	expiry := int64(24 * 3600)
	token, err := admin.CoreV1().ServiceAccounts(operatorNamespace).CreateToken(ctx, operatorAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}},
		metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for %s/%s: %w", operatorNamespace, operatorAccount, err)
	}
	if err := writeKubeconfig(dir, "controller", serverURL, pki.caPEM, nil, nil, token.Status.Token); err != nil {
		return err
	}

	if err := waitAuthorized(ctx, admin); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ready"), []byte(serverURL+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Printf("ready %s %.1fs\n", serverURL, time.Since(start).Seconds())

	select {
	case err := <-apiErr:
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("kube-apiserver: %w", err)
		}
	case <-ctx.Done():
		select {
		case <-apiErr:
		case <-time.After(10 * time.Second):
		}
	}
	return nil
}

// stopWhenOrphaned cancels on SIGINT/SIGTERM, on EOF of standard input and
// when the parent process changes (it died and we were re-parented).
func stopWhenOrphaned(cancel func(), watchStdin bool) {
	parent := os.Getppid()
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-signals
		fmt.Fprintf(os.Stderr, "cocoon-kube-lab: %v, stopping\n", s)
		cancel()
		<-signals
		os.Exit(1)
	}()
	if watchStdin {
		go func() {
			_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
			fmt.Fprintln(os.Stderr, "cocoon-kube-lab: standard input closed, stopping")
			cancel()
		}()
	}
	go func() {
		for range time.Tick(500 * time.Millisecond) {
			if os.Getppid() != parent {
				fmt.Fprintln(os.Stderr, "cocoon-kube-lab: parent process gone, stopping")
				cancel()
				return
			}
		}
	}()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startEtcd runs a one-member etcd on loopback. UnsafeNoFsync as in
// k8s.io/apiserver's etcd test server: a test cluster trades durability on
// a power cut for speed.
func startEtcd(dir string) (*embed.Etcd, string, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	cfg := embed.NewConfig()
	cfg.Name = "lab"
	cfg.Dir = dir
	cfg.UnsafeNoFsync = true
	clientURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(clientPort))}
	peerURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(peerPort))}
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(zapcore.NewCore(
		zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()),
		zapcore.Lock(os.Stderr), zapcore.ErrorLevel)).Named("etcd"))
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, "", errors.New("not ready within 60 s")
	}
	return e, clientURL.String(), nil
}

// runAPIServer is cmd/kube-apiserver's NewAPIServerCommand without cobra and
// its signal context: the same options, flags, Complete, Validate and Run.
// auditPolicy: every request once, when its answer is sent (who, what,
// the status), and with the request's body for writes to pods and events,
// so a test can tell which identity wrote what.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Request
  verbs: ["create", "update", "patch", "delete"]
  resources:
  - group: ""
    resources: ["pods"]
  - group: "events.k8s.io"
    resources: ["events"]
- level: Metadata
`

func runAPIServer(ctx context.Context, listener net.Listener, port int, etcdURL string, pki *pki, verbose int, extra []string) error {
	s := options.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	args := []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--endpoint-reconciler-type=none",
		"--etcd-servers=" + etcdURL,
		"--tls-cert-file=" + pki.path("server.crt"),
		"--tls-private-key-file=" + pki.path("server.key"),
		"--client-ca-file=" + pki.path("ca.crt"),
		"--authorization-mode=Node,RBAC",
		// The default chain, and NodeRestriction as kubeadm and most
		// distributions enable it.
		"--enable-admission-plugins=NodeRestriction",
		"--anonymous-auth=false",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + pki.path("sa.key"),
		"--service-account-signing-key-file=" + pki.path("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/24",
		"--profiling=false",
	}
	args = append(args, extra...)
	if err := fs.Parse(args); err != nil {
		return err
	}
	s.SecureServing.Listener = listener
	s.SecureServing.BindPort = port

	featureGate := s.GenericServerRunOptions.ComponentGlobalsRegistry.FeatureGateFor(basecompatibility.DefaultKubeComponent)
	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	s.Logs.Verbosity = logsapi.VerbosityLevel(verbose)
	if err := logsapi.ValidateAndApply(s.Logs, featureGate); err != nil {
		return err
	}
	completed, err := s.Complete(ctx)
	if err != nil {
		return err
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return fmt.Errorf("%v", errs)
	}
	featureGate.(featuregate.MutableFeatureGate).AddMetrics()
	klog.Infof("cocoon-kube-lab: kube-apiserver on 127.0.0.1:%d", port)
	return app.Run(ctx, completed)
}

func waitReady(ctx context.Context, cfg *rest.Config, apiErr chan error) error {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-apiErr:
			return false, fmt.Errorf("kube-apiserver stopped: %v", err)
		default:
		}
		status := 0
		client.CoreV1().RESTClient().Get().AbsPath("/readyz").Do(ctx).StatusCode(&status)
		return status == 200, nil
	})
}

// bootstrap creates what the tests expect and the missing controllers
// would: namespaces with their `default` service account (the
// ServiceAccount admission plugin needs it for every pod), the operator's
// service account and the stack's RBAC, and the tenant's RoleBinding to
// the bootstrap ClusterRole `edit`. Existing objects are kept, so a
// restart on the same data is fine.
func bootstrap(ctx context.Context, c kubernetes.Interface) error {
	if err := aggregateClusterRoles(ctx, c); err != nil {
		return err
	}
	for _, ns := range []string{"default", operatorNamespace, tenantNamespace} {
		if ns != "default" {
			if err := ignoreExists(c.CoreV1().Namespaces().Create(ctx,
				&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})); err != nil {
				return err
			}
		}
		if err := ignoreExists(c.CoreV1().ServiceAccounts(ns).Create(ctx,
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})); err != nil {
			return err
		}
	}
	if err := ignoreExists(c.CoreV1().ServiceAccounts(operatorNamespace).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: operatorAccount}}, metav1.CreateOptions{})); err != nil {
		return err
	}
	if err := ignoreExists(c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: stackRole},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "pods/status", "pods/binding", "bindings"},
				Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"},
				Verbs: []string{"get", "list", "watch", "create"}},
		},
	}, metav1.CreateOptions{})); err != nil {
		return err
	}
	if err := ignoreExists(c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: stackRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: stackRole},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: operatorNamespace, Name: operatorAccount}},
	}, metav1.CreateOptions{})); err != nil {
		return err
	}
	return ignoreExists(c.RbacV1().RoleBindings(tenantNamespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: tenantUser}},
	}, metav1.CreateOptions{}))
}

// aggregateClusterRoles does once what kube-controller-manager's
// clusterrole-aggregation controller does all the time: fill each
// ClusterRole that has an aggregationRule (admin, edit, view, ...) with the
// rules of the ClusterRoles its selectors match. Without it `edit` is
// empty.
func aggregateClusterRoles(ctx context.Context, c kubernetes.Interface) error {
	list, err := c.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	roles := list.Items
	changed := map[int]bool{}
	// Aggregated roles aggregate each other (`view` into `edit` into
	// `admin`): repeat until nothing changes.
	for round := 0; round < 10; round++ {
		again := false
		for i, role := range roles {
			if role.AggregationRule == nil {
				continue
			}
			var rules []rbacv1.PolicyRule
			for _, other := range roles {
				if other.Name == role.Name {
					continue
				}
				for _, selector := range role.AggregationRule.ClusterRoleSelectors {
					sel, err := metav1.LabelSelectorAsSelector(&selector)
					if err != nil {
						return err
					}
					if sel.Matches(labels.Set(other.Labels)) {
						rules = append(rules, other.Rules...)
						break
					}
				}
			}
			if !equality.Semantic.DeepEqual(rules, role.Rules) {
				roles[i].Rules = rules
				changed[i] = true
				again = true
			}
		}
		if !again {
			break
		}
	}
	for i := range changed {
		if _, err := c.RbacV1().ClusterRoles().Update(ctx, &roles[i], metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("aggregating ClusterRole %s: %w", roles[i].Name, err)
		}
	}
	return nil
}

// waitAuthorized waits until the authorizer's caches have the bindings
// bootstrap made: `ready` means each identity can be used at once.
func waitAuthorized(ctx context.Context, c kubernetes.Interface) error {
	checks := []authorizationv1.SubjectAccessReviewSpec{
		{User: tenantUser, ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: tenantNamespace, Verb: "create", Resource: "pods"}},
		{User: tenantUser, ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: tenantNamespace, Verb: "get", Resource: "pods"}},
		{User: "system:serviceaccount:" + operatorNamespace + ":" + operatorAccount,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + operatorNamespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: tenantNamespace, Verb: "create", Resource: "pods"}},
	}
	for _, spec := range checks {
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			review, err := c.AuthorizationV1().SubjectAccessReviews().Create(ctx,
				&authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
			if err != nil {
				return false, err
			}
			return review.Status.Allowed, nil
		})
		if err != nil {
			return fmt.Errorf("waiting for %s to be authorized: %w", spec.User, err)
		}
	}
	return nil
}

func ignoreExists[T any](_ T, err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

func writeKubeconfig(dir, name, server string, ca, cert, key []byte, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lab"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key, Token: token}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: name, Namespace: "default"}
	cfg.CurrentContext = name
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, name+".kubeconfig")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// pki: one CA for serving and client certificates, kept in DIR/pki so that
// a restart keeps its identities; the service-account signing key too.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPEM  []byte
	serial int64
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

func loadOrCreatePKI(dir string) (*pki, error) {
	p := &pki{dir: dir, serial: time.Now().UnixNano()}
	caPEM, errCert := os.ReadFile(p.path("ca.crt"))
	caKeyPEM, errKey := os.ReadFile(p.path("ca.key"))
	if errCert == nil && errKey == nil {
		block, _ := pem.Decode(caPEM)
		keyBlock, _ := pem.Decode(caKeyPEM)
		if block == nil || keyBlock == nil {
			return nil, errors.New("ca.crt or ca.key is not PEM")
		}
		ca, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		key, err := x509.ParseECPrivateKey(keyBlock.Bytes)
		if err != nil {
			return nil, err
		}
		p.ca, p.caKey, p.caPEM = ca, key, caPEM
	} else {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		tmpl := &x509.Certificate{
			SerialNumber:          big.NewInt(1),
			Subject:               pkix.Name{CommonName: "cocoon-kube-lab-ca"},
			NotBefore:             time.Now().Add(-time.Hour),
			NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
			BasicConstraintsValid: true,
			IsCA:                  true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			return nil, err
		}
		ca, _ := x509.ParseCertificate(der)
		p.ca, p.caKey = ca, key
		p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		if err := writePEMKey(p.path("ca.key"), key); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p.path("ca.crt"), p.caPEM, 0o644); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(p.path("sa.key")); err != nil {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		if err := writePEMKey(p.path("sa.key"), key); err != nil {
			return nil, err
		}
	}
	// The serving certificate: 127.0.0.1 and localhost, made anew each start.
	key, cert, err := p.issue(pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")})
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.path("server.key"), key, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.path("server.crt"), cert, 0o644); err != nil {
		return nil, err
	}
	return p, nil
}

func writePEMKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

// client issues a client certificate: CN is the user name, O the group.
func (p *pki) client(cn, org string) (keyPEM, certPEM []byte, err error) {
	name := pkix.Name{CommonName: cn}
	if org != "" {
		name.Organization = []string{org}
	}
	return p.issue(name, x509.ExtKeyUsageClientAuth, nil, nil)
}

func (p *pki) issue(subject pkix.Name, usage x509.ExtKeyUsage, dns []string, ips []net.IP) (keyPEM, certPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	p.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial),
		Subject:      subject,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return nil, nil, err
	}
	// PKCS #8: what every client library reads (the Rust kube crate too).
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}
