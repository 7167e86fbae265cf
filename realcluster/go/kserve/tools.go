//go:build tools

// KServe's controller manager, run out of cluster against the real apiserver.
// Its own module: KServe v0.14.1 is written against the 0.30 client libraries and
// Knative Serving v0.42.2, the Knative the tier runs.
package tools

import (
	_ "github.com/kserve/kserve/cmd/manager"
)
