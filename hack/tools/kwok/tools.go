//go:build tools

// Package tools pins kwok (sigs.k8s.io/kwok), which simulates the nodes of the
// local control plane and the lifecycle of their pods. It has its own module
// because kwok is built against its own client-go, while each plane's module
// (hack/tools/v1.*) replaces every k8s.io staging module with that plane's
// release. One kwok serves every plane. hack/build-control-plane.sh builds it;
// it is never compiled from here.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
