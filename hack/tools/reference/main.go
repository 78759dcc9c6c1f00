// The client-go reference for the overload benchmark (hack/bench-overload.sh):
// the informers upstream's sample-controller runs — Foos and Deployments,
// resynced every 30 s — with client-go's defaults, and nothing else, so that
// the requests it makes under an injected fault are client-go's own. Test
// tool only; nothing here ships.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "path to a kubeconfig")
	namespace := flag.String("namespace", "", "namespace to watch (all when empty)")
	flag.Parse()

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeconfig:", err)
		os.Exit(1)
	}
	cfg.UserAgent = "client-go-reference/v0.37.2"
	kube := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	// As upstream's main.go: both factories resync every 30 s.
	kubeFactory := kubeinformers.NewSharedInformerFactoryWithOptions(kube, 30*time.Second,
		kubeinformers.WithNamespace(*namespace))
	fooFactory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 30*time.Second, *namespace, nil)
	deployments := kubeFactory.Apps().V1().Deployments().Informer()
	foos := fooFactory.ForResource(schema.GroupVersionResource{
		Group: "samplecontroller.k8s.io", Version: "v1alpha1", Resource: "foos",
	}).Informer()
	kubeFactory.Start(ctx.Done())
	fooFactory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), deployments.HasSynced, foos.HasSynced) {
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "caches synced")
	<-ctx.Done()
}
