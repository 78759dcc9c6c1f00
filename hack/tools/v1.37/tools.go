//go:build tools

// Package tools pins the control-plane commands in go.mod/go.sum; it is never
// compiled. hack/build-control-plane.sh builds the commands listed here.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
