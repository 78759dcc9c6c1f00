//go:build tools

// Package tools pins the CNCF distribution registry
// (github.com/distribution/distribution/v3), the OCI registry the install
// test pushes the image to and pulls it from, as a cluster's registry
// would serve it. It has its own module so its dependencies stay apart from
// the planes'. hack/build-registry.sh builds it; it is never compiled from
// here.
package tools

import _ "github.com/distribution/distribution/v3/cmd/registry"
