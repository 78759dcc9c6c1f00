// The client-go reference of the peer benchmark (hack/bench-peers.sh):
// upstream's sample-controller as its controller.go has it, on client-go's
// informers and workqueue — every Foo add or update queued, a Deployment's
// events queued for the Foo that controls it, and a sync that creates the
// Deployment, matches its replicas, updates the Foo's status and records an
// Event, every time — with the one change issue 45 asks for: client-go's
// client-side rate limit (5 requests a second, bursts of 10) lifted. Upstream
// reads Foos through generated clients; this reads them as unstructured
// objects through the dynamic client, which makes the same requests (without
// upstream's field manager name, which changes none of them).
// Upstream has no leader election; this adds client-go's own elector (a
// Lease, released on SIGTERM) so that a failover can be timed. Test tool
// only; nothing here ships.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/time/rate"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	appslisters "k8s.io/client-go/listers/apps/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// UserAgent is how the benchmark finds this client's requests in the audit log.
const UserAgent = "client-go-controller-reference/v0.37.2"

var fooResource = schema.GroupVersionResource{Group: "samplecontroller.k8s.io", Version: "v1alpha1", Resource: "foos"}
var fooKind = schema.GroupVersionKind{Group: "samplecontroller.k8s.io", Version: "v1alpha1", Kind: "Foo"}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "path to a kubeconfig (KUBECONFIG when empty)")
	namespace := flag.String("namespace", "", "namespace to watch (all when empty)")
	workers := flag.Int("workers", 2, "Foos synced concurrently (upstream's threadiness, 2)")
	resync := flag.Duration("resync-period", 30*time.Second, "informer resync (upstream's 30s); 0 for none")
	leaderElect := flag.Bool("leader-elect", false, "elect a leader through a Lease, released on SIGTERM")
	leaseID := flag.String("leader-election-id", "client-go-controller-reference", "the Lease's name")
	leaseNamespace := flag.String("leader-election-namespace", "default", "the Lease's namespace")
	probes := flag.String("health-probe-bind-address", "0", "address for /readyz (ready once standing by or synced), \"0\" for none")
	flag.Parse()

	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = *kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	must(err)
	cfg.UserAgent = UserAgent
	cfg.QPS = -1 // the rate limit lifted: a negative QPS makes client-go build no limiter
	kube := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var ready atomic.Bool
	serveReadyz(*probes, &ready)
	run := func(ctx context.Context) { runController(ctx, kube, dyn, *namespace, *workers, *resync, &ready) }
	if !*leaderElect {
		run(ctx)
		return
	}
	hostname, _ := os.Hostname()
	identity := fmt.Sprintf("%s_%d", hostname, os.Getpid())
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: *leaseID, Namespace: *leaseNamespace},
		Client:     kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
	ready.Store(true) // a standby is ready: it waits for the Lease with nothing cached
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				say("Successfully acquired lease")
				ready.Store(false)
				run(ctx)
			},
			OnStoppedLeading: func() { say("stopped leading") },
		},
	})
}

// say writes one JSON log line with a timestamp to the nanosecond: the
// benchmark times its runs from them.
func say(msg string) {
	line, _ := json.Marshal(map[string]string{"ts": time.Now().UTC().Format(time.RFC3339Nano), "msg": msg})
	fmt.Fprintln(os.Stderr, string(line))
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func serveReadyz(addr string, ready *atomic.Bool) {
	if addr == "0" {
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "caches not synced", http.StatusServiceUnavailable)
		}
	})
	go func() { must(http.ListenAndServe(addr, mux)) }()
}

// Controller is upstream's: listers, a rate-limited workqueue of Foo names
// and an Event recorder.
type Controller struct {
	kube        kubernetes.Interface
	foos        dynamic.NamespaceableResourceInterface
	deployments appslisters.DeploymentLister
	fooLister   cache.GenericLister
	queue       workqueue.TypedRateLimitingInterface[cache.ObjectName]
	recorder    record.EventRecorder
}

