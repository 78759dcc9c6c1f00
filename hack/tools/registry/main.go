// The CNCF distribution registry (github.com/distribution/distribution/v3),
// the OCI registry the install test (tests/e2e_image.rs) pushes the image to
// and pulls it from, as a cluster's registry would serve it: the project's
// own registry command, `registry serve CONFIG`, with the filesystem storage
// driver alone. Upstream's cmd/registry also links the Azure, GCS and S3
// drivers and their SDKs, which the test never uses and which took half of
// a cold build's CPU (133 CPU-seconds against 69, Go's standard library
// included). It has its own module so its dependencies stay apart from the
// planes'. Built by hack/build-registry.sh. Test tool only; nothing here
// ships.
package main

import (
	"os"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
)

func main() {
	// serve exits non-zero on its own errors; a bad command line comes back
	// here, already printed by cobra.
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
