// The controller-runtime reference of the peer benchmark (hack/bench-peers.sh):
// the Foo controller as a kubebuilder user would write it on
// sigs.k8s.io/controller-runtime — a typed Foo, For(&Foo{}) and
// Owns(&appsv1.Deployment{}), a Reconcile that reads both from the manager's
// cache, creates the Deployment, matches its replicas, updates the status
// with a Ready condition and records an Event through the events.k8s.io
// recorder. The manager's defaults otherwise (its priority queue, no
// client-side rate limit, every Deployment of the namespace cached), and
// the namespace and worker count the benchmark gives ours, so that the
// comparison is of design, not of settings. It writes nothing it need not:
// no status update and no Event when nothing changed. Test tool only;
// nothing here ships.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"go.uber.org/zap/zapcore"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
)

// UserAgent is how the benchmark finds this client's requests in the audit log.
const UserAgent = "controller-runtime-reference/v0.25.2"

func main() {
	namespace := flag.String("namespace", "", "namespace to watch (all when empty)")
	workers := flag.Int("workers", 16, "Foos reconciled concurrently (MaxConcurrentReconciles)")
	leaderElect := flag.Bool("leader-elect", false, "elect a leader through a Lease, released on SIGTERM")
	leaseID := flag.String("leader-election-id", "controller-runtime-reference", "the Lease's name")
	leaseNamespace := flag.String("leader-election-namespace", "", "the Lease's namespace")
	probes := flag.String("health-probe-bind-address", "0", "address for /readyz (ready once the caches are), \"0\" for none")
	// Timestamps to the nanosecond: the benchmark times its runs from them.
	opts := zap.Options{TimeEncoder: zapcore.RFC3339NanoTimeEncoder}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	logger := zap.New(zap.UseFlagOptions(&opts))
	ctrl.SetLogger(logger)
	klog.SetLogger(logger) // leader election logs through klog: one JSON stream with timestamps

	cfg := ctrl.GetConfigOrDie()
	cfg.UserAgent = UserAgent
	scheme := runtime.NewScheme()
	must(clientgoscheme.AddToScheme(scheme))
	must(addFooToScheme(scheme))
	options := ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        *probes,
		LeaderElection:                *leaderElect,
		LeaderElectionID:              *leaseID,
		LeaderElectionNamespace:       *leaseNamespace,
		LeaderElectionReleaseOnCancel: true,
	}
	if *namespace != "" {
		options.Cache = cache.Options{DefaultNamespaces: map[string]cache.Config{*namespace: {}}}
	}
	mgr, err := ctrl.NewManager(cfg, options)
	must(err)
	must(mgr.AddReadyzCheck("caches", func(*http.Request) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("caches not synced")
		}
		return nil
	}))
	r := &FooReconciler{Client: mgr.GetClient(), Scheme: scheme, Recorder: mgr.GetEventRecorder("controller-runtime-reference")}
	must(ctrl.NewControllerManagedBy(mgr).
		For(&Foo{}).
		Owns(&appsv1.Deployment{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: *workers}).
		Complete(r))
	must(mgr.Start(ctrl.SetupSignalHandler()))
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// FooReconciler reconciles a Foo into its nginx Deployment.
type FooReconciler struct {
	client.Client
	Scheme   *runtime.Scheme
	Recorder recorder.EventRecorder
}

func (r *FooReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var foo Foo
	if err := r.Get(ctx, req.NamespacedName, &foo); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if foo.Spec.DeploymentName == "" {
		return ctrl.Result{}, nil // the CRD's validation keeps these out
	}
	want := int32(1)
	if foo.Spec.Replicas != nil {
		want = *foo.Spec.Replicas
	}

	var dep appsv1.Deployment
	wrote := false
	err := r.Get(ctx, client.ObjectKey{Namespace: foo.Namespace, Name: foo.Spec.DeploymentName}, &dep)
	switch {
	case apierrors.IsNotFound(err):
		dep = newDeployment(&foo, want)
		if err := controllerutil.SetControllerReference(&foo, &dep, r.Scheme); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.Create(ctx, &dep); err != nil {
			return ctrl.Result{}, err
		}
		wrote = true
	case err != nil:
		return ctrl.Result{}, err
	case !metav1.IsControlledBy(&dep, &foo):
		r.Recorder.Eventf(&foo, nil, corev1.EventTypeWarning, "ErrResourceExists", "Sync",
			"Resource %q already exists and is not managed by Foo", dep.Name)
		return ctrl.Result{}, nil
	case dep.Spec.Replicas == nil || *dep.Spec.Replicas != want:
		dep.Spec.Replicas = &want
		if err := r.Update(ctx, &dep); err != nil {
			return ctrl.Result{}, err
		}
		wrote = true
	}

	status := foo.Status.DeepCopy()
	status.AvailableReplicas = dep.Status.AvailableReplicas
	status.ObservedGeneration = foo.Generation
	ready := metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Progressing",
		Message: "waiting for the Deployment's replicas", ObservedGeneration: foo.Generation}
	if dep.Status.AvailableReplicas == want {
		ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, "Available", "the Deployment has its replicas"
	}
	meta.SetStatusCondition(&status.Conditions, ready)
	if !equality.Semantic.DeepEqual(*status, foo.Status) {
		foo.Status = *status
		if err := r.Status().Update(ctx, &foo); err != nil {
			return ctrl.Result{}, err
		}
	}
	if wrote {
		r.Recorder.Eventf(&foo, nil, corev1.EventTypeNormal, "Synced", "Sync", "Foo synced successfully")
	}
	return ctrl.Result{}, nil
}

func newDeployment(foo *Foo, replicas int32) appsv1.Deployment {
	labels := map[string]string{"app": "nginx", "controller": foo.Name}
	return appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: foo.Spec.DeploymentName, Namespace: foo.Namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "nginx", Image: "nginx:latest"}}},
			},
		},
	}
}

// The Foo type, as kubebuilder's api/v1alpha1 would hold it; the deep copies
// controller-gen would generate are written out below.

var fooGroupVersion = schema.GroupVersion{Group: "samplecontroller.k8s.io", Version: "v1alpha1"}

func addFooToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(fooGroupVersion, &Foo{}, &FooList{})
	metav1.AddToGroupVersion(s, fooGroupVersion)
	return nil
}

type FooSpec struct {
	DeploymentName string `json:"deploymentName"`
	Replicas       *int32 `json:"replicas,omitempty"`
}

type FooStatus struct {
	AvailableReplicas  int32              `json:"availableReplicas"`
	ObservedGeneration int64              `json:"observedGeneration,omitempty"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
}

type Foo struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              FooSpec   `json:"spec,omitempty"`
	Status            FooStatus `json:"status,omitempty"`
}

type FooList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Foo `json:"items"`
}

func (in *FooStatus) DeepCopy() *FooStatus {
	out := *in
	if in.Conditions != nil {
		out.Conditions = make([]metav1.Condition, len(in.Conditions))
		for i := range in.Conditions {
			in.Conditions[i].DeepCopyInto(&out.Conditions[i])
		}
	}
	return &out
}

func (in *Foo) DeepCopyInto(out *Foo) {
	*out = *in
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if in.Spec.Replicas != nil {
		replicas := *in.Spec.Replicas
		out.Spec.Replicas = &replicas
	}
	out.Status = *in.Status.DeepCopy()
}

func (in *Foo) DeepCopyObject() runtime.Object {
	out := new(Foo)
	in.DeepCopyInto(out)
	return out
}

func (in *FooList) DeepCopyObject() runtime.Object {
	out := &FooList{TypeMeta: in.TypeMeta}
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]Foo, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}
