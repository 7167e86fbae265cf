//go:build tools

// The programs `python -m realcluster build` compiles. Importing them here keeps
// `go mod tidy` from dropping their modules; the build tag keeps this file out of
// every real build.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
