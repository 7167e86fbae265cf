"""A real Kubernetes control plane for tests: upstream binaries built from pinned Go modules.

`python -m realcluster build` compiles kube-apiserver, kube-controller-manager,
kube-scheduler, etcd and KWOK (which plays the kubelets of fake nodes) into a cache
outside the repository; `python -m realcluster up` runs them inside a private network
namespace and loads a simcluster scenario. No Django, no product code: like
`simcluster/`, this is a tool the product's tests talk to over HTTP.
"""
