//go:build tools

// KWOK plays the kubelets of fake nodes. It has its own module: v0.7.0 wants the
// 0.33 client libraries, while the control plane pins its staging modules to 0.32.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
