// Package kubetest serves, from memory and on loopback, the part of the
// Kubernetes API that duet's discovery uses: list and watch (including
// watch-list, with initial events and the end-of-initial-events bookmark)
// of the EndpointSlices of a namespace, label-selected. Tests of duet's
// wiring and binary point a kubeconfig at it; they do not need a cluster.
package kubetest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
)

// slicesPath is the path prefix of namespaced EndpointSlice calls.
const slicesPath = "/apis/discovery.k8s.io/v1/namespaces/"

// event is one change, in resource-version order.
type event struct {
	typ   watch.EventType
	slice discoveryv1.EndpointSlice
}

// APIServer is an in-memory Kubernetes API server for EndpointSlices.
type APIServer struct {
	srv *httptest.Server

	mu        sync.Mutex
	rv        int
	slices    map[string]discoveryv1.EndpointSlice // namespace/name -> slice
	events    []event                              // events[i] has resource version i+1
	changed   chan struct{}                        // closed and replaced on every event
	done      chan struct{}                        // closed by Close: watches end
	closed    bool
	requests  int  // list and watch calls served
	watchList bool // whether sendInitialEvents is served (else refused)
	fail      int  // when set, the HTTP status of every answer
}

// Start starts an API server on a loopback port.
func Start() *APIServer {
	a := &APIServer{slices: make(map[string]discoveryv1.EndpointSlice), changed: make(chan struct{}), watchList: true,
		done: make(chan struct{})}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serve))
	return a
}

// Close stops the server and ends open watches, even while clients keep
// reconnecting.
func (a *APIServer) Close() {
	a.mu.Lock()
	if !a.closed {
		a.closed = true
		close(a.done)
	}
	a.mu.Unlock()
	_ = a.srv.Listener.Close() // no new connections; Close closes it again
	a.srv.CloseClientConnections()
	a.srv.Close()
}

// URL is the server's base URL.
func (a *APIServer) URL() string { return a.srv.URL }

// Requests returns the number of list and watch calls served so far.
func (a *APIServer) Requests() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.requests
}

// SetWatchList says whether watches with sendInitialEvents (watch-list)
// are served; when not, they are refused as by an API server without the
// feature, and clients fall back to list, then watch. Served by default.
func (a *APIServer) SetWatchList(on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.watchList = on
}

// Fail makes every list and watch call fail with the HTTP status code (403
// as without RBAC, 500, ...) and ends open watches; 0 serves again.
func (a *APIServer) Fail(code int) {
	a.mu.Lock()
	a.fail = code
	a.mu.Unlock()
	if code != 0 {
		a.srv.CloseClientConnections()
	}
}

// Apply creates or replaces a slice (by namespace and name).
func (a *APIServer) Apply(s *discoveryv1.EndpointSlice) {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := s.Namespace + "/" + s.Name
	typ := watch.Modified
	if _, ok := a.slices[key]; !ok {
		typ = watch.Added
	}
	c := *s.DeepCopy()
	a.record(typ, &c)
	a.slices[key] = c
}

// Delete removes a slice; it reports whether there was one.
func (a *APIServer) Delete(namespace, name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := namespace + "/" + name
	c, ok := a.slices[key]
	if !ok {
		return false
	}
	delete(a.slices, key)
	a.record(watch.Deleted, &c)
	return true
}

// record stamps s with the next resource version and appends its event.
// The caller holds mu.
func (a *APIServer) record(typ watch.EventType, s *discoveryv1.EndpointSlice) {
	a.rv++
	s.TypeMeta = metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"}
	s.ResourceVersion = strconv.Itoa(a.rv)
	a.events = append(a.events, event{typ, *s.DeepCopy()})
	close(a.changed)
	a.changed = make(chan struct{})
}

// WriteKubeconfig writes a kubeconfig for the server into dir, whose
// context's namespace is namespace, and returns its path.
func (a *APIServer) WriteKubeconfig(dir, namespace string) (string, error) {
	path := filepath.Join(dir, "kubeconfig")
	data := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q}
users:
- name: test
  user: {token: test}
contexts:
- name: test
  context: {cluster: test, user: test, namespace: %q}
