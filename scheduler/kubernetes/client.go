package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// serviceAccountNamespace is where Kubernetes mounts the pod's namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// userAgent identifies duet to the API server.
const userAgent = "duet"

// Env is what NewClient and Namespace read from their surroundings: the
// process environment and files (os.Getenv and os.ReadFile in production).
type Env struct {
	Getenv   func(key string) string
	ReadFile func(name string) ([]byte, error)
}

// SliceClient lists and watches the EndpointSlices of a namespace: the
// two calls a Discovery's informer makes. NewClient returns one; tests can
// adapt a fake clientset.
type SliceClient interface {
	List(ctx context.Context, namespace string, opts metav1.ListOptions) (*EndpointSliceList, error)
	Watch(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error)
}

// Client is an EndpointSlice client and what its configuration says.
type Client struct {
	// Slices reads EndpointSlices.
	Slices SliceClient
	// Host is the API server's URL.
	Host string
	// Namespace is the kubeconfig context's namespace; empty in cluster.
	Namespace string
}

// NewClient returns a client configured by the kubeconfig file at path,
// or, when path is empty, by $KUBECONFIG if it is set (a list of files, as
// kubectl reads it), else by the pod's service account
// (rest.InClusterConfig).
func NewClient(path string, env Env) (*Client, error) {
	var (
		cfg *rest.Config
		ns  string
		err error
	)
	if path == "" {
		path = env.Getenv(clientcmd.RecommendedConfigPathEnvVar)
	}
	if path == "" {
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("kubernetes: in-cluster configuration (set kubernetes.kubeconfig or KUBECONFIG to run outside a cluster): %w", err)
		}
	} else {
		rules := &clientcmd.ClientConfigLoadingRules{Precedence: filepath.SplitList(path)}
		if len(rules.Precedence) == 1 {
			rules = &clientcmd.ClientConfigLoadingRules{ExplicitPath: path}
		}
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
		if cfg, err = cc.ClientConfig(); err != nil {
			return nil, fmt.Errorf("kubernetes: kubeconfig %s: %w", path, err)
		}
		if ns, _, err = cc.Namespace(); err != nil {
			return nil, fmt.Errorf("kubernetes: kubeconfig %s: namespace: %w", path, err)
		}
	}
	slices, err := newSliceClient(cfg)
	if err != nil {
		return nil, err
	}
	return &Client{Slices: slices, Host: cfg.Host, Namespace: ns}, nil
}

// restSlices is a SliceClient on a REST client whose scheme knows
// EndpointSlices only: client-go's generated clients register every
// built-in API group, which more than doubled duet's binary.
type restSlices struct {
	rest   rest.Interface
	params runtime.ParameterCodec
}

// newSliceClient returns a SliceClient for the API server cfg describes.
func newSliceClient(cfg *rest.Config) (*restSlices, error) {
	scheme := runtime.NewScheme()
	addToScheme(scheme)
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = userAgent
	cfg.APIPath = "/apis"
	cfg.GroupVersion = &sliceGroupVersion
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: client: %w", err)
	}
	return &restSlices{rest: rc, params: runtime.NewParameterCodec(scheme)}, nil
}

// request starts a GET of namespace's EndpointSlices with opts.
func (c *restSlices) request(namespace string, opts *metav1.ListOptions) *rest.Request {
	req := c.rest.Get().Namespace(namespace).Resource("endpointslices").VersionedParams(opts, c.params)
	if opts.TimeoutSeconds != nil {
		req = req.Timeout(time.Duration(*opts.TimeoutSeconds) * time.Second)
	}
	return req
}

// List implements SliceClient.
func (c *restSlices) List(ctx context.Context, namespace string, opts metav1.ListOptions) (*EndpointSliceList, error) {
	var out EndpointSliceList
	if err := c.request(namespace, &opts).Do(ctx).Into(&out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Watch implements SliceClient.
func (c *restSlices) Watch(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.request(namespace, &opts).Watch(ctx)
}

// Namespace returns the engines' namespace: configured if set, else duet's
// own (the POD_NAMESPACE environment variable, else the service account's
// namespace file), else fallback (a kubeconfig context's namespace, or "").
func Namespace(configured, fallback string, env Env) (string, error) {
	if configured != "" {
		return configured, nil
	}
	if ns := strings.TrimSpace(env.Getenv("POD_NAMESPACE")); ns != "" {
		return ns, nil
	}
	data, err := env.ReadFile(serviceAccountNamespace)
	if ns := strings.TrimSpace(string(data)); err == nil && ns != "" {
		return ns, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("kubernetes: read the namespace: %w", err)
	}
	if fallback != "" {
		return fallback, nil
	}
	return "", errors.New("kubernetes: no namespace: set kubernetes.namespace (duet's own is unknown here: no POD_NAMESPACE, no service-account namespace file)")
}
