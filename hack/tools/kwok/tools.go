//go:build tools

// Package tools pins kwok (sigs.k8s.io/kwok), which simulates the nodes of the
// local control plane and the lifecycle of their pods. It has its own module
// because kwok v0.7 is built against client-go 0.33 and the parent module
// replaces every k8s.io staging module with v0.34 for k8s.io/kubernetes.
// hack/build-control-plane.sh builds it; it is never compiled from here.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