current-context: test
`, a.srv.URL, namespace)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		return "", fmt.Errorf("kubetest: %w", err)
	}
	return path, nil
}

// serve answers GET .../namespaces/<ns>/endpointslices, as a list or a
// watch; anything else is 404.
func (a *APIServer) serve(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, slicesPath)
	ns, resource, _ := strings.Cut(rest, "/")
	if !ok || resource != "endpointslices" || r.Method != http.MethodGet {
		status(w, http.StatusNotFound, "NotFound", "not served by kubetest: "+r.Method+" "+r.URL.Path)
		return
	}
	q := r.URL.Query()
	selector, err := labels.Parse(q.Get("labelSelector"))
	if err != nil {
		status(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	match := func(s *discoveryv1.EndpointSlice) bool {
		return s.Namespace == ns && selector.Matches(labels.Set(s.Labels))
	}
	a.mu.Lock()
	a.requests++
	watchList, fail := a.watchList, a.fail
	a.mu.Unlock()
	if fail != 0 {
		status(w, fail, http.StatusText(fail), "kubetest: failing on purpose")
		return
	}
	initial := q.Get("sendInitialEvents") == "true"
	if initial && !watchList {
		status(w, http.StatusUnprocessableEntity, "Invalid", "sendInitialEvents is not supported")
		return
	}
	if watching, _ := strconv.ParseBool(q.Get("watch")); watching {
		a.watch(w, r, match, q.Get("resourceVersion"), initial)
		return
	}
	a.list(w, match)
}

// list writes the matching slices as an EndpointSliceList.
func (a *APIServer) list(w http.ResponseWriter, match func(*discoveryv1.EndpointSlice) bool) {
	a.mu.Lock()
	out := discoveryv1.EndpointSliceList{
		TypeMeta: metav1.TypeMeta{Kind: "EndpointSliceList", APIVersion: "discovery.k8s.io/v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: strconv.Itoa(a.rv)},
		Items:    []discoveryv1.EndpointSlice{},
	}
	for _, s := range a.slices {
		if match(&s) {
			out.Items = append(out.Items, s)
		}
	}
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// status writes a metav1.Status error.
func status(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: msg, Reason: metav1.StatusReason(reason), Code: int32(code),
	})
}

// watchEvent is a watch stream's frame.
type watchEvent struct {
	Type   watch.EventType            `json:"type"`
	Object *discoveryv1.EndpointSlice `json:"object"`
}

// watch streams the matching events after resourceVersion (with
// initial: the current slices, then a bookmark that ends the initial
// events) until the client goes away or the server closes.
func (a *APIServer) watch(w http.ResponseWriter, r *http.Request, match func(*discoveryv1.EndpointSlice) bool,
	resourceVersion string, initial bool) {
	from := 0
	if resourceVersion != "" {
		n, err := strconv.Atoi(resourceVersion)
		if err != nil {
			status(w, http.StatusBadRequest, "BadRequest", "bad resourceVersion "+resourceVersion)
			return
		}
		from = n
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		status(w, http.StatusInternalServerError, "InternalError", "no flusher")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	send := func(typ watch.EventType, s *discoveryv1.EndpointSlice) bool {
		if err := enc.Encode(watchEvent{typ, s}); err != nil {
			return false
		}
		flusher.Flush()
		return true
	}

	var pending []event
	a.mu.Lock()
	if initial {
		for _, sl := range a.slices {
			pending = append(pending, event{watch.Added, sl})
		}
		from = a.rv
		pending = append(pending, event{watch.Bookmark, discoveryv1.EndpointSlice{
			TypeMeta: metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"},
			ObjectMeta: metav1.ObjectMeta{ResourceVersion: strconv.Itoa(a.rv),
				Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}},
		}})
	}
	for {
		pending = append(pending, a.events[min(from, len(a.events)):]...)
		from = len(a.events)
		changed := a.changed
		a.mu.Unlock()
		for _, e := range pending {
			if (e.typ == watch.Bookmark || match(&e.slice)) && !send(e.typ, &e.slice) {
				return
			}
		}
		pending = pending[:0]
		select {
		case <-r.Context().Done():
			return
		case <-a.done:
			return
		case <-changed:
		}
		a.mu.Lock()
	}
}
