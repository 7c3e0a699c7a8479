//! The ferrolb lab: a real Kubernetes control plane, nodes, pods and routers in network namespaces.
