//go:build tools

// Knative Serving's control plane, run out of cluster against the real apiserver.
// Its own module: Serving v0.42.2 is written against the 0.29 client libraries.
package tools

import (
	_ "knative.dev/serving/cmd/activator"
	_ "knative.dev/serving/cmd/autoscaler"
	_ "knative.dev/serving/cmd/controller"
	_ "knative.dev/serving/cmd/webhook"
)