func runController(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, ns string, workers int,
	resync time.Duration, ready *atomic.Bool) {
	kubeFactory := kubeinformers.NewSharedInformerFactoryWithOptions(kube, resync, kubeinformers.WithNamespace(ns))
	fooFactory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, resync, ns, nil)
	deploymentInformer := kubeFactory.Apps().V1().Deployments()
	fooInformer := fooFactory.ForResource(fooResource)

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	// upstream's limiter: per-item exponential 5 ms .. 1000 s, and 50 a second overall (bursts of 300)
	limiter := workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[cache.ObjectName](5*time.Millisecond, 1000*time.Second),
		&workqueue.TypedBucketRateLimiter[cache.ObjectName]{Limiter: rate.NewLimiter(rate.Limit(50), 300)},
	)
	c := &Controller{
		kube:        kube,
		foos:        dyn.Resource(fooResource),
		deployments: deploymentInformer.Lister(),
		fooLister:   fooInformer.Lister(),
		queue:       workqueue.NewTypedRateLimitingQueue(limiter),
		recorder:    broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "sample-controller"}),
	}
	defer c.queue.ShutDown()
	fooInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, obj interface{}) { c.enqueue(obj) },
	})
	deploymentInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.handleDeployment,
		UpdateFunc: func(old, obj interface{}) {
			if old.(*appsv1.Deployment).ResourceVersion != obj.(*appsv1.Deployment).ResourceVersion {
				c.handleDeployment(obj)
			}
		},
		DeleteFunc: c.handleDeployment,
	})
	kubeFactory.Start(ctx.Done())
	fooFactory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), deploymentInformer.Informer().HasSynced, fooInformer.Informer().HasSynced) {
		return
	}
	say("Starting workers")
	ready.Store(true)
	for i := 0; i < workers; i++ {
		go wait.UntilWithContext(ctx, c.runWorker, time.Second)
	}
	<-ctx.Done()
}

func (c *Controller) enqueue(obj interface{}) {
	name, err := cache.ObjectToName(obj)
	if err == nil {
		c.queue.Add(name)
	}
}

// handleDeployment queues the Foo that controls a Deployment, if any.
func (c *Controller) handleDeployment(obj interface{}) {
	if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	object, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	owner := metav1.GetControllerOf(object)
	if owner == nil || owner.Kind != "Foo" {
		return
	}
	if foo, err := c.fooLister.ByNamespace(object.GetNamespace()).Get(owner.Name); err == nil {
		c.enqueue(foo)
	}
}

func (c *Controller) runWorker(ctx context.Context) {
	for {
		name, shutdown := c.queue.Get()
		if shutdown {
			return
		}
		if err := c.sync(ctx, name); err != nil {
			klog.ErrorS(err, "sync failed; requeuing", "foo", name)
			c.queue.AddRateLimited(name)
		} else {
			c.queue.Forget(name)
		}
		c.queue.Done(name)
	}
}

// sync is upstream's syncHandler: it writes the status and an Event every
// time, whether anything changed or not.
func (c *Controller) sync(ctx context.Context, name cache.ObjectName) error {
	obj, err := c.fooLister.ByNamespace(name.Namespace).Get(name.Name)
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	foo := obj.(*unstructured.Unstructured)
	deploymentName, _, _ := unstructured.NestedString(foo.Object, "spec", "deploymentName")
	if deploymentName == "" {
		return nil
	}
	replicas, hasReplicas, _ := unstructured.NestedInt64(foo.Object, "spec", "replicas")
	deployment, err := c.deployments.Deployments(foo.GetNamespace()).Get(deploymentName)
	if apierrors.IsNotFound(err) {
		deployment, err = c.kube.AppsV1().Deployments(foo.GetNamespace()).Create(ctx,
			newDeployment(foo, deploymentName, replicas, hasReplicas), metav1.CreateOptions{})
	}
	if err != nil {
		return err
	}
	if !metav1.IsControlledBy(deployment, foo) {
		msg := fmt.Sprintf("Resource %q already exists and is not managed by Foo", deployment.Name)
		c.recorder.Event(foo, corev1.EventTypeWarning, "ErrResourceExists", msg)
		return fmt.Errorf("%s", msg)
	}
	if hasReplicas && deployment.Spec.Replicas != nil && int64(*deployment.Spec.Replicas) != replicas {
		deployment, err = c.kube.AppsV1().Deployments(foo.GetNamespace()).Update(ctx,
			newDeployment(foo, deploymentName, replicas, hasReplicas), metav1.UpdateOptions{})
		if err != nil {
			return err
		}
	}
	status := foo.DeepCopy()
	must(unstructured.SetNestedField(status.Object, int64(deployment.Status.AvailableReplicas), "status", "availableReplicas"))
	if _, err := c.foos.Namespace(foo.GetNamespace()).UpdateStatus(ctx, status, metav1.UpdateOptions{}); err != nil {
		return err
	}
	c.recorder.Event(foo, corev1.EventTypeNormal, "Synced", "Foo synced successfully")
	return nil
}

func newDeployment(foo *unstructured.Unstructured, name string, replicas int64, hasReplicas bool) *appsv1.Deployment {
	labels := map[string]string{"app": "nginx", "controller": foo.GetName()}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{
			Name:            name,
			Namespace:       foo.GetNamespace(),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(foo, fooKind)},
		},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "nginx", Image: "nginx:latest"}}},
			},
		},
	}
	if hasReplicas {
		r := int32(replicas)
		d.Spec.Replicas = &r
	}
	return d
}
