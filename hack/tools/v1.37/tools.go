//go:build tools

// Package tools pins the control-plane commands in go.mod/go.sum; it is never
// compiled. hack/build-control-plane.sh builds the commands listed here.
//
// kwok, which simulates the nodes and their pods, is pinned here too, for
// every plane (lib.sh's KWOK_TOOLS_DIR): it builds against this release's
// client-go, so it shares the servers' compiled packages rather than
// compiling a client-go of its own (about 100 CPU-seconds of a cold build),
// and it raises none of the servers' dependencies (each it needs is older
// than this release's). An older plane's module cannot host it: kwok's
// requirements would raise that release's own.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
